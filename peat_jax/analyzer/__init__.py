"""The Analyzer: signatures of pseudo-errors, and their float64 references.

A *signature* is a fixed set of statistics of one pseudo-error (the KUT's
output minus the golden kernel's at one site and step), optionally against
the float64 *reference* of the same operation (docs/analyzer.md,
docs/signature.md). Its parts, lowest first (each a sub-package with a
facade; imports point one way):

* ``references``: float64 references of every site kernel;
* ``signature``: the statistics pass (pure JAX, or a native XLA FFI kernel
  on CPU), the noise-aware decomposition, the finalized
  :class:`Signature` and the jitted entry points below;
* ``probes``: the port probe (another constant, form or input precision),
  the invariance probes of a KUT beyond one call, the ratio view.
"""

from peat_jax.analyzer.signature import analyze as analyze
from peat_jax.analyzer.signature import BASE_MODES as BASE_MODES
from peat_jax.analyzer.signature import MATCH_OUTLIERS as MATCH_OUTLIERS
from peat_jax.analyzer.signature import analyze_batch as analyze_batch
from peat_jax.analyzer.signature import analyze_split as analyze_split
from peat_jax.analyzer.signature import analyze_split_many as analyze_split_many
from peat_jax.analyzer.signature import decompose_split_many as decompose_split_many
from peat_jax.analyzer.signature import decomposition as decomposition
from peat_jax.analyzer.signature import screen as screen
from peat_jax.analyzer.signature import screen_split_many as screen_split_many
from peat_jax.analyzer.signature import with_decomposition as with_decomposition
from peat_jax.analyzer.signature import Screen as Screen
from peat_jax.analyzer.signature import signature_finalize as signature_finalize
from peat_jax.analyzer.signature import signature_init as signature_init
from peat_jax.analyzer.signature import signature_pure as signature_pure
from peat_jax.analyzer.signature import signature_update as signature_update
from peat_jax.analyzer.signature import size_bucket as size_bucket
from peat_jax.analyzer.signature import split_on_device as split_on_device
from peat_jax.analyzer.signature import relative_to_scale as relative_to_scale
from peat_jax.analyzer.probes import invariance_probe as invariance_probe
from peat_jax.analyzer.slips import LIBRARY_BOUND as LIBRARY_BOUND
from peat_jax.analyzer.slips import slip_variants as slip_variants
from peat_jax.analyzer.slips import grammar_table as grammar_table
from peat_jax.analyzer.probes import needs_probe as needs_probe
from peat_jax.analyzer.probes import RATIO_METRICS as RATIO_METRICS
from peat_jax.analyzer.probes import metric_ratios as metric_ratios
from peat_jax.analyzer.probes import port_probe as port_probe
from peat_jax.analyzer.probes import shape_probe as shape_probe
from peat_jax.analyzer.probes import probe_signatures as probe_signatures
from peat_jax.analyzer.probes import probe_formats as probe_formats
from peat_jax.analyzer.probes import variant_rounding as variant_rounding
from peat_jax.analyzer.references import REFERENCES as REFERENCES
from peat_jax.analyzer.references import reference as reference
from peat_jax.analyzer.references import reference_attention as reference_attention
from peat_jax.analyzer.references import reference_conv as reference_conv
from peat_jax.analyzer.references import reference_cross_entropy as reference_cross_entropy
from peat_jax.analyzer.references import reference_dot_general as reference_dot_general
from peat_jax.analyzer.references import reference_fn as reference_fn
from peat_jax.analyzer.references import reference_gelu as reference_gelu
from peat_jax.analyzer.references import reference_rope as reference_rope
from peat_jax.analyzer.references import reference_silu as reference_silu
from peat_jax.analyzer.references import reference_layer_norm as reference_layer_norm
from peat_jax.analyzer.references import reference_log_softmax as reference_log_softmax
from peat_jax.analyzer.references import reference_rms_norm as reference_rms_norm
from peat_jax.analyzer.references import reference_matmul as reference_matmul
from peat_jax.analyzer.references import reference_softmax as reference_softmax
from peat_jax.analyzer.references import reference_traced as reference_traced
from peat_jax.analyzer.references import reference_vjp_fn as reference_vjp_fn
from peat_jax.analyzer.references import template_vjp as template_vjp
from peat_jax.analyzer.references import TRACED_REFERENCES as TRACED_REFERENCES
from peat_jax.analyzer.signature import HIST_BUCKETS as HIST_BUCKETS
from peat_jax.analyzer.signature import LANES as LANES
from peat_jax.analyzer.signature import NARROW_FORMATS as NARROW_FORMATS
from peat_jax.analyzer.signature import PCT_SAMPLE as PCT_SAMPLE
from peat_jax.analyzer.signature import PERCENTILES as PERCENTILES
from peat_jax.analyzer.signature import SHIFT_RANGE as SHIFT_RANGE
from peat_jax.analyzer.signature import Signature as Signature
from peat_jax.analyzer.signature import SignatureState as SignatureState
from peat_jax.analyzer.signature import TILE_SIZES as TILE_SIZES
