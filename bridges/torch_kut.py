"""torch kernels as kernels under test (KUTs) at JAX sites, zero copy.

:func:`torch_op` turns any torch function (``torch.matmul``,
``F.softmax``, your own function, a ``torch.library`` custom op) into a JAX
function that works under ``jit``, ``grad`` and ``vmap``:

* forward: one ``jax.experimental.buffer_callback`` per call. XLA hands the
  callback its own input and output buffers; torch reads the inputs through
  DLPack (``torch.from_dlpack``, no copy) and the result is written into
  XLA's output buffer (one ``copy_``, or none when the torch function writes
  ``out=`` itself). Tested by data pointers for float32, bfloat16, float16.
* backward: a ``jax.custom_vjp`` whose backward is a second callback that
  recomputes the torch forward on the saved inputs with autograd on and runs
  ``torch.autograd.grad`` with the JAX cotangents (like ``jax.checkpoint``
  of one call).
* result shapes and dtypes come from running the function on torch ``meta``
  tensors at trace time (or from ``result_shape=``).
* no silent casts: the float inputs of one call must share one dtype, and a
  torch result whose shape or dtype differs from the expected one raises.
  A torch function that writes to its inputs in place raises (the inputs
  are XLA's buffers).

Site adapters turn a torch function into a KUT with the site kernel's
signature (docs/sites.md); :func:`register_torch_kut` registers one under a
``torch:<name>`` spec so campaigns accept it
(``peat.validate(task, "torch:conv2d", ...)``). Importing
:mod:`peat_jax.bridges` registers the built-in family (:data:`BUILTIN`)
without importing torch; torch is imported when a KUT first runs.

>>> import peat_jax.bridges as bridges          # registers torch:* specs
>>> subs = peat.resolve_kut("torch:matmul")     # doctest: +SKIP
>>> mm = bridges.torch_op(torch.matmul)         # a JAX function
>>> jax.jit(jax.grad(lambda a, b: mm(a, b).sum()))(a, b)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from peat_jax.core import PeatError
from peat_jax.bridges._torch import jax_dtype
from peat_jax.bridges._torch import require_torch
from peat_jax.bridges._torch import torch_dtype
from peat_jax.kernels import kut as _kut

__all__ = ["BUILTIN", "PREFIX", "TorchKut", "conv_kut", "composite_kut",
           "dot_general_kut", "register_builtin", "register_torch_kut",
           "torch_op"]

PREFIX = "torch:"
_FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16),
                 jnp.dtype(jnp.float16))


# ------------------------------------------------------------ torch_op


def _is_float(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.inexact)


def _check_inputs(name: str, arrays: Sequence[Any], strict: bool) -> None:
  floats = {}
  for i, a in enumerate(arrays):
    dt = jnp.dtype(a.dtype)
    if _is_float(dt):
      if dt not in _FLOAT_DTYPES:
        raise PeatError(
            f"torch op {name}: input {i} has dtype {dt}; expected float32, "
            "bfloat16 or float16 (cast it explicitly)")
      floats[i] = dt
  if strict and len(set(floats.values())) > 1:
    got = ", ".join(f"input {i}: {d}" for i, d in floats.items())
    raise PeatError(
        f"torch op {name}: float inputs must share one dtype ({got}); torch "
        "would promote them silently. Cast them explicitly, or pass "
        "strict_dtypes=False to accept torch's promotion")


def _struct_of(name: str, r: Any) -> Any:
  torch = require_torch()
  if isinstance(r, torch.Tensor):
    return jax.ShapeDtypeStruct(tuple(r.shape), jax_dtype(r.dtype))
  if isinstance(r, (tuple, list)) and r and all(
      isinstance(x, torch.Tensor) for x in r):
    return tuple(jax.ShapeDtypeStruct(tuple(x.shape), jax_dtype(x.dtype))
                 for x in r)
  raise PeatError(f"torch op {name} returned {type(r).__name__}; expected a "
                  "torch.Tensor or a tuple of tensors")


def _meta_result(name: str, fn: Callable, arrays) -> Any:
  torch = require_torch()
  metas = [torch.empty(tuple(a.shape), dtype=torch_dtype(a.dtype),
                       device="meta") for a in arrays]
  try:
    r = fn(*metas)
  except Exception as err:  # any torch error: say how to fix it
    raise PeatError(
        f"torch op {name}: cannot infer its result shape on torch 'meta' "
        f"tensors ({type(err).__name__}: {err}). Pass result_shape=(lambda "
        "*arrays: jax.ShapeDtypeStruct(...)) to torch_op, or register a fake "
        "kernel for a custom op (torch.library.register_fake)") from err
  return _struct_of(name, r)


def _leaves(x) -> list:
  return list(x) if isinstance(x, tuple) else [x]


def _write(name: str, outs: Sequence[Any], results: Sequence[Any]) -> None:
  """Copies torch results into XLA's output buffers (checked, never cast)."""
  torch = require_torch()
  if len(outs) != len(results):
    raise PeatError(f"torch op {name} returned {len(results)} tensors; "
                    f"expected {len(outs)}")
  for i, (o, r) in enumerate(zip(outs, results)):
    ot = torch.from_dlpack(o)
    if not isinstance(r, torch.Tensor):
      raise PeatError(f"torch op {name}: output {i} is "
                      f"{type(r).__name__}; expected a torch.Tensor")
    if tuple(r.shape) != tuple(ot.shape) or r.dtype != ot.dtype:
      raise PeatError(
          f"torch op {name}: output {i} is {r.dtype}{list(r.shape)}; "
          f"expected {ot.dtype}{list(ot.shape)} (as inferred at trace time); "
          "the bridge never casts")
    if r.data_ptr() != ot.data_ptr():
      ot.copy_(r)


def _check_untouched(name: str, tensors, versions) -> None:
  for i, (t, v) in enumerate(zip(tensors, versions)):
    if t._version != v:  # pylint: disable=protected-access
      raise PeatError(
          f"torch op {name} wrote to its input {i} in place; the inputs are "
          "XLA's buffers and must not change. Clone the input first "
          "(x = x.clone()) or use the out-of-place op")


class _Op(NamedTuple):
  name: str
  fn: Callable
  out: Any  # ShapeDtypeStruct or tuple of them
  is_float: tuple
  vmap_method: str
  out_arg: bool


def _forward_cb(op: _Op):
  def callback(ctx, outs, *ins):
    del ctx
    torch = require_torch()
    ts = [torch.from_dlpack(b) for b in ins]
    versions = [t._version for t in ts]  # pylint: disable=protected-access
    out_leaves = _leaves(outs)
    with torch.no_grad():
      if op.out_arg:
        ots = [torch.from_dlpack(o) for o in out_leaves]
        r = op.fn(*ts, out=ots[0] if len(ots) == 1 else tuple(ots))
      else:
        r = op.fn(*ts)
    _write(op.name, out_leaves, _leaves(r) if isinstance(r, (tuple, list))
           else [r])
    _check_untouched(op.name, ts, versions)
  return callback


def _backward_cb(op: _Op, n_in: int):
  def callback(ctx, outs, *ins_and_cts):
    del ctx
    torch = require_torch()
    ts = [torch.from_dlpack(b) for b in ins_and_cts]
    versions = [t._version for t in ts]  # pylint: disable=protected-access
    ins, cts = ts[:n_in], ts[n_in:]
    leaves = [t.detach().requires_grad_(True) if f else t
              for t, f in zip(ins, op.is_float)]
    with torch.enable_grad():
      r = op.fn(*leaves)
    rs = _leaves(r) if isinstance(r, (tuple, list)) else [r]
    wrt = [t for t, f in zip(leaves, op.is_float) if f]
    grads = torch.autograd.grad(rs, wrt, grad_outputs=cts, allow_unused=True)
    for o, g in zip(_leaves(outs), grads):
      ot = torch.from_dlpack(o)
      if g is None:
        ot.zero_()
      else:
        ot.copy_(g)
    _check_untouched(op.name, ts, versions)
  return callback


def _build(op: _Op) -> Callable:
  n_in = len(op.is_float)

  def forward(*xs):
    return buffer_callback(_forward_cb(op), op.out,
                           vmap_method=op.vmap_method)(*xs)

  @jax.custom_vjp
  def call(*xs):
    return forward(*xs)

  def call_fwd(*xs):
    return forward(*xs), xs

  def call_bwd(xs, ct):
    grads_struct = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype)
                         for x, f in zip(xs, op.is_float) if f)
    if not grads_struct:
      return (None,) * n_in
    grads = iter(buffer_callback(_backward_cb(op, n_in), grads_struct,
                                 vmap_method=op.vmap_method)(
                                     *xs, *_leaves(ct)))
    return tuple(next(grads) if f else None for f in op.is_float)

  call.defvjp(call_fwd, call_bwd)
  return call


def torch_op(fn: Callable, *, name: str | None = None,
             result_shape: Callable[..., Any] | None = None,
             strict_dtypes: bool = True, out_arg: bool = False,
             vmap_method: str = "sequential") -> Callable[..., Any]:
  """Wraps a torch function as a JAX function (zero-copy inputs).

  Args:
    fn: ``fn(*tensors) -> tensor or tuple of tensors``; non-array
      arguments go into a closure (``lambda x: F.softmax(x, dim=-1)``).
      Must not write to its inputs. Any torch function works: ``torch.*``,
      ``torch.nn.functional.*``, your own, a ``torch.library`` custom op
      (give it a fake kernel or pass ``result_shape``).
    name: a label for error messages (default ``fn``'s name).
    result_shape: ``(*arrays) -> jax.ShapeDtypeStruct`` (or a tuple of
      them); default: run ``fn`` on torch ``meta`` tensors.
    strict_dtypes: require one float dtype across the inputs (default);
      torch would otherwise promote mixed dtypes silently.
    out_arg: call ``fn(*tensors, out=<XLA's output buffer>)`` so the
      result is written in place (no output copy), e.g. ``torch.matmul``.
    vmap_method: how ``jax.vmap`` runs the callback (see
      ``jax.pure_callback``); ``"sequential"`` is right for any op.

  Returns:
    ``op(*arrays) -> jax.Array`` (or a tuple), usable under ``jit``,
    ``grad`` (torch autograd) and ``vmap``.

  Raises:
    PeatError: at call time, for non-array arguments, mixed float dtypes
      (strict), unsupported dtypes, or a result shape that cannot be
      inferred. Inside the callback (surfacing as a JAX runtime error): a
      result of another shape or dtype, or an in-place write to an input.
  """
  if not callable(fn):
    raise PeatError(f"torch_op expects a callable torch function, got "
                    f"{type(fn).__name__}")
  label = name or getattr(fn, "__name__", None) or repr(fn)

  def op(*arrays):
    bad = [i for i, a in enumerate(arrays)
           if not hasattr(a, "shape") or not hasattr(a, "dtype")]
    if bad:
      raise PeatError(
          f"torch op {label}: positional arguments must be arrays; "
          f"arguments {bad} are not (put static arguments in a closure: "
          "torch_op(lambda x: fn(x, dim=-1)))")
    arrays = [jnp.asarray(a) for a in arrays]
    _check_inputs(label, arrays, strict_dtypes)
    out = (result_shape(*arrays) if result_shape is not None
           else _meta_result(label, fn, arrays))
    for i, s in enumerate(_leaves(out)):
      if jnp.dtype(s.dtype) == jnp.float64:
        raise PeatError(f"torch op {label}: output {i} would be float64, "
                        "which JAX (x64 off) cannot hold; cast in fn")
    is_float = tuple(_is_float(a.dtype) for a in arrays)
    return _build(_Op(label, fn, out, is_float, vmap_method, out_arg))(
        *arrays)

  op.__name__ = f"torch_op_{label}"
  return op


# ------------------------------------------------------- site adapters


def _dg_dims(lhs_shape, rhs_shape, dimension_numbers):
  (lc, rc), (lb, rb) = dimension_numbers
  lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
  lf = tuple(d for d in range(len(lhs_shape)) if d not in lc + lb)
  rf = tuple(d for d in range(len(rhs_shape)) if d not in rc + rb)
  return lc, rc, lb, rb, lf, rf


def _same_float_dtype(kind: str, **arrays) -> None:
  dts = {k: jnp.dtype(v.dtype) for k, v in arrays.items()}
  if len(set(dts.values())) > 1:
    got = ", ".join(f"{k}={d}" for k, d in dts.items())
    raise PeatError(f"torch {kind} KUT: operands must share one dtype, got "
                    f"{got}; the bridge never casts silently")


def _check_preferred(kind: str, dtype, preferred) -> None:
  from peat_jax import kernels  # pylint: disable=g-import-not-at-top

  kernels.check_preferred(f"torch {kind} KUT", dtype, preferred)


def dot_general_kut(fn: Callable, *, name: str = "matmul") -> Callable:
  """A ``dot_general`` site KUT computed by a torch batched matmul.

  Operands are permuted and reshaped *in torch* to ``(B, M, K)`` and
  ``(B, K, N)`` (free, contracting and batch dims from
  ``dimension_numbers``), ``fn`` runs, and the ``(B, M, N)`` result is
  reshaped to dot_general's layout (batch, lhs free, rhs free).

  Args:
    fn: ``fn(a, b) -> a @ b`` over ``(B, M, K)``, ``(B, K, N)`` tensors,
      e.g. ``torch.matmul``.
    name: label for errors.

  Returns:
    ``kut(lhs, rhs, *, dimension_numbers, precision, preferred_element_type,
    out_sharding)``.
  """

  def kut(lhs, rhs, *, dimension_numbers, precision=None,
          preferred_element_type=None, out_sharding=None, **unused):
    del precision, out_sharding, unused
    _same_float_dtype(name, lhs=lhs, rhs=rhs)
    _check_preferred(name, lhs.dtype, preferred_element_type)
    lc, rc, lb, rb, lf, rf = _dg_dims(lhs.shape, rhs.shape, dimension_numbers)
    size = lambda shape, dims: int(np.prod([shape[d] for d in dims],
                                           dtype=np.int64))
    b = size(lhs.shape, lb)
    m, n, k = size(lhs.shape, lf), size(rhs.shape, rf), size(lhs.shape, lc)
    out_shape = (tuple(lhs.shape[d] for d in lb)
                 + tuple(lhs.shape[d] for d in lf)
                 + tuple(rhs.shape[d] for d in rf))

    def tfn(l, r):
      a = l.permute(lb + lf + lc).reshape(b, m, k)
      w = r.permute(rb + rc + rf).reshape(b, k, n)
      return fn(a, w).reshape(out_shape)

    return torch_op(tfn, name=name)(lhs, rhs)

  kut.__name__ = f"torch_{name}"
  return kut


def conv_kut(fn: Callable, *, name: str = "conv2d") -> Callable:
  """A ``conv_general_dilated`` site KUT (2 spatial dims) computed by torch.

  The input and filter are permuted in torch from the site's layout
  (``dimension_numbers``; NHWC/HWIO for Flax) to NCHW/OIHW, explicit
  asymmetric padding goes through ``F.pad``, ``fn`` runs, and the result is
  permuted back to the site's output layout.

  Args:
    fn: ``fn(x, w, stride=, padding=, dilation=, groups=)`` like
      ``torch.nn.functional.conv2d``.
    name: label for errors.

  Returns:
    ``kut(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
    dimension_numbers, feature_group_count, batch_group_count, ...)``.

  Raises:
    PeatError: (at trace time) not 2 spatial dims, input dilation
      (transposed convolution), batch groups, mixed dtypes.
  """

  def kut(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
          dimension_numbers, feature_group_count, batch_group_count,
          precision=None, preferred_element_type=None, **unused):
    del precision, unused
    _same_float_dtype(name, lhs=lhs, rhs=rhs)
    _check_preferred(name, lhs.dtype, preferred_element_type)
    why = []
    if len(window_strides) != 2:
      why.append(f"{len(window_strides)} spatial dims (expected 2)")
    if any(d != 1 for d in tuple(lhs_dilation or ())):
      why.append(f"input dilation {tuple(lhs_dilation)} (transposed "
                 "convolution; expected 1)")
    if batch_group_count != 1:
      why.append(f"batch_group_count={batch_group_count} (expected 1)")
    if why:
      raise PeatError(f"torch {name} KUT cannot run this convolution: "
                      + "; ".join(why) + ". Select other sites.")
    lspec, rspec, ospec = (tuple(int(d) for d in s) for s in (
        dimension_numbers.lhs_spec, dimension_numbers.rhs_spec,
        dimension_numbers.out_spec))
    pads = [tuple(int(v) for v in p) for p in padding]
    if any(v < 0 for p in pads for v in p):
      raise PeatError(f"torch {name} KUT: negative padding {pads} is not "
                      "supported")
    strides = tuple(int(s) for s in window_strides)
    dil = tuple(int(d) for d in (rhs_dilation or (1, 1)))
    sym = all(a == b for a, b in pads)
    inv = tuple(ospec.index(d) for d in range(len(ospec)))
    groups = int(feature_group_count)

    def tfn(x, w):
      torch = require_torch()
      x = x.permute(lspec)
      w = w.permute(rspec)
      if sym:
        y = fn(x, w, stride=strides, padding=tuple(p[0] for p in pads),
               dilation=dil, groups=groups)
      else:
        (t, b), (l, r) = pads
        x = torch.nn.functional.pad(x, (l, r, t, b))
        y = fn(x, w, stride=strides, padding=0, dilation=dil, groups=groups)
      return y.permute(inv)

    return torch_op(tfn, name=name)(lhs, rhs)

  kut.__name__ = f"torch_{name}"
  return kut


def composite_kut(kind: str, fn: Callable, *, name: str | None = None
                  ) -> Callable:
  """A composite site KUT (signature of ``models/layers.py``'s function).

  | kind | site signature | torch call |
  | --- | --- | --- |
  | ``softmax`` | ``(x, axis=-1)`` | ``fn(x, dim=axis)`` |
  | ``log_softmax`` | ``(x, axis=-1)`` | ``fn(x, dim=axis)`` |
  | ``layer_norm`` | ``(x, scale, bias, eps=1e-6)`` | ``fn(x, (D,), scale, bias, eps)`` |
  | ``rms_norm`` | ``(x, scale, eps=1e-6)`` | ``fn(x, (D,), scale, eps)`` (``F.rms_norm``'s form; ``scale`` in x's dtype, as ``nnx.RMSNorm(dtype=x.dtype)`` applies it; None without one) |
  | ``gelu`` | ``(x, approximate=False)`` | ``fn(x)`` (the function's own form) |
  | ``silu`` | ``(x)`` or ``(x, up)`` (SwiGLU) | ``fn(x)``; with ``up``: ``fn(x, up)`` when ``fn`` takes two required positional arguments (a fused SwiGLU), else ``fn(x) * up`` in torch (HF Llama's ``act_fn(gate) * up``, e.g. ``F.silu``) |
  | ``rope`` | ``(x, positions, *, theta)``, x ``[B, T, H, D]``, positions int ``[T]`` | ``fn(x, positions, theta)``: x in the site's layout, positions an int32 tensor, theta a Python float |
  | ``attention`` | ``(q, k, v, mask=None, *, bias=None, scale=None, is_causal=False)``, ``[B, T, H, D]`` | ``fn(q, k, v, attn_mask=m)`` on ``[B, H, T, D]`` (SDPA; ``m`` the mask, or the bias with the mask applied; ``scale=``, ``is_causal=True`` passed when set; ``enable_gqa=True`` when k and v have fewer heads than q) |
  | ``cross_entropy`` | ``(logits, labels, reduction="mean")`` | ``fn(logits.reshape(-1, V), labels.reshape(-1).long())`` (mean), with ``reduction="none"`` per example |

  Args:
    kind: the composite kind.
    fn: the torch function.
    name: label for errors (default ``kind``).

  Returns:
    The KUT.

  Raises:
    PeatError: an unknown kind.
  """
  label = name or kind
  if kind in ("softmax", "log_softmax"):
    def kut(x, axis=-1):
      return torch_op(lambda t: fn(t, dim=axis), name=label)(x)
  elif kind == "layer_norm":
    def kut(x, scale, bias, eps=1e-6):
      _same_float_dtype(label, x=x, scale=scale, bias=bias)
      return torch_op(lambda t, s, b: fn(t, (t.shape[-1],), s, b, float(eps)),
                      name=label)(x, scale, bias)
  elif kind == "rms_norm":
    def kut(x, scale, eps=1e-6):
      if scale is None:
        return torch_op(lambda t: fn(t, (t.shape[-1],), None, float(eps)),
                        name=label, result_shape=_like_first)(x)
      if _is_float(scale.dtype) and _is_float(x.dtype):
        # nnx.RMSNorm(dtype=x.dtype) applies its float32 parameter in x's
        # dtype (a bf16 model's site: x bf16, scale float32): so does the
        # adapter, as the golden layer does, not as a silent promotion.
        scale = scale.astype(x.dtype)
      _same_float_dtype(label, x=x, scale=scale)
      return torch_op(lambda t, s: fn(t, (t.shape[-1],), s, float(eps)),
                      name=label, result_shape=_like_first)(x, scale)
  elif kind == "silu":
    fused = _takes_two_positional(fn)

    def kut(x, up=None):
      if up is None:
        return torch_op(fn, name=label, result_shape=_like_first)(x)
      _same_float_dtype(label, x=x, up=up)
      if tuple(up.shape) != tuple(x.shape):
        raise PeatError(f"torch {label} KUT: x and up must have one shape "
                        f"(SwiGLU); got {tuple(x.shape)} and "
                        f"{tuple(up.shape)}")
      if fused:
        return torch_op(lambda a, b: fn(a, b), name=label,
                        result_shape=_like_first)(x, up)
      return torch_op(lambda a, b: fn(a) * b, name=label,
                      result_shape=_like_first)(x, up)
  elif kind == "rope":
    def kut(x, positions, theta=10000.0):
      positions = jnp.asarray(positions)
      if (x.ndim != 4 or not jnp.issubdtype(positions.dtype, jnp.integer)
          or tuple(positions.shape) != (x.shape[1],)):
        raise PeatError(
            f"torch {label} KUT: expected x [batch, length, heads, "
            f"head_dim] and integer positions [length]; got x "
            f"{tuple(x.shape)}, positions {positions.dtype}"
            f"{list(positions.shape)}")
      return torch_op(lambda t, p: fn(t, p, float(theta)), name=label,
                      result_shape=_like_first)(x, positions.astype(jnp.int32))
  elif kind == "gelu":
    def kut(x, approximate=False):
      del approximate  # the torch function computes its own form
      return torch_op(fn, name=label)(x)
  elif kind == "attention":
    def kut(q, k, v, mask=None, *, bias=None, scale=None, is_causal=False):
      _same_float_dtype(label, q=q, k=k, v=v)
      attn_mask, causal = _sdpa_mask(q, k, mask, bias, is_causal)
      extra = {} if scale is None else {"scale": float(scale)}
      if causal:
        extra["is_causal"] = True
      h, hk = q.shape[2], k.shape[2]
      if hk != h or v.shape[2] != h:
        if hk == 0 or h % hk or v.shape[2] != hk:
          raise PeatError(f"torch {label} KUT: {h} query heads and {hk} "
                          f"key / {v.shape[2]} value heads; expected k and "
                          "v with the same heads, a divisor of q's")
        extra["enable_gqa"] = True  # query head j uses kv head j // (h/hk)

      def tfn(qt, kt, vt, *m):
        y = fn(qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2),
               attn_mask=m[0] if m else None, **extra)
        return y.transpose(1, 2)

      args = (q, k, v) if attn_mask is None else (q, k, v, attn_mask)
      return torch_op(tfn, name=label)(*args)
  elif kind == "cross_entropy":
    def kut(logits, labels, reduction="mean"):
      if reduction not in ("mean", "none"):
        raise PeatError(f"torch {label} KUT: reduction {reduction!r}; "
                        "expected 'mean' or 'none'")

      def tfn(lg, lb):
        args = (lg.reshape(-1, lg.shape[-1]), lb.reshape(-1).long())
        if reduction == "mean":
          return fn(*args)
        return fn(*args, reduction="none").reshape(lb.shape)
      return torch_op(tfn, name=label)(logits, labels)
  else:
    raise PeatError(f"no torch adapter for composite kind {kind!r}; expected "
                    "one of softmax, log_softmax, layer_norm, rms_norm, gelu, "
                    "silu, rope, attention, cross_entropy (or register_kut "
                    "your own KUT with the composite's signature)")
  kut.__name__ = f"torch_{label}"
  return kut


def _like_first(x, *unused) -> jax.ShapeDtypeStruct:
  """The result of an elementwise or rowwise site (rms_norm, silu, rope):
  x's shape and dtype, without running the torch function on meta tensors
  (a function that makes CPU tensors, e.g. ``torch.arange`` without
  ``device=``, cannot run there). The bridge checks the real result."""
  del unused
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _takes_two_positional(fn: Callable) -> bool:
  """Whether ``fn`` takes two required positional arguments (a fused
  SwiGLU ``fn(gate, up)``; ``F.silu(input, inplace=False)`` takes one)."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return False
  required = [p for p in params
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
              and p.default is p.empty]
  return len(required) >= 2


def _sdpa_mask(q, k, mask, bias, is_causal):
  """SDPA's ``attn_mask`` (and whether to pass ``is_causal``) for a site.

  torch refuses ``attn_mask`` together with ``is_causal``: then the causal
  mask is folded into the mask (in JAX, before the call).
  """
  t, s = q.shape[1], k.shape[1]
  if is_causal and (mask is not None or bias is not None):
    causal = jnp.tril(jnp.ones((t, s), bool))
    mask = causal if mask is None else jnp.logical_and(mask, causal)
    is_causal = False
  if bias is None:
    return mask, is_causal
  bias = jnp.asarray(bias, q.dtype)
  if mask is not None:
    bias = jnp.where(mask, bias, -jnp.inf)
  return bias, is_causal


# ------------------------------------------------------------ registry


class TorchKut(NamedTuple):
  """One registered torch KUT.

  Attributes:
    spec: the spec, ``torch:<name>``.
    kernel: the site kernel it replaces (``dot_general``, ``softmax``...).
    fn: the torch function (for built-ins, a function importing torch).
    doc: one line on what it computes.
  """

  spec: str
  kernel: str
  fn: Callable
  doc: str


_REGISTERED: dict[str, TorchKut] = {}


def _adapter(kernel: str, fn: Callable, name: str) -> Callable:
  if kernel == "dot_general":
    return dot_general_kut(fn, name=name)
  if kernel == "conv_general_dilated":
    return conv_kut(fn, name=name)
  return composite_kut(kernel, fn, name=name)


def register_torch_kut(name: str, fn: Callable, *, kernel: str,
                       doc: str = "") -> str:
  """Registers a torch function as the KUT spec ``torch:<name>``.

  Args:
    name: the spec name without the prefix (``"my_matmul"``), or with it.
    fn: the torch function, in the form its kernel's adapter calls it
      (:func:`dot_general_kut`, :func:`conv_kut`, :func:`composite_kut`).
    kernel: the site kernel: ``dot_general``, ``conv_general_dilated``,
      ``softmax``, ``log_softmax``, ``layer_norm``, ``rms_norm``, ``gelu``,
      ``silu``, ``rope``, ``attention`` or ``cross_entropy``.
    doc: one line for listings.

  Returns:
    The spec string, e.g. ``"torch:my_matmul"``.

  Raises:
    PeatError: a bad name or an unknown kernel.
  """
  spec = name if name.startswith(PREFIX) else PREFIX + name
  short = spec[len(PREFIX):]
  if not short or ":" in short or "@" in short:
    raise PeatError(f"torch KUT name {name!r}: expected 'torch:<name>' with a "
                    "name without ':' or '@'")
  if not callable(fn):
    raise PeatError(f"torch KUT {spec}: fn must be callable, got "
                    f"{type(fn).__name__}")
  kut = _adapter(kernel, fn, short)
  _kut.register_kut(spec, kut, kernel=kernel)
  _REGISTERED[spec] = TorchKut(spec, kernel, fn, doc)
  return spec


def registered() -> dict[str, TorchKut]:
  """The registered torch KUTs by spec."""
  return dict(_REGISTERED)


def user_torch_kut(spec: _kut.KutSpec) -> Callable:
  """The KUT of a ``torch:<module>:<function>`` spec (its site kernel's adapter).

  Registered with :func:`peat_jax.kernels.kut.register_source` on import.

  Args:
    spec: the parsed spec (``spec.parts`` = ``(module, function)``).

  Returns:
    The KUT with the site kernel's signature.

  Raises:
    PeatError: the module or function cannot be imported.
  """
  from peat_jax import core  # pylint: disable=g-import-not-at-top

  module, function = spec.parts
  fn = core.user_function(module, function, f"KUT spec {spec.spec!r}")
  return _adapter(spec.site_kernel, fn, f"{module}.{function}")


_kut.register_source("torch", user_torch_kut)


# ------------------------------------------------------------ built-ins


def _matmul(a, b):
  return require_torch().matmul(a, b)


def _matmul_bf16(a, b):
  torch = require_torch()
  return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16)).to(a.dtype)


def _conv2d(x, w, **kw):
  return require_torch().nn.functional.conv2d(x, w, **kw)


def _softmax(x, dim):
  return require_torch().softmax(x, dim=dim)


def _layer_norm(x, shape, scale, bias, eps):
  return require_torch().nn.functional.layer_norm(x, shape, scale, bias, eps)


def _rms_norm(x, shape, scale, eps):
  return require_torch().nn.functional.rms_norm(x, shape, scale, eps)


def _gelu(x):
  return require_torch().nn.functional.gelu(x)


def _silu(x):
  return require_torch().nn.functional.silu(x)


def _rope(x, positions, theta):
  """Rotary embedding of the two halves as HF Llama writes it (``inv_freq
  = 1 / theta**(arange(0, D, 2) / D)``, ``x * cos + rotate_half(x) *
  sin``), with float32 tables and arithmetic and one rounding to x's
  dtype (HF rounds the tables to x's dtype first). x ``[B, T, H, D]``."""
  torch = require_torch()
  d = x.shape[-1]
  inv_freq = 1.0 / (theta ** (torch.arange(
      0, d, 2, dtype=torch.int64, device=x.device).float() / d))
  freqs = positions.float()[:, None] * inv_freq[None, :]
  emb = torch.cat([freqs, freqs], dim=-1)
  cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
  xf = x.float()
  rot = torch.cat([-xf[..., d // 2:], xf[..., :d // 2]], dim=-1)
  return (xf * cos + rot * sin).to(x.dtype)


def _gelu_tanh(x):
  return require_torch().nn.functional.gelu(x, approximate="tanh")


def _sdpa(q, k, v, attn_mask=None, **kw):
  return require_torch().nn.functional.scaled_dot_product_attention(
      q, k, v, attn_mask=attn_mask, **kw)


def _cross_entropy(logits, labels, reduction="mean"):
  return require_torch().nn.functional.cross_entropy(logits, labels,
                                                     reduction=reduction)


#: name -> (site kernel, torch function, what it computes)
BUILTIN: dict[str, tuple[str, Callable, str]] = {
    "matmul": ("dot_general", _matmul, "torch.matmul"),
    "matmul_bf16": ("dot_general", _matmul_bf16,
                    "torch.matmul of bfloat16-rounded operands, bf16 result"),
    "conv2d": ("conv_general_dilated", _conv2d, "F.conv2d (NCHW/OIHW)"),
    "softmax": ("softmax", _softmax, "torch.softmax"),
    "layer_norm": ("layer_norm", _layer_norm, "F.layer_norm"),
    "rms_norm": ("rms_norm", _rms_norm, "F.rms_norm"),
    "gelu": ("gelu", _gelu, "F.gelu (erf)"),
    "gelu_tanh": ("gelu", _gelu_tanh, "F.gelu(approximate='tanh'): a port "
                  "that uses the tanh approximation"),
    "silu": ("silu", _silu, "F.silu; at SwiGLU sites F.silu(x) * up"),
    "rope": ("rope", _rope, "rotary embedding of the two halves in torch "
             "(HF Llama's form, float32, one rounding)"),
    "attention": ("attention", _sdpa, "F.scaled_dot_product_attention "
                  "(enable_gqa=True with fewer kv heads)"),
    "cross_entropy": ("cross_entropy", _cross_entropy, "F.cross_entropy"),
}


def register_builtin() -> list[str]:
  """Registers :data:`BUILTIN` as ``torch:<name>`` specs (torch not imported).

  Returns:
    The registered specs.
  """
  return [register_torch_kut(n, fn, kernel=k, doc=d)
          for n, (k, fn, d) in BUILTIN.items()]
