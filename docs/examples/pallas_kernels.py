"""JAX's own Pallas GPU kernels as kernels under test (``py:`` KUT specs).

``jax.experimental.pallas.ops.gpu`` ships Triton-style Pallas kernels that
peat_jax did not write. Each function here adapts one to the site kernel's
KUT signature (docs/kernels.md) and runs it in Pallas' interpret mode, so
it runs on a CPU too::

  python -m peat_jax.tools.validate --task=stock_model:task \\
      --kut=py:pallas_kernels:layer_norm --kernel=layer_norm

``layer_norm`` and ``attention`` (``mha``) are ``jax.custom_vjp`` functions
with Pallas backward kernels: with ``--backward=kut`` their VJP runs at
the backward sites. ``softmax`` has no backward kernel (and a
``pallas_call`` has no reverse-mode rule), so only its forward can be
validated.
"""

import math

from jax.experimental.pallas.ops.gpu import attention as pallas_attention
from jax.experimental.pallas.ops.gpu import layer_norm as pallas_layer_norm
from jax.experimental.pallas.ops.gpu import softmax as pallas_softmax

INTERPRET = True  # False on a GPU: the compiled Triton kernels


def layer_norm(x, scale, bias, eps):
  """``layer_norm`` sites: Pallas layer norm of x ``[batch, length, dim]``."""
  return pallas_layer_norm.layer_norm(x, scale, bias, eps=eps,
                                      interpret=INTERPRET)


def softmax(x, axis=-1):
  """``softmax`` sites: Pallas softmax (last axis only)."""
  return pallas_softmax.softmax(x, axis=axis, interpret=INTERPRET)


def attention(q, k, v, mask=None, *, bias=None, scale=None, is_causal=False):
  """``attention`` sites: Pallas flash attention ``mha`` (no mask or bias)."""
  if mask is not None or bias is not None:
    raise NotImplementedError("Pallas mha takes no mask or bias; only "
                              "is_causal")
  t, s = q.shape[1], k.shape[1]
  blocks = pallas_attention.BlockSizes(
      block_q=min(t, 128), block_k=min(s, 128), block_q_dkv=min(t, 32),
      block_kv_dkv=min(s, 32), block_q_dq=min(t, 32), block_kv_dq=min(s, 32))
  sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  return pallas_attention.mha(q, k, v, None, sm_scale=sm_scale,
                              causal=is_causal, block_sizes=blocks,
                              interpret=INTERPRET)
