"""float64 references: the ground truth for noise floors.

For a site, the *reference* is the same operation computed in float64 from
the site's inputs. Every helper here:

* casts floating-point inputs (float16, bfloat16, float32, float64) to
  float64 exactly (every narrower float is exactly representable);
* runs the computation with x64 enabled only inside a scope
  (`jax.enable_x64(True)`), so the caller's global config is untouched;
* returns a host `numpy.ndarray` of dtype float64 (pass it to
  `peat_jax.analyze(..., reference=...)`).

`reference(fn, *args)` wraps any JAX function; the named helpers cover the
kernels peat_jax knows: matmul / dot_general, conv, softmax, layer norm,
attention, GELU and cross-entropy. `REFERENCES` maps kernel names to them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax.core import PeatError

_FLOATS = (np.float16, np.float32, np.float64)


def _is_float(dtype) -> bool:
  dtype = np.dtype(dtype)
  return dtype in [np.dtype(f) for f in _FLOATS] or dtype == np.dtype(
      jnp.bfloat16)


def _to_f64(x: Any, what: str) -> Any:
  """Host float64 copy of a floating array; other arrays pass unchanged."""
  if x is None or isinstance(x, (int, float, bool, str, tuple)):
    return x
  if not hasattr(x, "dtype"):
    return x
  dtype = np.dtype(x.dtype)
  if _is_float(dtype):
    return np.asarray(jax.device_get(x)).astype(np.float64)
  if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
    return np.asarray(jax.device_get(x))
  raise PeatError(
      f"{what} has dtype {dtype}; expected a floating-point (or integer "
      "label / boolean mask) array. Fix: pass the site's real inputs.")


def reference(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
  """Runs `fn` in float64 on float64 copies of its array arguments.

  Args:
    fn: a JAX function (jnp / lax operations).
    *args: its positional arguments; floating arrays (any float dtype) are
      cast to float64, integer and boolean arrays are passed unchanged,
      other values pass through.
    **kwargs: keyword arguments, treated like `args`.

  Returns:
    The output pytree with every array converted to host float64 numpy
    arrays (integer outputs keep their dtype).

  Raises:
    PeatError: an argument array is neither floating, integer nor boolean.

  >>> import numpy as np
  >>> reference(lambda x: x * 3, np.float32(0.1)).dtype
  dtype('float64')
  """
  a64 = [_to_f64(a, f"argument {i}") for i, a in enumerate(args)]
  k64 = {k: _to_f64(v, f"argument {k!r}") for k, v in kwargs.items()}
  with jax.enable_x64(True):
    out = fn(*a64, **k64)
    out = jax.tree.map(lambda y: np.asarray(jax.device_get(y)), out)
  return jax.tree.map(
      lambda y: y.astype(np.float64) if _is_float(y.dtype) else y, out)


def _check_ndim(x, least: int, what: str):
  if np.ndim(x) < least:
    raise PeatError(f"{what} has shape {np.shape(x)}; expected at least "
                    f"{least} dimensions. Fix: pass the site's input array.")


def reference_matmul(a, b) -> np.ndarray:
  """float64 `a @ b` (numpy matmul semantics, batch dims broadcast).

  Args:
    a: left operand (..., M, K).
    b: right operand (..., K, N).

  Returns:
    float64 array (..., M, N).

  Raises:
    PeatError: contracting dimensions differ.
  """
  _check_ndim(a, 1, "a")
  _check_ndim(b, 1, "b")
  ka = np.shape(a)[-1]
  kb = np.shape(b)[-2] if np.ndim(b) >= 2 else np.shape(b)[0]
  if ka != kb:
    raise PeatError(
        f"matmul: expected a's last dimension ({ka}) to equal b's "
        f"contracting dimension ({kb}); got shapes {np.shape(a)} and "
        f"{np.shape(b)}. "
        "Fix: pass the operands in the site's order.")
  return reference(
      lambda x, y: jnp.matmul(x, y, precision=lax.Precision.HIGHEST), a, b)


def reference_dot_general(lhs, rhs, dimension_numbers) -> np.ndarray:
  """float64 `lax.dot_general(lhs, rhs, dimension_numbers)`.

  Args:
    lhs: left operand.
    rhs: right operand.
    dimension_numbers: as for `lax.dot_general`.

  Returns:
    float64 array.
  """
  return reference(
      lambda x, y: lax.dot_general(x, y, dimension_numbers,
                                   precision=lax.Precision.HIGHEST),
      lhs, rhs)


def reference_conv(lhs, rhs, window_strides: Sequence[int],
                   padding: str | Sequence[tuple[int, int]],
                   lhs_dilation: Sequence[int] | None = None,
                   rhs_dilation: Sequence[int] | None = None,
                   dimension_numbers: Any = None,
                   feature_group_count: int = 1) -> np.ndarray:
  """float64 `lax.conv_general_dilated` with the same arguments.

  Args:
    lhs: input, e.g. NHWC with `dimension_numbers=("NHWC", "HWIO", "NHWC")`.
    rhs: kernel.
    window_strides: strides per spatial dimension.
    padding: "SAME", "VALID" or explicit (low, high) pairs.
    lhs_dilation: input dilation.
    rhs_dilation: kernel dilation.
    dimension_numbers: layouts (default NCHW / OIHW / NCHW as in lax).
    feature_group_count: grouped convolution.

  Returns:
    float64 array.
  """
  return reference(
      lambda x, w: lax.conv_general_dilated(
          x, w, window_strides, padding, lhs_dilation=lhs_dilation,
          rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers,
          feature_group_count=feature_group_count,
          precision=lax.Precision.HIGHEST), lhs, rhs)


def reference_softmax(x, axis: int = -1) -> np.ndarray:
  """float64 softmax along `axis` (max-subtracted, exact exp in float64).

  Args:
    x: logits.
    axis: the normalized axis.

  Returns:
    float64 array of x's shape.
  """
  _check_ndim(x, 1, "x")
  return reference(lambda v: _softmax64(v, axis), x)


def _softmax64(x, axis: int = -1):
  return jax.nn.softmax(x, axis=axis)


def reference_log_softmax(x, axis: int = -1) -> np.ndarray:
  """float64 log-softmax along `axis` (the ``log_softmax`` composite kind).

  Args:
    x: logits.
    axis: the normalized axis.

  Returns:
    float64 array of x's shape.
  """
  _check_ndim(x, 1, "x")
  return reference(lambda v: jax.nn.log_softmax(v, axis=axis), x)


def reference_rms_norm(x, scale=None, eps: float = 1e-6,
                       axis: int = -1) -> np.ndarray:
  """float64 RMS norm: x / sqrt(mean(x**2) + eps) * scale, as nnx.RMSNorm.

  Args:
    x: input.
    scale: optional scale, broadcast against the normalized axis.
    eps: epsilon added to the mean square.
    axis: normalized axis.

  Returns:
    float64 array of x's shape.
  """
  _check_ndim(x, 1, "x")

  return reference(lambda v, s: _rms_norm64(v, s, eps, axis), x, scale)


def _rms_norm64(v, s=None, eps: float = 1e-6, axis: int = -1):
  y = v * lax.rsqrt(jnp.mean(jnp.square(v), axis=axis, keepdims=True) + eps)
  return y if s is None else y * s


def reference_layer_norm(x, scale=None, bias=None, eps: float = 1e-6,
                         axis: int = -1) -> np.ndarray:
  """float64 layer norm: (x - mean) / sqrt(var + eps) * scale + bias.

  The variance is the biased (population) variance over `axis`, as in
  `flax.nnx.LayerNorm`.

  Args:
    x: input.
    scale: optional scale, broadcast against the normalized axis.
    bias: optional bias.
    eps: epsilon added to the variance.
    axis: normalized axis.

  Returns:
    float64 array of x's shape.
  """
  _check_ndim(x, 1, "x")
  return reference(lambda v, s, b: _layer_norm64(v, s, b, eps, axis),
                   x, scale, bias)


def _layer_norm64(v, s=None, b=None, eps: float = 1e-6, axis: int = -1):
  mu = jnp.mean(v, axis=axis, keepdims=True)
  var = jnp.mean(jnp.square(v - mu), axis=axis, keepdims=True)
  y = (v - mu) * lax.rsqrt(var + eps)
  if s is not None:
    y = y * s
  if b is not None:
    y = y + b
  return y


def reference_attention(q, k, v, mask=None, scale: float | None = None,
                        bias=None, is_causal: bool = False) -> np.ndarray:
  """float64 dot-product attention in Flax's layout.

  out[b, t, h, :] = sum_s softmax_s(scale * <q[b,t,h], k[b,s,h]> + bias
  (masked: the float64 lowest where mask is False, as jax and flax fill
  masked logits: a fully masked row averages v)) v[b, s, h, :].

  With fewer key/value heads than query heads (grouped-query attention,
  ``Hk`` dividing ``H``) query head ``j`` attends with key/value head
  ``j // (H // Hk)``, as ``jax.nn.dot_product_attention``.

  Args:
    q: queries (B, T, H, D).
    k: keys (B, S, Hk, D).
    v: values (B, S, Hk, Dv).
    mask: optional boolean mask broadcastable to (B, H, T, S); True keeps.
    scale: logit scale (default 1 / sqrt(D)).
    bias: optional additive logit bias broadcastable to (B, H, T, S).
    is_causal: also mask every key after its query (``s > t``), as
      ``jax.nn.dot_product_attention(is_causal=True)``.

  Returns:
    float64 array (B, T, H, Dv).

  Raises:
    PeatError: q, k, v are not 4-D or their dimensions disagree.
  """
  for name, x in (("q", q), ("k", k), ("v", v)):
    if np.ndim(x) != 4:
      raise PeatError(
          f"attention: {name} has shape {np.shape(x)}; expected 4-D (batch, "
          "length, heads, head_dim) as in flax. Fix: reshape to that layout.")
  if (np.shape(q)[-1] != np.shape(k)[-1] or np.shape(k)[1] != np.shape(v)[1]
      or np.shape(k)[2] != np.shape(v)[2]
      or np.shape(q)[2] % np.shape(k)[2]):
    raise PeatError(
        f"attention: q {np.shape(q)}, k {np.shape(k)}, v {np.shape(v)} "
        "disagree; expected q and k to share head_dim, k and v to share "
        "length and heads, and q's heads to be a multiple of k's. Fix: pass "
        "the site's q, k, v in that order.")
  if is_causal:
    causal = np.tril(np.ones((np.shape(q)[1], np.shape(k)[1]), bool))
    mask = causal if mask is None else np.logical_and(np.asarray(mask),
                                                      causal)
  return reference(lambda qq, kk, vv, m, bb: _attention64(qq, kk, vv, m, scale,
                                                         bb),
                   q, k, v, mask, bias)


def _attention64(qq, kk, vv, m=None, scale: float | None = None, bb=None):
  sc = 1.0 / math.sqrt(np.shape(qq)[-1]) if scale is None else float(scale)
  groups = np.shape(qq)[2] // np.shape(kk)[2]
  if groups > 1:  # grouped-query attention: each kv head serves a group
    kk, vv = jnp.repeat(kk, groups, axis=2), jnp.repeat(vv, groups, axis=2)
  hp = lax.Precision.HIGHEST
  logits = jnp.einsum("bthd,bshd->bhts", qq, kk, precision=hp) * sc
  if bb is not None:
    logits = logits + bb
  if m is not None:  # the format's lowest, as jax and flax fill: a fully
    # masked query row averages the values (not a NaN row)
    logits = jnp.where(m, logits, jnp.finfo(logits.dtype).min)
  w = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("bhts,bshd->bthd", w, vv, precision=hp)


def reference_gelu(x, approximate: bool = False) -> np.ndarray:
  """float64 GELU: x * Phi(x) (erf form) or the tanh approximation.

  Args:
    x: input.
    approximate: use 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as
      `jax.nn.gelu(approximate=True)` (its default) does.

  Returns:
    float64 array of x's shape.
  """
  return reference(lambda v: _gelu64(v, approximate), x)


def _gelu64(x, approximate: bool = False):
  return jax.nn.gelu(x, approximate=approximate)


def reference_silu(x, up=None) -> np.ndarray:
  """float64 SiLU, ``x * sigmoid(x)``, times ``up`` when given (SwiGLU).

  Args:
    x: input (the gate projection for SwiGLU).
    up: optional multiplier of x's shape (the up projection).

  Returns:
    float64 array of x's shape.
  """
  return reference(_silu64, x, up)


def _silu64(x, up=None):
  y = x * jax.nn.sigmoid(x)
  return y if up is None else y * up


def reference_rope(x, positions, theta: float = 10000.0) -> np.ndarray:
  """float64 rotary embedding of the two halves (GPT-NeoX / Llama layout).

  Args:
    x: (B, T, H, D), D even.
    positions: integer positions (T,).
    theta: the rotary base.

  Returns:
    float64 array of x's shape.

  Raises:
    PeatError: x is not 4-D with an even last axis, or positions' length
      is not x's.
  """
  if np.ndim(x) != 4 or np.shape(x)[-1] % 2:
    raise PeatError(f"rope: x has shape {np.shape(x)}; expected (batch, "
                    "length, heads, head_dim) with an even head_dim")
  if np.shape(positions) != (np.shape(x)[1],):
    raise PeatError(f"rope: positions have shape {np.shape(positions)}; "
                    f"expected ({np.shape(x)[1]},), one per token")
  return reference(lambda v, p: _rope64(v, p, theta), x, positions)


def _rope64(x, positions, theta: float = 10000.0):
  d = x.shape[-1]
  h = d // 2
  inv_freq = jnp.asarray(theta, x.dtype) ** (
      -jnp.arange(h, dtype=x.dtype) * (2.0 / d))
  angle = positions.astype(x.dtype)[:, None] * inv_freq[None, :]
  cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
  x1, x2 = x[..., :h], x[..., h:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference_cross_entropy(logits, labels,
                            reduction: str = "none") -> np.ndarray:
  """float64 per-example softmax cross-entropy over the last axis.

  Args:
    logits: (..., K).
    labels: integer class ids (...) or float targets (..., K) (one-hot or
      probabilities).
    reduction: ``"none"`` (per example) or ``"mean"`` (their mean).

  Returns:
    float64 losses (...): logsumexp(logits) - logits[label], or
    -sum(targets * log_softmax(logits)); their mean for ``"mean"``.

  Raises:
    PeatError: labels' shape fits neither form.
  """
  _check_ndim(logits, 1, "logits")
  ls, lb = np.shape(logits), np.shape(labels)
  int_labels = np.issubdtype(np.asarray(labels).dtype, np.integer)
  if int_labels and lb != ls[:-1]:
    raise PeatError(
        f"cross_entropy: integer labels have shape {lb}; expected {ls[:-1]}"
        " (logits' shape without the class axis). Fix: pass class ids.")
  if not int_labels and lb != ls:
    raise PeatError(
        f"cross_entropy: float targets have shape {lb}; expected {ls}. Fix:"
        " pass one-hot or probability targets, or integer class ids.")
  if reduction not in ("none", "mean"):
    raise PeatError(f"cross_entropy: reduction {reduction!r}; expected "
                    "'none' or 'mean'")
  out = reference(_cross_entropy64, logits, labels)
  return np.mean(out) if reduction == "mean" else out


def _cross_entropy64(z, y):
  logp = jax.nn.log_softmax(z, axis=-1)
  if jnp.issubdtype(y.dtype, jnp.integer):
    return -jnp.take_along_axis(logp, y[..., None].astype(jnp.int32),
                                axis=-1)[..., 0]
  return -jnp.sum(y * logp, axis=-1)


def _attention_call64(q, k, v, mask=None, *, bias=None, scale=None,
                      is_causal=False):
  """:func:`_attention64` with the attention composite's KUT signature."""
  if is_causal:
    causal = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    mask = causal if mask is None else jnp.logical_and(mask, causal)
  return _attention64(q, k, v, mask, scale, bias)


def _cross_entropy_call64(z, y, reduction: str = "mean"):
  """:func:`_cross_entropy64` with the composite's KUT signature: the mean
  by default (the reference models' composite), per example for
  ``reduction="none"`` (optax's)."""
  out = _cross_entropy64(z, y)
  return jnp.mean(out) if reduction == "mean" else out


#: Kernel name -> float64 reference helper.
REFERENCES: dict[str, Callable[..., np.ndarray]] = {
    "matmul": reference_matmul,
    "dot_general": reference_dot_general,
    "conv": reference_conv,
    "conv_general_dilated": reference_conv,
    "softmax": reference_softmax,
    "log_softmax": reference_log_softmax,
    "layer_norm": reference_layer_norm,
    "rms_norm": reference_rms_norm,
    "attention": reference_attention,
    "gelu": reference_gelu,
    "silu": reference_silu,
    "rope": reference_rope,
    "cross_entropy": reference_cross_entropy,
}


#: Composite kind -> its float64 reference as a traceable JAX function with
#: the helper's signature (run it on float64 arrays with x64 enabled); the
#: VJP of a composite's reference (:func:`reference_vjp_fn`) differentiates
#: it.
TRACED_REFERENCES: dict[str, Callable[..., Any]] = {
    "softmax": _softmax64,
    "log_softmax": lambda x, axis=-1: jax.nn.log_softmax(x, axis=axis),
    "layer_norm": _layer_norm64,
    "rms_norm": _rms_norm64,
    "attention": _attention_call64,
    "gelu": _gelu64,
    "silu": _silu64,
    "rope": _rope64,
    "cross_entropy": _cross_entropy_call64,
}


# ---------------------------------------------------------------------------
# The reference of a site, from its recorded call (kernels.kut.recording).


def _on_template(fn: Callable[..., Any], params) -> Callable[..., Any]:
  """``fn`` called with a site's array arguments put back into its call
  template (``params["template"]``: treedef, leaves, which are arrays)."""
  treedef, leaves, is_array = params["template"]

  def call(*arrays):
    it = iter(arrays)
    lv = [next(it) if a else v for v, a in zip(leaves, is_array)]
    args, kwargs = jax.tree.unflatten(treedef, lv)
    return fn(*args, **kwargs)
  return call


def reference_fn(kernel: str, params: dict) -> Callable:
  """A float64-capable golden function of a site from its recorded call.

  Args:
    kernel: the site's kernel (``dot_general``, ``conv_general_dilated`` or a
      composite kind in :data:`peat_jax.REFERENCES`).
    params: for primitives the keyword parameters the KUT received; for
      composites ``{"template": (treedef, leaves, is_array)}``.

  Returns:
    ``f(*site_inputs) -> float64 host array`` (via ``peat.reference``).
  """
  traced = reference_traced(kernel, params)
  if traced is not None:
    return lambda *xs: reference(traced, *xs)
  if kernel in TRACED_REFERENCES and "template" in params:
    # The composite's KUT signature (a cross-entropy site's mean, as the
    # marked function returns it), as its backward site's VJP reads it.
    traced_call = _on_template(TRACED_REFERENCES[kernel], params)
    return lambda *xs: reference(traced_call, *xs)
  if kernel in REFERENCES:
    return _on_template(REFERENCES[kernel], params)
  raise PeatError(f"no float64 reference for kernel {kernel!r}; expected one "
                  f"of dot_general, conv_general_dilated, "
                  f"{', '.join(REFERENCES)}")


def template_vjp(fn: Callable, template: tuple, xs: Sequence) -> tuple:
  """``jax.vjp`` of a recorded composite call at its floating-point arrays.

  Args:
    fn: called as ``fn(*args, **kwargs)`` of the call (the golden kernel's
      reference, or a kernel under test).
    template: the call's ``(treedef, leaves, is_array)``
      (``kernels.kut.recording``).
    xs: the call's array arguments, then the output cotangents (a
      composite backward site's inputs).

  Returns:
    ``(outputs, cotangents, vjp)``: ``fn``'s output leaves, the given
    cotangents, and the function of output cotangents returning those of
    the floating-point array arguments.
  """
  treedef, leaves, is_array = template
  n = sum(is_array)
  arrays, cts = list(xs[:n]), list(xs[n:])
  floats = [i for i, x in enumerate(arrays)
            if jnp.issubdtype(x.dtype, jnp.floating)]

  def run(*fl):
    full = list(arrays)
    for i, x in zip(floats, fl):
      full[i] = x
    it = iter(full)
    lv = [next(it) if a else v for v, a in zip(leaves, is_array)]
    args, kwargs = jax.tree.unflatten(treedef, lv)
    return jax.tree.leaves(fn(*args, **kwargs))

  outs, vjp = jax.vjp(run, *[arrays[i] for i in floats])
  return outs, cts, vjp


def reference_vjp_fn(kernel: str, params: dict) -> Callable | None:
  """The float64 VJP of a composite's reference, for its backward site.

  A composite's backward site takes the forward call's array arguments
  and the output cotangents and returns the cotangents of the
  floating-point arguments; its reference is ``jax.vjp`` of the kind's
  float64 reference (:data:`TRACED_REFERENCES`) at those arguments, applied
  to the cotangents, all in float64.

  Args:
    kernel: the composite kind.
    params: the recorded forward call ``{"template": (treedef, leaves,
      is_array)}`` (``kernels.kut.recording``).

  Returns:
    ``f(*arrays, *cotangents) -> [float64 host cotangent per float
    argument]``, or None for a kind without a traceable reference. ``f``
    returns None when the reference's output does not have the
    cotangents' shapes (a reference of another form than the marked
    function, e.g. per-example cross-entropy of a mean loss).
  """
  core = TRACED_REFERENCES.get(kernel)
  if core is None or "template" not in params:
    return None
  template = params["template"]

  def vjp64(*xs):
    outs, cts, vjp = template_vjp(
        lambda *a, **k: core(*a, **k), template, xs)
    if [np.shape(o) for o in outs] != [np.shape(c) for c in cts]:
      return None
    return list(vjp([c.astype(o.dtype) for c, o in zip(cts, outs)]))

  return lambda *xs: reference(vjp64, *xs)


def reference_traced(kernel: str, params: dict) -> Callable | None:
  """The golden kernel of a primitive site as a traceable JAX function.

  Called on float64 arrays with x64 enabled it is the site's float64
  reference (``reference_fn`` runs it that way on host copies; playback
  jits it on the device).

  Args:
    kernel: the site's kernel.
    params: the keyword parameters the KUT received.

  Returns:
    ``f(*site_inputs)`` at HIGHEST precision for ``dot_general`` and
    ``conv_general_dilated``; None for other kernels.
  """
  from jax import lax
  p = params
  if kernel == "dot_general":
    return lambda l, r: lax.dot_general(l, r, p["dimension_numbers"],
                                        precision=lax.Precision.HIGHEST)
  if kernel == "conv_general_dilated":
    return lambda x, w: lax.conv_general_dilated(
        x, w, p["window_strides"], p["padding"], p["lhs_dilation"],
        p["rhs_dilation"], p["dimension_numbers"],
        p["feature_group_count"], p["batch_group_count"],
        precision=lax.Precision.HIGHEST)
  return None
