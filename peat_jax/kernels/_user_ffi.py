"""``ffi:`` KUTs: a user's XLA FFI handlers at a site, by its calling convention.

A site adapter turns the site's arguments into the operands and attributes
of the site kernel's FFI calling convention (docs/kernels.md: row-major
operands in the site's dtype, one float format per call, the attributes
named there), calls the user's forward target through
:func:`peat_jax.kernels._ffi.user_call`, and wraps forward and backward in a
``jax.custom_vjp``. The first call of a target with a set of operand shapes,
dtypes and attributes runs it once on seeded random operands (at trace
time): a handler that rejects them (``Wrong buffer dtype``, a wrong number
of attributes, its own ``InvalidArgument``) becomes a PeatError naming the
symbol, what it got and the convention it was expected to follow.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.core import PeatError
from peat_jax.kernels import _ffi
from peat_jax.kernels import _user
from peat_jax.kernels._adapters import batched_matmul_layout

_FLOATS = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
           jnp.dtype(jnp.float16))
_PROBED: set = set()


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(int(d) for d in shape), jnp.dtype(dtype))


def _like(x) -> jax.ShapeDtypeStruct:
  return _sds(x.shape, x.dtype)


class _Lib(NamedTuple):
  """A spec's registered targets."""

  spec: str
  kernel: str
  fwd: tuple[str, str]          # (symbol, target)
  bwd: tuple[str, str] | None

  def call(self, which: str, outs, args, attrs):
    if which == "bwd" and self.bwd is None:
      raise PeatError(
          f"KUT {self.spec} has no backward target, so its VJP cannot run "
          "at the backward sites; give ffi:<library.so>:<forward>:<backward>"
          " (docs/kernels.md), or keep the backward sites golden")
    symbol, target = self.fwd if which == "fwd" else self.bwd
    _probe(self, symbol, target, outs, args, attrs)
    return _ffi.user_call(target, outs, *args, **attrs)


def _probe(lib: _Lib, symbol: str, target: str, outs, args, attrs) -> None:
  """Runs a target once on random operands of these shapes (see module doc)."""
  key = (target, tuple((tuple(a.shape), str(a.dtype)) for a in args),
         tuple(sorted((k, float(v)) for k, v in attrs.items())))
  if key in _PROBED:
    return
  rng = np.random.default_rng(0)
  xs = [rng.standard_normal(a.shape).astype(a.dtype)
        if jnp.issubdtype(a.dtype, jnp.floating)
        else np.zeros(a.shape, a.dtype) for a in args]
  try:
    with jax.ensure_compile_time_eval():
      out = jax.jit(lambda *a: _ffi.user_call(target, outs, *a, **attrs))(
          *xs)
      jax.block_until_ready(out)
  except Exception as err:  # XLA's runtime error of the handler
    got = ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in args)
    want = jax.tree.leaves(outs)
    res = ", ".join(f"{np.dtype(o.dtype).name}{list(o.shape)}" for o in want)
    text = str(err).strip().splitlines()[0][:400] if str(err).strip() else (
        type(err).__name__)
    raise PeatError(
        f"KUT {lib.spec}: FFI handler {symbol} failed on the operands of a "
        f"{lib.kernel} call ({got}; attributes "
        f"{ {k: v.item() for k, v in attrs.items()} }; results {res}): "
        f"{text}. Expected a handler with the {lib.kernel} FFI calling "
        "convention (docs/kernels.md)") from None
  _PROBED.add(key)


def _vjp(lib: _Lib, out, bwd_inputs: Callable, grads, attrs) -> Callable:
  """``op(*xs)``: the forward target; its VJP: the backward target.

  Args:
    lib: the targets.
    out: the forward result's ShapeDtypeStruct.
    bwd_inputs: ``(xs, y) -> operands`` of the backward target before the
      output cotangent.
    grads: ShapeDtypeStructs of the backward target's results: the
      cotangents of the first ``len(grads)`` operands (the others get none).
    attrs: the attributes of both targets.
  """
  @jax.custom_vjp
  def op(*xs):
    return lib.call("fwd", out, xs, attrs)

  def op_fwd(*xs):
    y = op(*xs)
    return y, (xs, y)

  def op_bwd(res, dy):
    xs, y = res
    cts = lib.call("bwd", tuple(grads), tuple(bwd_inputs(xs, y)) + (dy,),
                   attrs)
    return tuple(cts) + (None,) * (len(xs) - len(grads))

  op.defvjp(op_fwd, op_bwd)
  return op


def _floats(lib: _Lib, **arrays) -> jnp.dtype:
  dts = {k: jnp.dtype(v.dtype) for k, v in arrays.items()}
  bad = {k: d for k, d in dts.items() if d not in _FLOATS}
  if bad or len(set(dts.values())) > 1:
    got = ", ".join(f"{k}={d}" for k, d in dts.items())
    raise PeatError(f"KUT {lib.spec}: the {lib.kernel} FFI convention takes "
                    f"operands of one float dtype (float32, bfloat16 or "
                    f"float16); got {got}")
  return next(iter(dts.values()))


def _preferred(lib: _Lib, dtype, preferred) -> None:
  _user.check_preferred(f"KUT {lib.spec}", dtype, preferred)


# ------------------------------------------------------------- adapters


def _dot_general(lib: _Lib) -> Callable:
  def kut(lhs, rhs, *, dimension_numbers, precision=None,
          preferred_element_type=None, out_sharding=None, **unused):
    del precision, out_sharding, unused
    dt = _floats(lib, lhs=lhs, rhs=rhs)
    _preferred(lib, dt, preferred_element_type)
    lp, rp, (b, m, k, n), out_shape = batched_matmul_layout(
        lhs.shape, rhs.shape, dimension_numbers)
    a = jnp.transpose(lhs, lp).reshape(b, m, k)
    w = jnp.transpose(rhs, rp).reshape(b, k, n)
    op = _vjp(lib, _sds((b, m, n), dt), lambda xs, y: xs,
              (_like(a), _like(w)), {})
    return op(a, w).reshape(out_shape)
  return kut


def _conv(lib: _Lib) -> Callable:
  def kut(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
          dimension_numbers, feature_group_count, batch_group_count,
          precision=None, preferred_element_type=None, **unused):
    del precision, unused
    dt = _floats(lib, lhs=lhs, rhs=rhs)
    _preferred(lib, dt, preferred_element_type)
    why = []
    if len(window_strides) != 2:
      why.append(f"{len(window_strides)} spatial dims (expected 2)")
    if any(d != 1 for d in tuple(lhs_dilation or ()) + tuple(rhs_dilation or ())):
      why.append(f"dilation lhs={lhs_dilation} rhs={rhs_dilation} "
                 "(expected 1)")
    if feature_group_count != 1 or batch_group_count != 1:
      why.append(f"groups feature={feature_group_count} "
                 f"batch={batch_group_count} (expected 1)")
    pads = [tuple(int(v) for v in p) for p in padding]
    if any(v < 0 for p in pads for v in p):
      why.append(f"negative padding {pads}")
    if why:
      raise PeatError(f"KUT {lib.spec}: the conv_general_dilated FFI "
                      "convention cannot express this convolution: "
                      + "; ".join(why) + ". Select other sites")
    ls, rs, os_ = (tuple(int(d) for d in s) for s in (
        dimension_numbers.lhs_spec, dimension_numbers.rhs_spec,
        dimension_numbers.out_spec))
    x = jnp.transpose(lhs, (ls[0], ls[2], ls[3], ls[1]))   # NHWC
    w = jnp.transpose(rhs, (rs[2], rs[3], rs[1], rs[0]))   # HWIO
    (pt, pb), (pl, pr) = pads
    sh, sw = (int(s) for s in window_strides)
    n, h, wd, _ = x.shape
    kh, kw, _, o = w.shape
    oh, ow = (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1
    attrs = {"stride_h": np.int32(sh), "stride_w": np.int32(sw),
             "pad_top": np.int32(pt), "pad_bottom": np.int32(pb),
             "pad_left": np.int32(pl), "pad_right": np.int32(pr)}
    op = _vjp(lib, _sds((n, oh, ow, o), dt), lambda xs, y: xs,
              (_like(x), _like(w)), attrs)
    inv = [0] * 4
    for nhwc, site_dim in zip((0, 3, 1, 2), os_):
      inv[site_dim] = nhwc
    return jnp.transpose(op(x, w), inv)
  return kut


def _rowwise(lib: _Lib) -> Callable:
  """softmax and log_softmax: rows of the normalized axis."""
  def kut(x, axis=-1):
    _floats(lib, x=x)
    xt = jnp.moveaxis(x, axis, -1)
    x2 = xt.reshape(-1, xt.shape[-1])
    op = _vjp(lib, _like(x2), lambda xs, y: (y,), (_like(x2),), {})
    return jnp.moveaxis(op(x2).reshape(xt.shape), -1, axis)
  return kut


def _layer_norm(lib: _Lib) -> Callable:
  def kut(x, scale, bias, eps=1e-6):
    d = x.shape[-1]
    scale = jnp.ones((d,), x.dtype) if scale is None else scale
    bias = jnp.zeros((d,), x.dtype) if bias is None else bias
    _floats(lib, x=x, scale=scale, bias=bias)
    x2 = x.reshape(-1, d)
    op = _vjp(lib, _like(x2), lambda xs, y: xs[:2],
              (_like(x2), _like(scale), _like(bias)),
              {"eps": np.float32(eps)})
    return op(x2, scale.reshape(d), bias.reshape(d)).reshape(x.shape)
  return kut


def _rms_norm(lib: _Lib) -> Callable:
  def kut(x, scale, eps=1e-6):
    d = x.shape[-1]
    scale = jnp.ones((d,), x.dtype) if scale is None else scale
    _floats(lib, x=x)
    if jnp.dtype(scale.dtype) in _FLOATS:
      # nnx.RMSNorm(dtype=x.dtype) applies its (float32) parameter in x's
      # dtype: a bf16 model's site has a float32 scale and a bf16 x.
      scale = scale.astype(x.dtype)
    _floats(lib, x=x, scale=scale)
    x2 = x.reshape(-1, d)
    op = _vjp(lib, _like(x2), lambda xs, y: xs, (_like(x2), _like(scale)),
              {"eps": np.float32(eps)})
    return op(x2, scale.reshape(d)).reshape(x.shape)
  return kut


def _gelu(lib: _Lib) -> Callable:
  def kut(x, approximate=False):
    _floats(lib, x=x)
    x1 = x.reshape(-1)
    op = _vjp(lib, _like(x1), lambda xs, y: xs, (_like(x1),),
              {"approximate": np.int32(bool(approximate))})
    return op(x1).reshape(x.shape)
  return kut


def _attention(lib: _Lib) -> Callable:
  def kut(q, k, v, mask=None, *, bias=None, scale=None, is_causal=False):
    dt = _floats(lib, q=q, k=k, v=v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
      raise PeatError(f"KUT {lib.spec}: the attention FFI convention takes "
                      f"q, k, v of shape [batch, length, heads, head_dim]; "
                      f"got {q.shape}, {k.shape}, {v.shape}")
    b, t, h, d = q.shape
    s = k.shape[1]
    hk = k.shape[2]
    if hk != h:
      # Grouped-query attention: query head j uses kv head j // (h // hk);
      # the convention's k and v have q's heads (each kv head repeated).
      if hk == 0 or h % hk or v.shape[2] != hk:
        raise PeatError(f"KUT {lib.spec}: attention with {h} query heads "
                        f"and {hk} key / {v.shape[2]} value heads; expected "
                        "k and v with the same heads, a divisor of q's")
      k = jnp.repeat(k, h // hk, axis=2)
      v = jnp.repeat(v, h // hk, axis=2)
    full = (b, h, t, s)
    logit_bias = jnp.zeros(full, dt)
    if bias is not None:
      logit_bias = logit_bias + jnp.broadcast_to(bias, full).astype(dt)
    if mask is not None:
      logit_bias = jnp.where(jnp.broadcast_to(mask, full), logit_bias,
                             jnp.finfo(dt).min)
    attrs = {"scale": np.float32(1.0 / math.sqrt(d) if scale is None
                                 else scale),
             "is_causal": np.int32(bool(is_causal))}
    op = _vjp(lib, _sds((b, t, h, v.shape[-1]), dt), lambda xs, y: xs,
              (_like(q), _like(k), _like(v)), attrs)
    return op(q, k, v, logit_bias)
  return kut


def _silu(lib: _Lib) -> Callable:
  """silu: ``x [N] -> y`` or SwiGLU ``x [N], up [N] -> y`` (flattened)."""
  def kut(x, up=None):
    if up is None:
      _floats(lib, x=x)
      args = (x.reshape(-1),)
    else:
      _floats(lib, x=x, up=up)
      if tuple(up.shape) != tuple(x.shape):
        raise PeatError(f"KUT {lib.spec}: the silu FFI convention takes x "
                        f"and up of one shape; got {tuple(x.shape)} and "
                        f"{tuple(up.shape)}")
      args = (x.reshape(-1), up.reshape(-1))
    op = _vjp(lib, _like(args[0]), lambda xs, y: xs,
              tuple(_like(a) for a in args), {})
    return op(*args).reshape(x.shape)
  return kut


def _rope(lib: _Lib) -> Callable:
  """rope: ``x [B, T, H, D], positions int32 [T] -> y``; attribute theta."""
  def kut(x, positions, theta=10000.0):
    _floats(lib, x=x)
    if x.ndim != 4 or x.shape[-1] % 2:
      raise PeatError(f"KUT {lib.spec}: the rope FFI convention takes x of "
                      "shape [batch, length, heads, head_dim] with an even "
                      f"head_dim; got {tuple(x.shape)}")
    positions = jnp.asarray(positions)
    if (not jnp.issubdtype(positions.dtype, jnp.integer)
        or tuple(positions.shape) != (x.shape[1],)):
      raise PeatError(f"KUT {lib.spec}: the rope FFI convention takes "
                      f"integer positions of shape [length] = "
                      f"[{x.shape[1]}]; got {positions.dtype}"
                      f"{list(positions.shape)}. Select other sites")
    op = _vjp(lib, _like(x), lambda xs, y: xs, (_like(x),),
              {"theta": np.float32(theta)})
    return op(x, positions.astype(jnp.int32))
  return kut


def _cross_entropy(lib: _Lib) -> Callable:
  def kut(logits, labels, reduction="mean"):
    _floats(lib, logits=logits)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
      raise PeatError(f"KUT {lib.spec}: the cross_entropy FFI convention "
                      f"takes integer class labels; this site has "
                      f"{labels.dtype} targets. Select other sites")
    if reduction not in ("mean", "none"):
      raise PeatError(f"KUT {lib.spec}: reduction {reduction!r}; expected "
                      "'mean' or 'none'")
    c = logits.shape[-1]
    l2 = logits.reshape(-1, c)
    y1 = labels.reshape(-1).astype(jnp.int32)
    op = _vjp(lib, _sds((l2.shape[0],), l2.dtype), lambda xs, y: xs,
              (_like(l2),), {})
    losses = op(l2, y1).reshape(labels.shape)
    return jnp.mean(losses) if reduction == "mean" else losses
  return kut


_ADAPTERS = {
    "dot_general": _dot_general, "conv_general_dilated": _conv,
    "softmax": _rowwise, "log_softmax": _rowwise, "layer_norm": _layer_norm,
    "rms_norm": _rms_norm, "gelu": _gelu, "attention": _attention,
    "cross_entropy": _cross_entropy, "silu": _silu, "rope": _rope,
}
assert set(_ADAPTERS) == set(_user.ADAPTED_KERNELS)


def ffi_kut(spec) -> Callable:
  """The KUT of a parsed ``ffi:`` spec at sites of its kernel.

  Raises:
    PeatError: the library or a symbol cannot be loaded.
  """
  path, fwd, bwd = spec.parts
  targets = _ffi.load_user_library(path, [s for s in (fwd, bwd) if s])
  lib = _Lib(spec.spec, spec.site_kernel, (fwd, targets[fwd]),
             (bwd, targets[bwd]) if bwd else None)
  kut = _ADAPTERS[spec.site_kernel](lib)
  kut.__name__ = f"ffi_{fwd}"
  return kut
