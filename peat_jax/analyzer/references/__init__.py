"""Float64 references of every site kernel (the ground truth of noise floors).

Private module: ``_references``.
"""

from peat_jax.analyzer.references._references import REFERENCES as REFERENCES
from peat_jax.analyzer.references._references import TRACED_REFERENCES as TRACED_REFERENCES
from peat_jax.analyzer.references._references import reference as reference
from peat_jax.analyzer.references._references import reference_attention as reference_attention
from peat_jax.analyzer.references._references import reference_conv as reference_conv
from peat_jax.analyzer.references._references import reference_cross_entropy as reference_cross_entropy
from peat_jax.analyzer.references._references import reference_dot_general as reference_dot_general
from peat_jax.analyzer.references._references import reference_fn as reference_fn
from peat_jax.analyzer.references._references import reference_gelu as reference_gelu
from peat_jax.analyzer.references._references import reference_rope as reference_rope
from peat_jax.analyzer.references._references import reference_silu as reference_silu
from peat_jax.analyzer.references._references import reference_layer_norm as reference_layer_norm
from peat_jax.analyzer.references._references import reference_log_softmax as reference_log_softmax
from peat_jax.analyzer.references._references import reference_matmul as reference_matmul
from peat_jax.analyzer.references._references import reference_rms_norm as reference_rms_norm
from peat_jax.analyzer.references._references import reference_softmax as reference_softmax
from peat_jax.analyzer.references._references import reference_traced as reference_traced
from peat_jax.analyzer.references._references import reference_vjp_fn as reference_vjp_fn
from peat_jax.analyzer.references._references import template_vjp as template_vjp
