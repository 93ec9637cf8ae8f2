"""RMSNorm kernels a user brings for a bf16 model (``py:`` and ``torch:``).

Each function has the signature its site kernel's adapter calls
(docs/kernels.md, "KUT signatures"; docs/bridge.md for ``torch:``):

* ``py:bf16_kernels:rms_norm_hf --kernel=rms_norm``: Hugging Face Llama's
  ``LlamaRMSNorm`` in JAX, ``kut(x, scale, eps)``: float32 statistics, the
  normalized value cast to x's dtype, then the scale applied in x's dtype.
  A correct port (two roundings in bf16 where golden makes one).
* ``py:bf16_kernels:rms_norm_centred --kernel=rms_norm``: a LayerNorm
  kernel reused as RMSNorm (the row mean subtracted): a slip.
* ``py:bf16_kernels:rms_norm_eps_slip --kernel=rms_norm``: the HF form with
  eps hard-coded to HF's default 1e-5 where the model passes 1e-6: a slip
  that moves rows of mean square ~1 by ~5e-6, below what a bf16 output
  keeps (it passes there; where rows are small it is named ``parameter``).
* ``torch:bf16_kernels:rms_norm_torch --kernel=rms_norm``: the HF forward
  written in torch. A ``torch:`` function has the torch function's own
  signature, here ``F.rms_norm``'s ``fn(x, (D,), weight, eps)``, not the
  JAX adapter's ``kut(x, scale, eps)``.
"""

import jax
import jax.numpy as jnp
from jax import lax


def rms_norm_hf(x: jax.Array, scale: jax.Array | None, eps: float = 1e-6
                ) -> jax.Array:
  """HF ``LlamaRMSNorm`` in JAX: float32 statistics, cast, then scale."""
  xf = x.astype(jnp.float32)
  h = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  h = h.astype(x.dtype)
  return h if scale is None else jnp.asarray(scale).astype(x.dtype) * h


def rms_norm_eps_slip(x: jax.Array, scale: jax.Array | None,
                      eps: float = 1e-6) -> jax.Array:
  """The HF form with eps 1e-5 whatever the model passes (a slip)."""
  del eps
  return rms_norm_hf(x, scale, 1e-5)


def rms_norm_centred(x: jax.Array, scale: jax.Array | None,
                     eps: float = 1e-6) -> jax.Array:
  """A layer norm without bias where the model uses RMSNorm (a slip)."""
  xf = x.astype(jnp.float32)
  xc = xf - jnp.mean(xf, axis=-1, keepdims=True)
  h = xc * lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)
  h = h if scale is None else h * jnp.asarray(scale, jnp.float32)
  return h.astype(x.dtype)


def rms_norm_torch(x, normalized_shape, weight=None, eps=1e-6):
  """HF ``LlamaRMSNorm.forward`` as ``F.rms_norm``'s signature, in torch."""
  import torch  # pylint: disable=g-import-not-at-top
  del normalized_shape
  xf = x.to(torch.float32)
  h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
  h = h.to(x.dtype)
  return h if weight is None else weight * h
