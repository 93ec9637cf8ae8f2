"""The Analyzer: signatures of pseudo-errors, and their float64 references.

A *signature* is a fixed set of statistics of one pseudo-error (the KUT's
output minus the golden kernel's at one site and step), optionally against
the float64 *reference* of the same operation (docs/analyzer.md,
docs/signature.md). Private modules, in the order a record flows through
them:

* ``_checks``: validation of shapes and dtypes, before tracing;
* ``_bits``, ``_elements``, ``_count``, ``_pass``: the pure-JAX statistics
  pass (one read of the elements into a mergeable ``SignatureState``);
* ``_native``: the same pass as a native XLA FFI kernel (CPU);
* ``_finalize``: state -> :class:`Signature`;
* ``_api``: the jitted entry points below;
* ``_references``: float64 references of every site kernel;
* ``_decompose``: the noise-aware decomposition (rounding envelope, the
  outliers beyond it and their structure);
* ``_ports``: the port probe (another constant, form or input precision);
* ``_ratios``: the per-metric ratio view (KUT over golden error).
* ``_invariance``: probes of a KUT beyond one call (mutated inputs, an
  earlier call's values, ignored inputs, batch variance).
"""

from peat_jax.analyzer._api import analyze as analyze
from peat_jax.analyzer._api import analyze_batch as analyze_batch
from peat_jax.analyzer._api import analyze_split as analyze_split
from peat_jax.analyzer._api import analyze_split_many as analyze_split_many
from peat_jax.analyzer._api import signature_finalize as signature_finalize
from peat_jax.analyzer._api import signature_init as signature_init
from peat_jax.analyzer._api import signature_pure as signature_pure
from peat_jax.analyzer._api import signature_update as signature_update
from peat_jax.analyzer._api import split_on_device as split_on_device
from peat_jax.analyzer._invariance import invariance_probe as invariance_probe
from peat_jax.analyzer._ports import needs_probe as needs_probe
from peat_jax.analyzer._ratios import RATIO_METRICS as RATIO_METRICS
from peat_jax.analyzer._ratios import metric_ratios as metric_ratios
from peat_jax.analyzer._ports import port_probe as port_probe
from peat_jax.analyzer._ports import probe_signatures as probe_signatures
from peat_jax.analyzer._ports import probe_formats as probe_formats
from peat_jax.analyzer._references import REFERENCES as REFERENCES
from peat_jax.analyzer._references import reference as reference
from peat_jax.analyzer._references import reference_attention as reference_attention
from peat_jax.analyzer._references import reference_conv as reference_conv
from peat_jax.analyzer._references import reference_cross_entropy as reference_cross_entropy
from peat_jax.analyzer._references import reference_dot_general as reference_dot_general
from peat_jax.analyzer._references import reference_fn as reference_fn
from peat_jax.analyzer._references import reference_gelu as reference_gelu
from peat_jax.analyzer._references import reference_layer_norm as reference_layer_norm
from peat_jax.analyzer._references import reference_log_softmax as reference_log_softmax
from peat_jax.analyzer._references import reference_rms_norm as reference_rms_norm
from peat_jax.analyzer._references import reference_matmul as reference_matmul
from peat_jax.analyzer._references import reference_softmax as reference_softmax
from peat_jax.analyzer._references import reference_traced as reference_traced
from peat_jax.analyzer._references import reference_vjp_fn as reference_vjp_fn
from peat_jax.analyzer._references import template_vjp as template_vjp
from peat_jax.analyzer._references import TRACED_REFERENCES as TRACED_REFERENCES
from peat_jax.analyzer._signature import HIST_BUCKETS as HIST_BUCKETS
from peat_jax.analyzer._signature import LANES as LANES
from peat_jax.analyzer._signature import NARROW_FORMATS as NARROW_FORMATS
from peat_jax.analyzer._signature import PCT_SAMPLE as PCT_SAMPLE
from peat_jax.analyzer._signature import PERCENTILES as PERCENTILES
from peat_jax.analyzer._signature import SHIFT_RANGE as SHIFT_RANGE
from peat_jax.analyzer._signature import Signature as Signature
from peat_jax.analyzer._signature import SignatureState as SignatureState
from peat_jax.analyzer._signature import TILE_SIZES as TILE_SIZES
