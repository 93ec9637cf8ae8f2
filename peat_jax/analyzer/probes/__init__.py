"""Probes and views beyond one signature.

Private modules: ``_ports`` (the port probe: another constant, form or
input precision of the same kernel), ``_invariance`` (mutated inputs, an
earlier call's values, ignored inputs, batch variance) and ``_ratios`` (the
per-metric ratio view: KUT over golden error).
"""

from peat_jax.analyzer.probes._invariance import invariance_probe as invariance_probe
from peat_jax.analyzer.probes._ports import BEYOND_GOLDEN as BEYOND_GOLDEN
from peat_jax.analyzer.probes._ports import needs_probe as needs_probe
from peat_jax.analyzer.probes._ports import port_probe as port_probe
from peat_jax.analyzer.probes._precision import precision_sentence as precision_sentence
from peat_jax.analyzer.probes._ports import probe_answer as probe_answer
from peat_jax.analyzer.probes._forms import precision_only as precision_only
from peat_jax.analyzer.probes._precision import probe_formats as probe_formats
from peat_jax.analyzer.probes._precision import variant_rounding as variant_rounding
from peat_jax.analyzer.probes._ports import probe_signatures as probe_signatures
from peat_jax.analyzer.probes._ratios import RATIO_METRICS as RATIO_METRICS
from peat_jax.analyzer.probes._shapes import shape_probe as shape_probe
from peat_jax.analyzer.probes._ratios import metric_ratios as metric_ratios
