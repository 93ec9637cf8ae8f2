"""Tests of the slip injector (peat_jax.injectors._slips).

Each op of each category is checked against an explicit construction in
float64, written here from the grammar's description
(peat_jax/core/_slips.py) with NumPy and the Analyzer's float64
references (``peat.REFERENCES``), on fresh seeded inputs (never zeros):
the slip's float64 output (``slipped_reference``) to float64 rounding,
its working-precision output (``slipped_call``) within its format's
rounding. Slips that do not apply raise PeatError naming the slip and
the kind; outputs are bitwise deterministic.
"""

import math
import zlib

import jax
from jax import lax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import injectors
from peat_jax.core import PARAMETERS, PeatError, Slip
from peat_jax.detector.hypotheses import call_template

DOT = (((1,), (0,)), ((), ()))
# float32 always, bfloat16 in the slow set (as tests/injectors/test_inject.py).
DTYPES = (pytest.param(jnp.float32, id="f32"),
          pytest.param(jnp.bfloat16, id="bf16", marks=pytest.mark.slow))
#: float64 vs float64 (two summation orders of the same math).
TIGHT = 1e-11


def vals(seed, shape, dtype=jnp.float32, scale=1.0, loc=0.0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(shape) * scale
  x = np.where(np.abs(x) < 1e-3, 1e-3, x) + loc
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def f64(a):
  return np.asarray(a, np.float64)


def rms(a):
  return float(np.sqrt(np.mean(np.square(f64(a)))))


def reference(kind, args, kwargs):
  """The Analyzer's float64 reference of a call (its own code)."""
  if kind in ("dot_general", "conv_general_dilated"):
    return peat.analyzer.reference_fn(kind, kwargs)(*args)
  template, arrays = call_template(args, kwargs)
  return peat.analyzer.reference_fn(kind, {"template": template})(*arrays)


def close64(a, b, tol=TIGHT):
  """Two float64 results equal to float64 rounding (relative to RMS)."""
  a, b = f64(a), f64(b)
  assert a.shape == b.shape
  assert rms(a - b) <= tol * max(rms(b), 1e-300), (rms(a - b), rms(b))


def within_rounding(t, h, dtype, k=8.0):
  """A working-precision output ``t`` within ``k`` unit roundoffs (RMS) of
  float64 ``h``."""
  u = float(ml_dtypes.finfo(np.dtype(dtype)).eps) / 2
  assert rms(f64(t) - f64(h)) <= k * u * rms(h), (rms(f64(t) - f64(h)),
                                                  u * rms(h))


# A small call of every kind (seeded; lengths no multiple of 8 too).
def calls(seed=0, dtype=jnp.float32):
  s = seed
  x3 = vals(s + 1, (3, 40), dtype, 2.0)
  causal_q = vals(s + 2, (1, 6, 2, 8), dtype)
  # Padding (batch 0 sees 9 keys) and a pattern that varies by query,
  # every query keeping a key in both blocks of 8.
  keys, queries = np.arange(10)[None, :], np.arange(5)[:, None]
  mask = (np.arange(10)[None, None, None, :]
          < np.array([9, 10])[:, None, None, None]) & (
              ((keys + queries) % 3 != 1) | (keys >= 8))
  mask = np.broadcast_to(mask, (2, 1, 5, 10))
  return {
      "dot_general": ((vals(s + 3, (5, 40), dtype), vals(s + 4, (40, 7),
                                                         dtype)),
                      {"dimension_numbers": DOT, "precision": None,
                       "preferred_element_type": np.dtype(dtype)}),
      "conv_general_dilated": _conv_call(s, dtype),
      "softmax": ((x3,), {}),
      "log_softmax": ((x3,), {}),
      "layer_norm": ((vals(s + 5, (4, 40), dtype, 1.5, 0.3),
                      vals(s + 6, (40,), jnp.float32, 0.2, 1.0),
                      vals(s + 7, (40,), jnp.float32, 0.1)), {"eps": 1e-5}),
      "rms_norm": ((vals(s + 8, (4, 40), dtype, 1.5),
                    vals(s + 9, (40,), jnp.float32, 0.2, 1.0)),
                   {"eps": 1e-6}),
      "attention": ((causal_q, vals(s + 10, (1, 6, 1, 8), dtype),
                     vals(s + 11, (1, 6, 1, 8), dtype)), {"is_causal": True}),
      "gelu": ((vals(s + 12, (4, 20), dtype, 2.0),), {}),
      "silu": ((vals(s + 13, (4, 20), dtype, 2.0),
                vals(s + 14, (4, 20), dtype)), {}),
      "rope": ((vals(s + 15, (1, 6, 2, 8), dtype),
                jnp.arange(3, 9, dtype=jnp.int32)), {"theta": 10000.0}),
      "cross_entropy": ((vals(s + 16, (6, 40), dtype, 2.0),
                         jnp.asarray(np.arange(6) * 7 % 40, jnp.int32)),
                        {"reduction": "none"}),
      "masked_attention": ((vals(s + 17, (2, 5, 2, 8), dtype),
                            vals(s + 18, (2, 10, 2, 8), dtype),
                            vals(s + 19, (2, 10, 2, 8), dtype),
                            jnp.asarray(mask)), {}),
  }


def _conv_call(s, dtype):
  lhs = vals(s + 20, (1, 5, 5, 20), dtype)
  rhs = vals(s + 21, (3, 3, 20, 4), dtype, 0.3)
  dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape,
                                  ("NHWC", "HWIO", "NHWC"))
  return (lhs, rhs), {"window_strides": (1, 1), "padding": ((1, 1), (1, 1)),
                      "lhs_dilation": (1, 1), "rhs_dilation": (1, 1),
                      "dimension_numbers": dn, "feature_group_count": 1,
                      "batch_group_count": 1, "precision": None,
                      "preferred_element_type": None}


CALLS = calls()
KINDS = injectors.SLIP_KINDS


def kind_of(name):
  return "attention" if name == "masked_attention" else name


# ------------------------------------------------------ golden and control


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_golden_and_correct_port_are_within_golden_noise(kind, dtype):
  args, kw = calls(1, dtype)[kind]
  r = reference(kind, args, kw)
  g = injectors.golden_call(kind, args, kw)
  c = injectors.slipped_call(kind, None, args, kw)
  assert g.shape == c.shape == r.shape and g.dtype == c.dtype
  assert np.dtype(g.dtype) == np.dtype(dtype)
  within_rounding(g, r, g.dtype, k=4.0)
  # A correct port: about the golden kernel's own error (the Detector
  # flags beyond 4x; a small record's ratio of two rounding errors
  # spreads: 0.4 to 2.7 seen over 12 seeds).
  assert rms(f64(c) - r) <= 3.0 * rms(f64(g) - r)
  close64(injectors.slipped_reference(kind, None, args, kw), r)


def test_float64_golden_math_matches_the_reference_on_a_masked_call():
  args, kw = CALLS["masked_attention"]
  close64(injectors.slipped_reference("attention", None, args, kw),
          reference("attention", args, kw))


@pytest.mark.parametrize("kind", ["dot_general", "softmax", "attention",
                                  "layer_norm", "cross_entropy"])
def test_outputs_are_deterministic(kind):
  args, kw = CALLS[kind]
  slip = injectors.draw_slip(np.random.default_rng(3), kind, args, kw)
  a = injectors.slipped_call(kind, slip, args, kw)
  injectors._slips._PROGRAMS.clear()  # recompiled: the same bits
  b = injectors.slipped_call(kind, slip, args, kw)
  assert a.dtype == b.dtype
  np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                np.asarray(b).view(np.uint8))


# --------------------------------------------------------------- operand


def np_tile(n, width, where):
  """[lo, hi) of the first / last tile (the spec's formula)."""
  if where == "first":
    return 0, min(width, n)
  lo = width * ((n - 1) // width)
  return lo, n


def np_drop(a, axis, width, where):
  a = np.array(a)
  lo, hi = np_tile(a.shape[axis], width, where)
  idx = [slice(None)] * a.ndim
  idx[axis] = slice(lo, hi)
  a[tuple(idx)] = 0
  return a


def np_repeat(a, axis, width, where):
  a = np.array(a)
  b = a.copy()
  n = a.shape[axis]
  lo, hi = np_tile(n, width, where)
  for i in range(lo, hi):
    src = i + width if where == "first" else i - width
    if 0 <= src < n:
      dst = [slice(None)] * a.ndim
      s = list(dst)
      dst[axis], s[axis] = i, src
      b[tuple(dst)] = a[tuple(s)]
  return b


#: (call, slip, explicit transform of the argument list).
OPERAND_CASES = {
    "reverse_filter": ("conv_general_dilated",
                       Slip("operand", "reverse", arg=1, axes=(0, 1)),
                       lambda a: [a[0], np.flip(a[1], (0, 1))]),
    "transpose_filter": ("conv_general_dilated",
                         Slip("operand", "transpose", arg=1, axes=(0, 1)),
                         lambda a: [a[0], np.swapaxes(a[1], 0, 1)]),
    "roll_rows": ("dot_general", Slip("operand", "roll", arg=0, axes=(0,),
                                      shift=1),
                  lambda a: [np.roll(a[0], 1, 0), a[1]]),
    "roll_keys": ("attention", Slip("operand", "roll", arg=1, axes=(1,),
                                    shift=-1),
                  lambda a: [a[0], np.roll(a[1], -1, 1), a[2]]),
    "swap_scale_bias": ("layer_norm", Slip("operand", "swap", arg=1,
                                           other=2),
                        lambda a: [a[0], a[2], a[1]]),
    "swap_gate_up": ("silu", Slip("operand", "swap", arg=0, other=1),
                     lambda a: [a[1], a[0]]),
    "drop_last_k": ("dot_general", Slip("operand", "drop", arg=0, axes=(1,),
                                        where="last", width=16),
                    lambda a: [np_drop(a[0], 1, 16, "last"), a[1]]),
    "drop_first_row": ("softmax", Slip("operand", "drop", arg=0, axes=(0,),
                                       where="first", width=1),
                       lambda a: [np_drop(a[0], 0, 1, "first")]),
    "drop_label": ("cross_entropy", Slip("operand", "drop", arg=1, axes=(0,),
                                         where="last", width=1),
                   lambda a: [a[0], np_drop(a[1], 0, 1, "last")]),
    "repeat_last_tile": ("rms_norm", Slip("operand", "repeat", arg=0,
                                          axes=(1,), where="last", width=16),
                         lambda a: [np_repeat(a[0], 1, 16, "last"), a[1]]),
    "repeat_first_tile": ("layer_norm", Slip("operand", "repeat", arg=0,
                                             axes=(1,), where="first",
                                             width=32),
                          lambda a: [np_repeat(a[0], 1, 32, "first"), a[1],
                                     a[2]]),
    "reverse_positions": ("rope", Slip("operand", "reverse", arg=1,
                                       axes=(0,)),
                          lambda a: [a[0], np.flip(a[1])]),
    "roll_gelu": ("gelu", Slip("operand", "roll", arg=0, axes=(1,),
                                    shift=1),
                       lambda a: [np.roll(a[0], 1, 1)]),
    "repeat_mask_keys": ("masked_attention",
                         Slip("operand", "repeat", arg=3, axes=(3,),
                              where="last", width=8),
                         lambda a: a[:3] + [np_repeat(a[3], 3, 8, "last")]),
}


@pytest.mark.parametrize("case", OPERAND_CASES)
def test_operand_op_is_golden_on_the_transformed_argument(case):
  name, slip, transform = OPERAND_CASES[case]
  kind = kind_of(name)
  args, kw = CALLS[name]
  want = reference(kind, [jnp.asarray(x) for x in transform(
      [np.asarray(a) for a in args])], kw)
  assert injectors.slipped_reference(kind, slip, args, kw).shape == want.shape
  close64(injectors.slipped_reference(kind, slip, args, kw), want)
  t = injectors.slipped_call(kind, slip, args, kw)
  within_rounding(t, want, t.dtype, k=16.0)
  assert rms(f64(t) - reference(kind, args, kw)) > 1e-3 * rms(want)


def test_drop_on_the_contraction_axis_is_golden_on_sliced_operands():
  lhs, rhs = CALLS["dot_general"][0]
  kw = CALLS["dot_general"][1]
  for where, width in (("last", 16), ("last", 8), ("first", 32)):
    lo, hi = np_tile(40, width, where)
    keep = np.r_[0:lo, hi:40]
    want = f64(lhs)[:, keep] @ f64(rhs)[keep, :]
    got = injectors.slipped_reference(
        "dot_general", Slip("operand", "drop", arg=1, axes=(0,), where=where,
                            width=width), (lhs, rhs), kw)
    close64(got, want)


@pytest.mark.parametrize("shift", [1, -1])
@pytest.mark.parametrize("name", ["attention", "masked_attention"])
def test_mask_shift_reads_the_mask_row_of_query_i_plus_shift(name, shift):
  args, kw = CALLS[name]
  q, k = args[0], args[1]
  t, s = q.shape[1], k.shape[1]
  rows = np.clip(np.arange(t) + shift, 0, t - 1)
  if name == "attention":
    mask = (np.arange(s)[None, :] <= rows[:, None])[None, None]
  else:
    mask = np.asarray(args[3])[:, :, rows, :]
  want = peat.reference_attention(*args[:3], mask=mask)
  got = injectors.slipped_reference(
      "attention", Slip("operand", "mask_shift", shift=shift), args, kw)
  close64(got, want)
  assert rms(got - reference("attention", args, kw)) > 1e-3


# ---------------------------------------------------------------- constants


def explicit_constant(kind, param, value, args, kw):
  """The kind's float64 output with a constant set, written out."""
  a = [f64(x) if jnp.issubdtype(x.dtype, jnp.floating) else np.asarray(x)
       for x in args]
  if kind in ("layer_norm", "rms_norm"):
    x = a[0]
    n = x.shape[-1]
    eps = value if param == "eps" else kw["eps"]
    ddof = value if param == "ddof" else 0.0
    if kind == "layer_norm":
      mu = x.mean(-1, keepdims=True)
      var = ((x - mu) ** 2).sum(-1, keepdims=True) / (n - ddof)
      return (x - mu) / np.sqrt(var + eps) * a[1] + a[2]
    ms = (x ** 2).sum(-1, keepdims=True) / (n - ddof)
    off = value if param == "offset" else 0.0
    return x / np.sqrt(ms + eps) * (off + a[1])
  if kind in ("softmax", "log_softmax"):
    z = a[0] / value
    z = z - z.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    return np.exp(z - lse) if kind == "softmax" else z - lse
  if kind == "cross_entropy":
    z = a[0] / (value if param == "temperature" else 1.0)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    nll = lse - z[np.arange(len(z)), a[1]]
    alpha = value if param == "smoothing" else 0.0
    return (1 - alpha) * nll + alpha * (lse - z.mean(-1))
  if kind == "silu":
    return a[0] / (1 + np.exp(-value * a[0])) * a[1]
  if kind == "rope":
    theta = value if param == "theta" else kw["theta"]
    pos = a[1] + (value if param == "offset" else 0)
    return peat.reference_rope(args[0], pos.astype(np.int32), theta=theta)
  if kind == "attention":
    if param == "scale":
      return peat.reference_attention(*args[:3], scale=value,
                                       is_causal=True)
    q, k, v = a[:3]
    sc = np.einsum("bthd,bshd->bhts", q, np.repeat(k, 2, 2)) / math.sqrt(8)
    keep = np.tril(np.ones((6, 6), bool))
    sc = np.where(keep, sc, value)
    w = np.exp(sc - sc.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", w, np.repeat(v, 2, 2))
  raise AssertionError(kind)


CONSTANT_CASES = [
    ("layer_norm", "eps", 0.3), ("layer_norm", "ddof", 1.0),
    ("rms_norm", "eps", 0.05), ("rms_norm", "ddof", 1.0),
    ("rms_norm", "offset", 1.0), ("softmax", "temperature", 1.7),
    ("log_softmax", "temperature", 0.6), ("attention", "scale", 1.0),
    ("attention", "fill", -2.0), ("attention", "fill", 0.0),
    ("cross_entropy", "smoothing", 0.1),
    ("cross_entropy", "temperature", 1.4), ("silu", "beta", 1.702),
    ("rope", "theta", 5e5), ("rope", "offset", -1.0),
]


@pytest.mark.parametrize("kind,param,value", CONSTANT_CASES)
def test_constant_set_matches_its_explicit_form(kind, param, value):
  args, kw = CALLS[kind]
  slip = Slip("constant", "set", param=param, value=value)
  want = explicit_constant(kind, param, value, args, kw)
  close64(injectors.slipped_reference(kind, slip, args, kw), want)
  t = injectors.slipped_call(kind, slip, args, kw)
  within_rounding(t, want, t.dtype, k=16.0)


@pytest.mark.parametrize("kind,param", [(k, p) for k in PARAMETERS
                                        for p in PARAMETERS[k]])
def test_a_constant_at_its_golden_value_reproduces_golden(kind, param):
  args, kw = CALLS[kind]
  g0 = injectors.golden_value(kind, args, kw, param)
  slip = Slip("constant", "set", param=param, value=g0)
  r = reference(kind, args, kw)
  close64(injectors.slipped_reference(kind, slip, args, kw), r)
  t = injectors.slipped_call(kind, slip, args, kw)
  g = injectors.golden_call(kind, args, kw)
  assert rms(f64(t) - r) <= 2.0 * rms(f64(g) - r)


# ---------------------------------------------------------------- precision


def np_round(x, fmt, mode):
  """float64 ``x`` (float32 values) rounded to ``fmt`` in ``mode``, written
  on the float32 bits."""
  drop = {"bf16": 16, "tf32": 13, "fp16": 13}[fmt]
  u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  mask = np.uint64((1 << drop) - 1)
  if mode == "toward_zero":
    r = u & ~mask
  elif mode == "nearest_away":
    r = (u + np.uint64(1 << (drop - 1))) & ~mask
  else:
    lsb = (u >> np.uint64(drop)) & np.uint64(1)
    r = (u + np.uint64((1 << (drop - 1)) - 1) + lsb) & ~mask
  return r.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("kind,fmt,mode", [
    ("dot_general", "tf32", "nearest_even"),
    ("dot_general", "bf16", "toward_zero"),
    ("layer_norm", "bf16", "nearest_away"),
    ("softmax", "bf16", "nearest_even"),
    ("gelu", "tf32", "toward_zero"),
    ("attention", "tf32", "nearest_away")])
def test_inputs_round_every_floating_argument(kind, fmt, mode):
  args, kw = CALLS[kind]
  rounded = [jnp.asarray(np_round(a, fmt, mode)) for a in args]
  want = reference(kind, rounded, kw)
  slip = Slip("precision", "inputs", fmt=fmt, mode=mode)
  close64(injectors.slipped_reference(kind, slip, args, kw), want)
  assert rms(want - reference(kind, args, kw)) > 0


def test_inputs_fp16_match_ml_dtypes_conversion():
  args, kw = CALLS["rms_norm"]
  rounded = [jnp.asarray(np.asarray(a).astype(np.float16).astype(np.float64))
             for a in args]
  close64(injectors.slipped_reference(
      "rms_norm", Slip("precision", "inputs", fmt="fp16"), args, kw),
          reference("rms_norm", rounded, kw))


def bf16(x):
  return float(np.float64(x).astype(ml_dtypes.bfloat16))


def test_accumulate_sums_in_order_rounding_every_term_and_partial_sum():
  # Integers: every product and float64 sum exact, so the only roundings
  # are the format's.
  rng = np.random.default_rng(5)
  lhs = jnp.asarray(rng.integers(-40, 40, (3, 50)).astype(np.float32))
  rhs = jnp.asarray(rng.integers(-40, 40, (50, 4)).astype(np.float32))
  kw = {"dimension_numbers": DOT, "precision": None,
        "preferred_element_type": np.dtype(np.float32)}
  want = np.zeros((3, 4))
  for i in range(3):
    for j in range(4):
      acc = 0.0
      for k in range(50):
        acc = bf16(acc + bf16(float(lhs[i, k]) * float(rhs[k, j])))
      want[i, j] = acc
  slip = Slip("precision", "accumulate", fmt="bf16")
  np.testing.assert_array_equal(
      injectors.slipped_reference("dot_general", slip, (lhs, rhs), kw), want)
  np.testing.assert_array_equal(
      f64(injectors.slipped_call("dot_general", slip, (lhs, rhs), kw)), want)
  assert np.any(want != f64(lhs) @ f64(rhs))


def test_accumulate_rounds_a_softmax_sum_of_exponentials():
  (x,), kw = CALLS["softmax"]
  z = f64(x) - f64(x).max(-1, keepdims=True)
  e = np.exp(z)
  s = np.zeros(len(z))
  for i in range(len(z)):
    for v in e[i]:
      s[i] = float(np.float64(s[i] + np.float64(v).astype(np.float16)
                              ).astype(np.float16))
  want = e / s[:, None]
  got = injectors.slipped_reference(
      "softmax", Slip("precision", "accumulate", fmt="fp16"), (x,), kw)
  close64(got, want, tol=1e-9)
  assert rms(got - reference("softmax", (x,), kw)) > 1e-6 * rms(got)


# ----------------------------------------------------------------- blocked


@pytest.mark.parametrize("where,width,op", [("last", 16, "drop"),
                                            ("first", 8, "drop"),
                                            ("last", 32, "twice"),
                                            ("first", 16, "twice")])
def test_blocked_dot_general_is_golden_minus_or_plus_its_block(where, width,
                                                               op):
  (lhs, rhs), kw = CALLS["dot_general"]
  lo, hi = np_tile(40, width, where)
  part = f64(lhs)[:, lo:hi] @ f64(rhs)[lo:hi, :]
  want = f64(lhs) @ f64(rhs) + (-part if op == "drop" else part)
  slip = Slip("blocked", op, where=where, width=width)
  close64(injectors.slipped_reference("dot_general", slip, (lhs, rhs), kw),
          want)
  within_rounding(injectors.slipped_call("dot_general", slip, (lhs, rhs), kw),
                  want, np.float32)


def test_blocked_conv_drops_its_input_feature_block():
  (lhs, rhs), kw = CALLS["conv_general_dilated"]
  lo, hi = np_tile(20, 8, "last")
  keep = np.r_[0:lo, hi:20]
  want = peat.reference_conv(
      f64(lhs)[..., keep], f64(rhs)[:, :, keep, :], kw["window_strides"],
      kw["padding"], dimension_numbers=kw["dimension_numbers"])
  close64(injectors.slipped_reference(
      "conv_general_dilated", Slip("blocked", "drop", where="last", width=8),
      (lhs, rhs), kw), want)


def test_blocked_norm_and_softmax_sums_leave_out_the_block():
  (x, scale, bias), kw = CALLS["layer_norm"]
  xf = f64(x)
  lo, hi = np_tile(40, 16, "last")
  w = np.ones(40)
  w[lo:hi] = 0
  mu = (xf * w).sum(-1, keepdims=True) / 40
  var = (((xf - mu) ** 2) * w).sum(-1, keepdims=True) / 40
  want = (xf - mu) / np.sqrt(var + kw["eps"]) * f64(scale) + f64(bias)
  slip = Slip("blocked", "drop", where="last", width=16)
  close64(injectors.slipped_reference("layer_norm", slip, (x, scale, bias),
                                      kw), want)
  (z,), _ = CALLS["softmax"]
  e = np.exp(f64(z) - f64(z).max(-1, keepdims=True))
  want = e / (e * np.where(np.arange(40) < 32, 2.0, 1.0)).sum(-1,
                                                               keepdims=True)
  got = injectors.slipped_reference(
      "softmax", Slip("blocked", "twice", where="first", width=32), (z,), {})
  close64(got, want)


def test_blocked_attention_drops_a_key_block_from_both_sums():
  args, kw = CALLS["masked_attention"]
  for where in ("first", "last"):
    lo, hi = np_tile(10, 8, where)
    mask = np.asarray(args[3]).copy()
    mask[..., lo:hi] = False
    assert mask.any(-1).all()  # every query keeps a key
    want = peat.reference_attention(*args[:3], mask=mask)
    close64(injectors.slipped_reference(
        "attention", Slip("blocked", "drop", where=where, width=8), args,
        kw), want)


def np_norescale(z, width, values=None, where="sum"):
  """An online softmax that forgets to rescale what it carries, float64."""
  n = z.shape[-1]
  m = np.full(z.shape[:-1] + (1,), -np.inf)
  s = np.zeros_like(m)
  acc = None
  for lo in range(0, n, width):
    zb = z[..., lo:lo + width]
    mn = np.maximum(m, zb.max(-1, keepdims=True))
    alpha = np.exp(m - mn)
    p = np.exp(zb - mn)
    s = (s if where in ("sum", "both") else s * alpha) + p.sum(
        -1, keepdims=True)
    if values is not None:
      pv = p @ values[..., lo:lo + width, :]
      acc = pv if acc is None else (
          acc if where in ("acc", "both") else acc * alpha) + pv
    m = mn
  return m, s, acc


def test_norescale_differs_from_online_softmax_only_when_the_max_rises():
  rng = np.random.default_rng(7)
  z = rng.standard_normal((4, 40)) * 2
  rising = z + np.arange(40) * 0.2  # later blocks raise the max
  falling = z.copy()
  falling[:, 3] = z.max(-1) + 1.0  # the max in the first block
  slip = Slip("blocked", "norescale", where="sum", width=16)
  for data, moved in ((rising, True), (falling, False)):
    x = jnp.asarray(data.astype(np.float32))
    m, s, _ = np_norescale(f64(x), 16)
    want = np.exp(f64(x) - m) / s
    got = injectors.slipped_reference("softmax", slip, (x,), {})
    close64(got, want)
    t = injectors.slipped_call("softmax", slip, (x,), {})
    r = reference("softmax", (x,), {})
    g = injectors.golden_call("softmax", (x,), {})
    assert (rms(f64(t) - r) > 100 * rms(f64(g) - r)) == moved
    if not moved:
      assert rms(f64(t) - r) <= 4 * rms(f64(g) - r)


@pytest.mark.parametrize("where", ["sum", "acc", "both"])
def test_norescale_attention_matches_its_explicit_online_form(where):
  rng = np.random.default_rng(11)
  q = jnp.asarray(rng.standard_normal((1, 5, 1, 8)).astype(np.float32))
  k = jnp.asarray((rng.standard_normal((1, 40, 1, 8))
                   + np.linspace(0, 2, 40)[None, :, None, None]
                   ).astype(np.float32))
  v = jnp.asarray(rng.standard_normal((1, 40, 1, 8)).astype(np.float32))
  sc = np.einsum("bthd,bshd->bhts", f64(q), f64(k)) / math.sqrt(8)
  vt = np.transpose(f64(v), (0, 2, 1, 3))
  _, s, acc = np_norescale(sc, 16, vt, where)
  want = np.transpose(acc / s, (0, 2, 1, 3))
  got = injectors.slipped_reference(
      "attention", Slip("blocked", "norescale", where=where, width=16),
      (q, k, v), {})
  close64(got, want)


def test_norescale_log_softmax_and_cross_entropy_use_the_carried_sum():
  (z, labels), kw = CALLS["cross_entropy"]
  m, s, _ = np_norescale(f64(z), 16)
  lse = (m + np.log(s))[:, 0]
  slip = Slip("blocked", "norescale", where="sum", width=16)
  close64(injectors.slipped_reference("cross_entropy", slip, (z, labels),
                                      kw),
          lse - f64(z)[np.arange(6), np.asarray(labels)])
  close64(injectors.slipped_reference("log_softmax", slip, (z,), {}),
          f64(z) - m - np.log(s))


# ---------------------------------------------------------- approximations


def np_schraudolph(x):
  t = np.clip(x / np.log(2), -126, 127)
  bits = (2.0 ** 23 * (t + 127 - 0.0579848)).astype(np.int32)
  return bits.view(np.float32).astype(np.float64)


def np_poly3(x):
  t = np.clip(x / np.log(2), -126, 127)
  n = np.floor(t)
  f = t - n
  return (1 + f * (0.6960656 + f * (0.2244012 + f * 0.0795332))) * 2.0 ** n


def np_table64(x):
  t = np.clip(x / np.log(2), -126, 127)
  n = np.floor(t)
  j = (t - n) * 64
  k = np.floor(j)
  tab = 2.0 ** (np.arange(65) / 64)
  ki = k.astype(int)
  return (tab[ki] + (j - k) * (tab[ki + 1] - tab[ki])) * 2.0 ** n


def np_newton_rsqrt(v):
  i = np.asarray(v, np.float32).view(np.int32)
  y = (np.int32(0x5F3759DF) - (i >> 1)).view(np.float32).astype(np.float64)
  return y * (1.5 - 0.5 * v * y * y)


def np_newton_rcp(s):
  i = np.asarray(s, np.float32).view(np.int32)
  y = (np.int32(0x7EF311C7) - i).view(np.float32).astype(np.float64)
  return y * (2 - s * y)


def np_erf_as(z):
  a = np.abs(z)
  t = 1 / (1 + 0.3275911 * a)
  p = t * (0.254829592 + t * (-0.284496736 + t * (
      1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  return np.sign(z) * (1 - p * np.exp(-a * a))


def np_softmax(z, exp=np.exp, rcp=None):
  e = exp(z - z.max(-1, keepdims=True))
  s = e.sum(-1, keepdims=True)
  return e / s if rcp is None else e * rcp(s)


EXPS = {"exp_schraudolph": np_schraudolph, "exp_poly3": np_poly3,
        "exp_table64": np_table64}


@pytest.mark.parametrize("member", list(EXPS))
def test_fast_exps_in_softmax_and_silu(member):
  (z,), _ = CALLS["softmax"]
  slip = Slip("approximation", member)
  got = injectors.slipped_reference("softmax", slip, (z,), {})
  close64(got, np_softmax(f64(z), EXPS[member]), tol=1e-6)
  assert rms(got - reference("softmax", (z,), {})) > 1e-6 * rms(got)
  (x, up), _ = CALLS["silu"]
  close64(injectors.slipped_reference("silu", slip, (x, up), {}),
          f64(x) / (1 + EXPS[member](-f64(x))) * f64(up), tol=1e-6)


@pytest.mark.parametrize("member,form", [
    ("gelu_tanh", lambda x: 0.5 * x * (1 + np.tanh(
        math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    ("gelu_sigmoid", lambda x: x / (1 + np.exp(-1.702 * x))),
    ("erf_poly", lambda x: 0.5 * x * (1 + np_erf_as(x / math.sqrt(2)))),
])
def test_gelu_forms(member, form):
  (x,), _ = CALLS["gelu"]
  got = injectors.slipped_reference("gelu", Slip("approximation", member),
                                    (x,), {})
  close64(got, form(f64(x)))
  assert rms(got - reference("gelu", (x,), {})) > 1e-9 * rms(got)


def test_gelu_erf_replaces_the_tanh_form():
  (x,), _ = CALLS["gelu"]
  close64(injectors.slipped_reference(
      "gelu", Slip("approximation", "gelu_erf"), (x,), {"approximate": True}),
          reference("gelu", (x,), {}))


def test_hard_silu_rsqrt_and_reciprocal_members():
  (x, up), _ = CALLS["silu"]
  xf = f64(x)
  close64(injectors.slipped_reference(
      "silu", Slip("approximation", "silu_hard"), (x, up), {}),
          xf * np.clip(xf + 3, 0, 6) / 6 * f64(up))
  (x, scale), kw = CALLS["rms_norm"]
  xf = f64(x)
  ms = (xf ** 2).mean(-1, keepdims=True) + kw["eps"]
  close64(injectors.slipped_reference(
      "rms_norm", Slip("approximation", "rsqrt_newton1"), (x, scale), kw),
          xf * np_newton_rsqrt(ms) * f64(scale), tol=1e-6)
  (z,), _ = CALLS["softmax"]
  close64(injectors.slipped_reference(
      "softmax", Slip("approximation", "rcp_newton1"), (z,), {}),
          np_softmax(f64(z), rcp=np_newton_rcp), tol=1e-6)
  zf = f64(z) - f64(z).max(-1, keepdims=True)
  s = np.exp(zf).sum(-1, keepdims=True)
  close64(injectors.slipped_reference(
      "log_softmax", Slip("approximation", "rcp_newton1"), (z,), {}),
          zf + np.log(np_newton_rcp(s)), tol=1e-6)


# ------------------------------------------------------------------- bases


def test_a_slip_on_a_precision_base_rounds_first():
  (lhs, rhs), kw = CALLS["dot_general"]
  base = Slip("precision", "inputs", fmt="bf16")
  slip = Slip("blocked", "drop", where="last", width=16, base=base)
  assert slip.name == "inputs_bf16+blocked:drop:last:w16"
  a, b = np_round(lhs, "bf16", ""), np_round(rhs, "bf16", "")
  close64(injectors.slipped_reference("dot_general", slip, (lhs, rhs), kw),
          a[:, :32] @ b[:32, :])


# ------------------------------------------------------------------- errors

ERRORS = [
    ("dot_general", Slip("operand", "transpose", arg=0, axes=(0, 1)),
     "equal length"),
    ("layer_norm", Slip("blocked", "norescale", where="sum", width=8),
     "no softmax"),
    ("softmax", Slip("blocked", "norescale", where="acc", width=8),
     "only attention"),
    ("softmax", Slip("constant", "set", param="eps", value=1e-3),
     "no constant 'eps'"),
    ("layer_norm", Slip("blocked", "drop", where="last", width=64),
     "one block"),
    ("layer_norm", Slip("operand", "swap", arg=0, other=1), "differ"),
    ("gelu", Slip("approximation", "rsqrt_newton1"), "layer_norm"),
    ("gelu", Slip("blocked", "drop", where="last", width=8),
     "no reduction"),
    ("softmax", Slip("operand", "mask_shift", shift=1), "attention"),
    ("rope", Slip("constant", "set", param="offset", value=0.5), "integer"),
    ("dot_general", Slip("operand", "roll", arg=5, axes=(0,), shift=1),
     "does not exist"),
    ("dot_general", Slip("operand", "reverse", arg=0, axes=(4,)),
     "out of range"),
    ("softmax", Slip("precision", "inputs", fmt="fp32"), "unknown format"),
    ("gelu", Slip("approximation", "erf_poly"), "does not apply"),
    ("dot_general", Slip("operand", "repeat", arg=0, axes=(0,), where="last",
                         width=8), "one tile"),
    ("softmax", Slip("operand", "roll", arg=0, axes=(0, 1), shift=1),
     "one axis"),
    ("layer_norm", Slip("constant", "set", param="eps", value=math.inf),
     "finite"),
    ("dot_general", Slip("operand", "swap", arg=0, other=0), "another"),
]


@pytest.mark.parametrize("kind,slip,match", ERRORS)
def test_a_slip_that_does_not_apply_raises_naming_slip_and_kind(kind, slip,
                                                               match):
  args, kw = CALLS[kind]
  if slip.op == "erf_poly":
    kw = {"approximate": True}
  with pytest.raises(PeatError, match=match) as err:
    injectors.slipped_call(kind, slip, args, kw)
  assert kind in str(err.value) and slip.name in str(err.value)


def test_inputs_in_a_format_every_argument_fits_do_not_apply():
  args, kw = calls(0, jnp.bfloat16)["gelu"]
  with pytest.raises(PeatError, match="already bf16"):
    injectors.slipped_call("gelu", Slip("precision", "inputs", fmt="bf16"),
                           args, kw)


@pytest.mark.parametrize("slip,match", [
    (Slip("operand", "flip", arg=0, axes=(0,)), "unknown operand slip"),
    (Slip("operand", "drop", arg=0, axes=(0,), where="middle", width=8),
     "where"),
    (Slip("blocked", "drop", where="last"), "width"),
    (Slip("nope", "x"), "unknown slip category"),
    (Slip("constant", "set", param="eps", value=1.0,
          base=Slip("operand", "roll", arg=0, axes=(0,), shift=1)), "base"),
])
def test_check_slip_errors_reach_the_caller(slip, match):
  args, kw = CALLS["softmax"]
  with pytest.raises(PeatError, match=match):
    injectors.slipped_call("softmax", slip, args, kw)


def test_bad_calls_raise():
  with pytest.raises(PeatError, match="unknown site kind"):
    injectors.golden_call("matmul2", (jnp.ones(3),), {})
  with pytest.raises(PeatError, match="dtype"):
    injectors.draw_call(np.random.default_rng(0), "softmax", jnp.int32)
  with pytest.raises(PeatError, match="unknown slip categories"):
    injectors.draw_slip(np.random.default_rng(0), "softmax",
                        *CALLS["softmax"], categories=["operands"])
  with pytest.raises(PeatError, match="applies"):
    injectors.draw_slip(np.random.default_rng(0), "gelu", *CALLS["gelu"],
                        categories=["blocked"])


# -------------------------------------------------------------------- draws


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_drawn_calls_and_slips_apply(kind, dtype):
  rng = np.random.default_rng(zlib.crc32(f"{kind}{dtype}".encode()))
  args, kw = injectors.draw_call(rng, kind, dtype)
  floats = [a for a in jax.tree.leaves(args) if jnp.issubdtype(
      a.dtype, jnp.floating)]
  assert floats[0].dtype == dtype
  assert all(np.all(np.asarray(a, np.float32) != 0) for a in floats)
  g = injectors.golden_call(kind, args, kw)
  for _ in range(2):
    slip = injectors.draw_slip(rng, kind, args, kw)
    peat.core.check_slip(slip)
    t = injectors.slipped_call(kind, slip, args, kw)
    assert t.shape == g.shape and t.dtype == g.dtype, slip


def test_draws_cover_the_grammar_and_respect_categories():
  rng = np.random.default_rng(0)
  args, kw = CALLS["masked_attention"]
  seen, bases = set(), 0
  for _ in range(300):
    slip = injectors.draw_slip(rng, "attention", args, kw)
    seen.add((slip.category, slip.op))
    bases += slip.base is not None
  assert {c for c, _ in seen} == {"operand", "constant", "precision",
                                  "blocked", "approximation"}
  assert {("blocked", "norescale"), ("operand", "mask_shift"),
          ("precision", "accumulate")} <= seen
  assert 5 <= bases <= 60
  for _ in range(20):
    slip = injectors.draw_slip(rng, "layer_norm", *CALLS["layer_norm"],
                               categories=["constant"])
    assert slip.category == "constant" and slip.param in ("eps", "ddof")
    if slip.param == "eps":
      assert 1e-12 <= slip.value <= 1e-1 and not (
          0.5 < slip.value / 1e-5 < 2)


def test_a_shape_seed_shares_the_shape_with_fresh_values():
  rng = np.random.default_rng(1)
  a, kw_a = injectors.draw_call(rng, "attention", jnp.float32, shape_seed=4)
  b, kw_b = injectors.draw_call(rng, "attention", jnp.float32, shape_seed=4)
  assert [x.shape for x in a] == [x.shape for x in b] and kw_a == kw_b
  assert not np.array_equal(np.asarray(a[0]), np.asarray(b[0]))


def test_draw_slip_cases_share_shapes_and_are_seeded():
  kw = dict(calls=2, kinds=["softmax", "layer_norm", "gelu"],
            dtypes=["float32"], controls=0.3)
  a = injectors.draw_slip_cases(5, 12, **kw)
  b = injectors.draw_slip_cases(5, 12, **kw)
  assert len(a) == 12 and {c.call for c in a} <= {0, 1}
  for x, y in zip(a, b):
    assert (x.kind, x.slip) == (y.kind, y.slip)
    np.testing.assert_array_equal(np.asarray(x.args[0]),
                                  np.asarray(y.args[0]))
  by_call = {}
  for c in a:
    by_call.setdefault(c.call, set()).add((c.kind, c.args[0].shape))
  assert all(len(v) == 1 for v in by_call.values())
  assert any(c.slip is None for c in a) and any(c.slip for c in a)
  only = injectors.draw_slip_cases(1, 6, kinds=["softmax"],
                                   dtypes=["bfloat16"], controls=0.0,
                                   categories=["blocked"])
  assert all(c.slip.category == "blocked" and c.dtype == jnp.bfloat16
             for c in only)


# ------------------------------------------------------------- visibility


def test_visibility_follows_the_output_format():
  (x,), _ = CALLS["softmax"]
  small = Slip("constant", "set", param="temperature", value=1.001)
  vis32 = injectors.slip_visibility("softmax", small, (x,), {})
  assert vis32.visible and vis32.rms_ratio >= injectors._slips.VISIBLE_RMS
  xb = x.astype(jnp.bfloat16)
  vis16 = injectors.slip_visibility("softmax", small, (xb,), {})
  assert not vis16.visible and vis16.rms_ratio < 4
  big = Slip("constant", "set", param="temperature", value=1.5)
  assert injectors.slip_visibility("softmax", big, (xb,), {}).visible
  assert not injectors.slip_visibility("softmax", None, (x,), {}).visible


def test_an_eps_change_far_below_the_variance_is_invisible():
  args, kw = CALLS["layer_norm"]
  tiny = Slip("constant", "set", param="eps", value=1.0001e-5)
  vis = injectors.slip_visibility("layer_norm", tiny, args, kw)
  assert not vis.visible and vis.rms_ratio < 2
  big = Slip("constant", "set", param="eps", value=0.5)
  assert injectors.slip_visibility("layer_norm", big, args, kw).visible


def test_a_slip_on_a_base_is_visible_only_beyond_its_base():
  args, kw = CALLS["layer_norm"]
  base = Slip("precision", "inputs", fmt="bf16")
  tiny = Slip("constant", "set", param="eps", value=1.0001e-5, base=base)
  vis = injectors.slip_visibility("layer_norm", tiny, args, kw)
  assert vis.rms_ratio > 16 and vis.over_base[0] < 2 and not vis.visible
  big = tiny._replace(value=0.5)
  vis = injectors.slip_visibility("layer_norm", big, args, kw)
  assert vis.visible and vis.over_base[0] > 16
  assert injectors.slip_visibility("layer_norm", big._replace(base=None),
                                   args, kw).over_base is None


def test_a_structural_slip_is_read_where_it_moves_the_output():
  (x,), _ = CALLS["softmax"]
  row = Slip("operand", "drop", arg=0, axes=(0,), where="first", width=1)
  vis = injectors.slip_visibility("softmax", row, (x,), {})
  assert vis.visible and vis.read == 40  # the one row it moves
  args, kw = CALLS["cross_entropy"]
  one = Slip("operand", "drop", arg=1, axes=(0,), where="last", width=1)
  vis = injectors.slip_visibility("cross_entropy", one, args, kw)
  # One example of six moves: fewer than PROBE_MIN, so the probe reads
  # every element, and the median of them is unmoved.
  assert vis.rms_ratio > 16 and not vis.visible
  # Three of six: half is no majority (the probe's median ratio would be
  # halfway between explained and not).
  half = Slip("operand", "roll", arg=1, axes=(0,), shift=1)
  labels = jnp.asarray([3, 3, 3, 5, 5, 7], jnp.int32)  # rolled: 3 move
  vis = injectors.slip_visibility("cross_entropy", half, (args[0], labels),
                                  kw)
  assert vis.read == 6 and not vis.visible
  four = jnp.asarray([3, 3, 5, 9, 11, 13], jnp.int32)  # rolled: 5 move
  assert injectors.slip_visibility("cross_entropy", half, (args[0], four),
                                   kw).visible


def test_names_slip_accepts_a_format_that_rounds_alike():
  args, kw = CALLS["rms_norm"]
  tf32 = Slip("precision", "inputs", fmt="tf32")
  names = lambda a, model, **k: injectors.names_slip("rms_norm", tf32, a, kw,
                                                     model, **k)
  assert names(args, "precision:tf32") == "model"
  # |x| inside fp16's normal range: tf32 and fp16 round alike.
  assert names(args, "precision:fp16") == "equivalent"
  assert names(args, "precision:bf16") == ""
  assert names(args, "accumulation:tf32") == ""
  tiny = [args[0] * 1e-6, args[1]]  # fp16 subnormals: no longer alike
  assert names(tiny, "precision:fp16") == ""
  roll = Slip("operand", "roll", arg=0, axes=(1,), shift=1)
  assert injectors.names_slip("rms_norm", roll, args, kw, "indexing")
  assert not injectors.names_slip("rms_norm", roll, args, kw, "parameter")


def test_names_slip_reads_the_slip_the_search_names():
  args, kw = CALLS["rms_norm"]
  tf32 = Slip("precision", "inputs", fmt="tf32", mode="toward_zero")
  names = lambda model, **k: injectors.names_slip("rms_norm", tf32, args, kw,
                                                  model, **k)
  assert names("precision:fp16", named="inputs_fp16_toward_zero") == (
      "equivalent")
  # A name of another model than the one named is not read.
  assert names("parameter", named="inputs_fp16_toward_zero") == ""
  # Nested truncations agree on most elements (the median ratio cannot
  # tell them apart) but differ visibly on the rest: not one slip.
  (x,), _ = CALLS["softmax"]
  e5m2 = Slip("precision", "inputs", fmt="fp8_e5m2", mode="toward_zero")
  assert injectors.names_slip("softmax", e5m2, (x,), {},
                              "precision:fp8_e4m3") == ""
  # Consecutive positions rolled by one are positions offset by one but
  # at the wrapped token, where they differ visibly.
  args, kw = CALLS["rope"]
  roll = Slip("operand", "roll", arg=1, axes=(0,), shift=1)
  for est in (-1.0, 2.0, None):
    assert injectors.names_slip("rope", roll, args, kw, "parameter",
                                named="offset", estimate=est) == ""


def test_slip_names_parse_back_to_their_slips():
  rng = np.random.default_rng(2)
  seen = 0
  for name, (args, kw) in CALLS.items():
    for _ in range(12):
      slip = injectors.draw_slip(rng, kind_of(name), args, kw)
      back = injectors.slip_from_name(slip.name, slip.value)
      assert back is not None and back.name == slip.name, slip
      assert back._replace(value=0.0) == slip._replace(
          value=0.0, mode=slip.mode or (
              "nearest_even" if slip.op == "inputs" else "")), slip
      seen += 1
  assert seen == 12 * len(CALLS)
  for bad in ("operand:roll:0:x:+1", "blocked:drop:last", "inputs_fp7",
              "acc_bf16+acc_bf16+acc_bf16", "eps2", "", "operand:spin:0:1"):
    assert injectors.slip_from_name(bad) is None, bad


def test_slipped_kernel_is_a_kut_with_the_kinds_signature():
  args, kw = CALLS["layer_norm"]
  slip = Slip("constant", "set", param="eps", value=0.1)
  kut = injectors.slipped_kernel("layer_norm", slip)
  np.testing.assert_array_equal(
      np.asarray(kut(*args, **kw)),
      np.asarray(injectors.slipped_call("layer_norm", slip, args, kw)))
