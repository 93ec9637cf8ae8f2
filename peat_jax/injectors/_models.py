"""Tensor-level fault injectors, one per error model, and their registry.

Each injector is a pure function ``fn(key, x, **params) -> x'`` of a PRNG key
and a floating array; ``params`` are static (Python values checked by
``_inject_params``). Elements are chosen with the key, so an injection is
deterministic given the key and replays bitwise. Shape-changing choices (how
many elements, which tile size) are static; where they go is drawn.

Most injectors are a *selection* (which elements: a count, a share, a lane of
a stride, rows, tiles) and an *effect* (what happens to a chosen element:
bits flipped, a bit forced, a random value, zero, NaN/Inf, a scale). The
``lane`` model combines a periodic selection with any effect.
"""

import functools
import math
import statistics
from typing import Any, Callable, Mapping, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from peat_jax.injectors import _rounding as fm
from peat_jax.injectors._dense_models import (
    _approximation, _ftz, _parameter, _precision, _saturation, _truncation)
from peat_jax.injectors import _params as pp
from peat_jax.injectors import _random as rnd
from peat_jax.core import PeatError

# ---------------------------------------------------------------------------
# Selections.


_SELECT, _EFFECT = 1, 2  # random streams of a selection and of an effect


_FEW = 4096  # up to this many elements are drawn one by one


def _choose(key: jax.Array, n: int, k: int) -> jax.Array:
  """``k`` distinct flat indices out of ``n``, uniformly, in random order.

  Up to ``_FEW`` elements (the usual sparse fault) are drawn one by one, each
  uniformly among the indices not drawn yet, at a cost independent of ``n``
  (about k^2 integer operations); more take a sort of ``n`` random ranks.
  Integer arithmetic only, so the choice is bitwise the same in every
  compiled program.
  """
  if k >= n:
    return jnp.arange(n, dtype=jnp.int32)
  if k > _FEW:
    return jnp.argsort(rnd.bits32(key, _SELECT, (n,)))[:k].astype(jnp.int32)
  r = rnd.bits32(key, _SELECT, (k,))
  sentinel = jnp.uint32(n + k)  # above every index: never counted

  def draw(j, chosen):
    v = r[j] % (jnp.uint32(n) - j.astype(jnp.uint32))
    # The v-th index not taken yet: the least w with w = v + #{taken <= w}.
    step = lambda w: v + jnp.sum(chosen <= w, dtype=jnp.uint32)
    w = lax.while_loop(lambda ww: step(ww) != ww, step, v)
    return chosen.at[j].set(w)

  chosen = lax.fori_loop(0, k, draw, jnp.full((k,), sentinel))
  return chosen.astype(jnp.int32)


def _bernoulli_mask(key: jax.Array, shape, share: float) -> jax.Array:
  """Each element independently with probability ``share`` (2^-32 steps)."""
  if share >= 1.0:
    return jnp.ones(shape, bool)
  thr = jnp.uint32(min(int(round(share * 2.0**32)), 2**32 - 1))
  return rnd.bits32(key, _SELECT, shape) < thr


def _apply_at(x: jax.Array, idx: jax.Array, effect: Callable, key: jax.Array
              ) -> jax.Array:
  flat = x.reshape(-1)
  return flat.at[idx].set(effect(key, flat[idx])).reshape(x.shape)


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int]:
  """(rows, columns) of ``shape`` seen as a matrix: last axis is columns."""
  if len(shape) == 0:
    return 1, 1
  return math.prod(shape[:-1]), shape[-1]


# ---------------------------------------------------------------------------
# Effects: (key, vals, **effect params) -> vals, elementwise, any shape.


_WEIGHT_TOTAL = 1 << 20  # bit probabilities are quantized to 2^-20


def _bit_weights(dtype, field_weights) -> np.ndarray:
  """Integer weight of each bit position (index = bit number), sum ~2^20."""
  width = fm.bit_width(dtype)
  e, m = fm.fields(dtype)
  if field_weights is None:
    w = np.ones(width)
  else:
    ws, we, wm = field_weights
    w = np.concatenate([np.full(m, wm / m), np.full(e, we / e), [ws]])
  q = np.round(w / w.sum() * _WEIGHT_TOTAL).astype(np.int64)
  q[(q == 0) & (w > 0)] = 1
  return q.astype(np.int32)


def bit_probabilities(dtype, field_weights=None) -> np.ndarray:
  """Probability of each bit position (0 = last mantissa bit) for bitflip.

  Args:
    dtype: float dtype of the data.
    field_weights: None (every bit equally likely) or (sign, exponent,
      mantissa) weights; within a field bits are equally likely.

  Returns:
    A float64 array of length ``bit width`` summing to 1 (the probabilities
    ``bitflip`` uses, quantized to multiples of about 2^-20).
  """
  q = _bit_weights(dtype, field_weights).astype(np.float64)
  return q / q.sum()


def _effect_bitflip(key, v, *, bits, bits_per_element, field_weights):
  u = fm.to_bits(v)
  ut = u.dtype
  if bits is not None:
    mask = 0
    for b in bits:
      mask |= 1 << b
    return fm.from_bits(u ^ jnp.asarray(mask, ut), v.dtype)
  # Draw bits_per_element distinct positions per element, each draw from the
  # remaining positions in proportion to their weights. Integer arithmetic
  # only, so the draw is bitwise the same in every compiled program.
  w = jnp.broadcast_to(jnp.asarray(_bit_weights(v.dtype, field_weights)),
                       v.shape + (fm.bit_width(v.dtype),))
  masks = jnp.zeros(v.shape, ut)
  for j in range(bits_per_element):
    cdf = jnp.cumsum(w, axis=-1)
    r = (rnd.bits32(key, _EFFECT + j, v.shape) % cdf[..., -1].astype(
        jnp.uint32)).astype(jnp.int32)
    pos = jnp.sum(cdf <= r[..., None], axis=-1)
    masks = masks | jnp.left_shift(jnp.ones((), ut), pos.astype(ut))
    w = jnp.where(jnp.arange(w.shape[-1]) == pos[..., None], 0, w)
  return fm.from_bits(u ^ masks, v.dtype)


def _effect_stuck_at(key, v, *, bit, value):
  del key
  u = fm.to_bits(v)
  one = jnp.asarray(1 << bit, u.dtype)
  u = (u | one) if value else (u & ~one)
  return fm.from_bits(u, v.dtype)


_NORMAL_BITS = 14


@functools.lru_cache(maxsize=None)
def _normal_table() -> np.ndarray:
  """Standard normal quantiles at (i + 0.5) / 2^14, float32."""
  inv = statistics.NormalDist().inv_cdf
  n = 1 << _NORMAL_BITS
  return np.array([inv((i + 0.5) / n) for i in range(n)], np.float32)


def _effect_random_value(key, v, *, mode, scale):
  if mode == "normal":
    # A table lookup, not Box-Muller: bitwise equal in every compiled program.
    z = jnp.asarray(_normal_table())[
        rnd.bits32(key, _EFFECT, v.shape) >> (32 - _NORMAL_BITS)]
    return (z * np.float32(scale)).astype(v.dtype)
  ut = fm.uint_dtype(v.dtype)
  e, m = fm.fields(v.dtype)
  r = rnd.bits32(key, _EFFECT, v.shape)
  if ut.itemsize == 2:
    r = (r >> 16).astype(ut)
  elif ut.itemsize == 8:
    r = (r.astype(ut) << 32) | rnd.bits32(key, _EFFECT + 1, v.shape).astype(ut)
  exp_mask = jnp.asarray(((1 << e) - 1) << m, ut)
  top_exp = jnp.asarray(1 << (e + m - 1), ut)
  r = jnp.where((r & exp_mask) == exp_mask, r & ~top_exp, r)  # keep finite
  return fm.from_bits(r, v.dtype)


def _effect_zero(key, v):
  del key
  return jnp.zeros_like(v)


def _effect_nan(key, v, *, kind):
  if kind == "nan":
    return jnp.full_like(v, jnp.nan)
  if kind == "+inf":
    return jnp.full_like(v, jnp.inf)
  if kind == "-inf":
    return jnp.full_like(v, -jnp.inf)
  sign = rnd.bernoulli_half(key, _EFFECT, v.shape)
  return jnp.where(sign, jnp.inf, -jnp.inf).astype(v.dtype)


def _effect_scale(key, v, *, factor):
  del key
  return (v.astype(fm.working_dtype(v.dtype)) * factor).astype(v.dtype)


def _effect_ulp(key, v, *, ulps):
  """Moves each value by +-``ulps`` units in the last place (random sign)."""
  u = fm.to_bits(v)
  ut = u.dtype
  width = fm.bit_width(v.dtype)
  sign_bit = jnp.asarray(1 << (width - 1), ut)
  mag = u & ~sign_bit
  step = jnp.asarray(ulps, ut)
  down = rnd.bernoulli_half(key, _EFFECT, v.shape) & (mag >= step)
  new = jnp.where(down, u - step, u + step)
  ok = jnp.isfinite(v) & (mag != 0) & jnp.isfinite(fm.from_bits(new, v.dtype))
  return jnp.where(ok, fm.from_bits(new, v.dtype), v)


# ---------------------------------------------------------------------------
# Parameter specs.

_COUNT = pp.integer(1, doc="number of elements hit", default=1)

EFFECT_SPECS: dict[str, dict[str, pp.Param]] = {
    "bitflip": {
        "bits": pp.int_tuple(lo=0, none_ok=True, default=None,
                             doc="bit positions flipped in every hit element;"
                             " None draws them"),
        "bits_per_element": pp.integer(1, doc="distinct bits drawn per hit "
                                       "element", default=1),
        "field_weights": pp.weights3(default=None,
                                     doc="(sign, exponent, mantissa) weights "
                                     "of drawn bits; None: every bit alike"),
    },
    "stuck_at": {
        "bit": pp.integer(0, doc="the stuck bit position"),
        "value": pp.integer(0, 1, doc="polarity: 0 or 1", default=1),
    },
    "random_value": {
        "mode": pp.choice(("bits", "normal"), default="bits",
                          doc="'bits': a random finite bit pattern; "
                          "'normal': N(0, scale^2)"),
        "scale": pp.real(0.0, lo_open=True, default=1.0,
                         doc="standard deviation for mode='normal'"),
    },
    "zero": {},
    "nan": {
        "kind": pp.choice(("nan", "inf", "+inf", "-inf"), default="nan",
                          doc="'inf' draws the sign per element"),
    },
    "scale": {
        "factor": pp.real(default=2.0, doc="the constant multiplier"),
    },
}

_EFFECTS = {
    "bitflip": _effect_bitflip,
    "stuck_at": _effect_stuck_at,
    "random_value": _effect_random_value,
    "zero": _effect_zero,
    "nan": _effect_nan,
    "scale": _effect_scale,
}

_FMT_NAMES = tuple(sorted(fm.FORMATS))


class Model(NamedTuple):
  """One error model's tensor injector.

  Attributes:
    name: the error-model name.
    spec: parameter name to ``Param``.
    fn: ``fn(key, x, **params) -> x'``.
    check: ``check(shape, dtype, params)`` raising PeatError where params do
      not fit the data (a bit beyond the width, more elements than exist).
    summary: one line for listings.
  """

  name: str
  spec: Mapping[str, pp.Param]
  fn: Callable
  check: Callable
  summary: str


def _no_check(shape, dtype, p):
  del shape, dtype, p


def _check_count(what):
  def check(shape, dtype, p):
    n = math.prod(shape)
    if p.get("count") is not None and p["count"] > n:
      raise PeatError(f"{what}: parameter 'count' expected <= {n} (the "
                      f"number of elements), got {p['count']}.")
  return check


def _check_effect(name, shape, dtype, p):
  width = fm.bit_width(dtype)
  if name == "bitflip":
    if p["bits"] is not None and max(p["bits"]) >= width:
      raise PeatError(f"bitflip: parameter 'bits' expected positions < "
                      f"{width} for {np.dtype(dtype).name}, got {p['bits']}.")
    if p["bits"] is not None and (p["bits_per_element"] != 1
                                  or p["field_weights"] is not None):
      raise PeatError("bitflip: 'bits_per_element' and 'field_weights' "
                      "expected at their defaults when 'bits' is given (the "
                      f"given bits {p['bits']} are all flipped), got "
                      f"bits_per_element={p['bits_per_element']}, "
                      f"field_weights={p['field_weights']}.")
    nz = int((_bit_weights(dtype, p["field_weights"]) > 0).sum())
    if p["bits"] is None and p["bits_per_element"] > nz:
      raise PeatError(f"bitflip: parameter 'bits_per_element' expected <= "
                      f"{nz} (bits with positive weight), got "
                      f"{p['bits_per_element']}.")
  if name == "stuck_at" and p["bit"] >= width:
    raise PeatError(f"stuck_at: parameter 'bit' expected < {width} for "
                    f"{np.dtype(dtype).name}, got {p['bit']}.")


# ---------------------------------------------------------------------------
# Injectors.


def _effect_params(name, p):
  return {k: p[k] for k in EFFECT_SPECS[name]}


def _counted(name):
  """Injector: ``count`` random elements get the effect ``name``."""

  def fn(key, x, **p):
    idx = _choose(key, x.size, p["count"])
    eff = lambda k, v: _EFFECTS[name](k, v, **_effect_params(name, p))
    return _apply_at(x, idx, eff, key)

  def check(shape, dtype, p):
    _check_count(name)(shape, dtype, p)
    _check_effect(name, shape, dtype, p)

  return fn, check


def _stuck_at(key, x, **p):
  hit = _bernoulli_mask(key, x.shape, p["share"])
  return jnp.where(hit, _effect_stuck_at(key, x, bit=p["bit"],
                                         value=p["value"]), x)


def _zero(key, x, *, mode, count, tile):
  if mode == "elements":
    return _apply_at(x, _choose(key, x.size, count), _effect_zero, key)
  r, c = _as_2d(x.shape)
  x2 = x.reshape(r, c)
  if mode == "rows":
    hit = jnp.zeros((r,), bool).at[_choose(key, r, count)].set(True)
    return jnp.where(hit[:, None], 0, x2).astype(x.dtype).reshape(x.shape)
  th, tw = tile
  gr, gc = -(-r // th), -(-c // tw)
  hit = jnp.zeros((gr * gc,), bool).at[_choose(key, gr * gc, count)].set(True)
  hit = hit.reshape(gr, gc)
  rows = np.arange(r) // th
  cols = np.arange(c) // tw
  mask = hit[rows[:, None], cols[None, :]]
  return jnp.where(mask, 0, x2).astype(x.dtype).reshape(x.shape)


def _check_zero(shape, dtype, p):
  del dtype
  r, c = _as_2d(shape)
  if p["mode"] == "elements":
    units, what = math.prod(shape), "elements"
  elif p["mode"] == "rows":
    units, what = r, "rows (product of all axes but the last)"
  else:
    th, tw = p["tile"]
    units = -(-r // th) * -(-c // tw)
    what = f"tiles of {th}x{tw}"
  if p["count"] > units:
    raise PeatError(f"zero: parameter 'count' expected <= {units} ({what}), "
                    f"got {p['count']}.")


def _lane_indices(shape, stride, lane, axis) -> np.ndarray:
  n = math.prod(shape)
  if axis is None:
    return np.arange(lane, n, stride)
  pos = np.indices(shape)[axis].reshape(-1)
  return np.nonzero(pos % stride == lane)[0]


def _lane(key, x, *, stride, lane, axis, effect, **effect_params):
  idx = jnp.asarray(_lane_indices(x.shape, stride, lane, axis))
  eff = lambda k, v: _EFFECTS[effect](k, v, **effect_params)
  return _apply_at(x, idx, eff, key)


def _check_lane(shape, dtype, p):
  if p["lane"] >= p["stride"]:
    raise PeatError(f"lane: parameter 'lane' expected < stride "
                    f"({p['stride']}), got {p['lane']}.")
  if p["axis"] is not None and not -len(shape) <= p["axis"] < len(shape):
    raise PeatError(f"lane: parameter 'axis' expected an axis of an array "
                    f"of shape {shape}, got {p['axis']}.")
  if len(_lane_indices(shape, p["stride"], p["lane"], p["axis"])) == 0:
    raise PeatError(f"lane: lane {p['lane']} of stride {p['stride']} holds "
                    f"no element of an array of shape {shape}.")
  ep = {k: v for k, v in p.items() if k in EFFECT_SPECS[p["effect"]]}
  _check_effect(p["effect"], shape, dtype, ep)


def _indexing(key, x, *, mode, shift, axis, tile, count):
  if mode == "shift":
    return jnp.roll(x, shift, axis=axis)
  if mode == "transpose":
    # What a kernel that writes its result column-major produces: the
    # transposed values laid out in the original shape.
    return jnp.swapaxes(x, -1, -2).reshape(x.shape)
  if mode == "permutation":
    idx = (rnd.permutation(key, _SELECT, x.size) if count is None
           else _choose(key, x.size, count))
    flat = x.reshape(-1)
    return flat.at[idx].set(flat[jnp.roll(idx, 1)]).reshape(x.shape)
  # tile_swap: two distinct full tiles exchange their contents.
  r, c = _as_2d(x.shape)
  th, tw = tile
  gr, gc = r // th, c // tw
  ab = _choose(key, gr * gc, 2)
  x2 = x.reshape(r, c)
  ra, ca = (ab[0] // gc) * th, (ab[0] % gc) * tw
  rb, cb = (ab[1] // gc) * th, (ab[1] % gc) * tw
  ta = lax.dynamic_slice(x2, (ra, ca), (th, tw))
  tb = lax.dynamic_slice(x2, (rb, cb), (th, tw))
  x2 = lax.dynamic_update_slice(x2, tb, (ra, ca))
  x2 = lax.dynamic_update_slice(x2, ta, (rb, cb))
  return x2.reshape(x.shape)


def _check_indexing(shape, dtype, p):
  del dtype
  mode = p["mode"]
  if mode == "shift" and not -len(shape) <= p["axis"] < len(shape):
    raise PeatError(f"indexing: parameter 'axis' expected an axis of an "
                    f"array of shape {shape}, got {p['axis']}.")
  if mode == "transpose" and len(shape) < 2:
    raise PeatError(f"indexing: mode 'transpose' expected an array with at "
                    f"least 2 axes, got shape {shape}.")
  if mode == "tile_swap":
    r, c = _as_2d(shape)
    th, tw = p["tile"]
    if (r // th) * (c // tw) < 2:
      raise PeatError(f"indexing: mode 'tile_swap' expected at least two "
                      f"full {th}x{tw} tiles in a {r}x{c} matrix, got "
                      f"{(r // th) * (c // tw)}; choose a smaller 'tile'.")
  if mode == "permutation":
    n = math.prod(shape)
    if p["count"] is not None and not 2 <= p["count"] <= n:
      raise PeatError(f"indexing: parameter 'count' expected 2..{n} or "
                      f"None, got {p['count']}.")


def _scale(key, x, *, factor):
  return _effect_scale(key, x, factor=factor)


def _rounding_noise(key, x, *, share, ulps):
  hit = _bernoulli_mask(key, x.shape, share)
  return jnp.where(hit, _effect_ulp(key, x, ulps=ulps), x)


def _exact(key, x):
  del key
  return x


_NOISE_SPEC = {
    "share": pp.real(0.0, 1.0, lo_open=True, default=0.25,
                     doc="probability that an element moves"),
    "ulps": pp.integer(1, doc="units in the last place moved", default=1),
}


def _build_registry() -> dict[str, Model]:
  reg = {}

  def add(name, spec, fn, check, summary):
    reg[name] = Model(name, spec, fn, check, summary)

  add("exact", {}, _exact, _no_check, "identity (a control: no error)")
  for name, summary in (
      ("bitflip", "flip bits of `count` random elements"),
      ("random_value", "replace `count` random elements by unrelated values"),
      ("nan", "set `count` random elements to NaN or +-Inf"),
  ):
    fn, check = _counted(name)
    add(name, {"count": _COUNT, **EFFECT_SPECS[name]}, fn, check, summary)
  add("stuck_at", {
      **EFFECT_SPECS["stuck_at"],
      "share": pp.real(0.0, 1.0, lo_open=True, default=1.0,
                       doc="probability that an element's bit is stuck"),
  }, _stuck_at, lambda s, d, p: _check_effect("stuck_at", s, d, p),
      "force one bit to 0 or 1 in a share of the elements")
  add("zero", {
      "mode": pp.choice(("elements", "rows", "tiles"), default="elements",
                        doc="what is left zero"),
      "count": pp.integer(1, doc="number of elements, rows or tiles",
                          default=1),
      "tile": pp.int_tuple(2, 1, default=(8, 8),
                           doc="(rows, columns) of a tile, mode='tiles'"),
  }, _zero, _check_zero, "zero elements, rows or tiles (missed writes)")
  lane_spec = {
      "stride": pp.integer(1, default=32, doc="period of the lanes"),
      "lane": pp.integer(0, default=0, doc="the corrupted lane, < stride"),
      "axis": pp.integer(none_ok=True, default=None,
                         doc="axis whose index is taken modulo stride; None: "
                         "the flat (memory) index"),
      "effect": pp.choice(tuple(_EFFECTS), default="zero",
                          doc="what happens in the lane (an effect name)"),
  }
  add("lane", lane_spec, _lane, _check_lane,
      "corrupt every element of one lane of a stride")
  add("indexing", {
      "mode": pp.choice(("shift", "transpose", "tile_swap", "permutation"),
                        default="shift", doc="how values are misplaced"),
      "shift": pp.integer(default=1, doc="roll amount, mode='shift'"),
      "axis": pp.integer(default=-1, doc="rolled axis, mode='shift'"),
      "tile": pp.int_tuple(2, 1, default=(8, 8),
                           doc="tile size, mode='tile_swap'"),
      "count": pp.integer(2, none_ok=True, default=None,
                          doc="elements cyclically permuted, "
                          "mode='permutation'; None: all"),
  }, _indexing, _check_indexing, "golden values in the wrong places")
  add("scale", EFFECT_SPECS["scale"], _scale, _no_check,
      "multiply every element by a constant")
  add("saturation", {
      "fmt": pp.choice(_FMT_NAMES, default="fp16",
                       doc="format whose max is the limit"),
      "max_value": pp.real(0.0, lo_open=True, none_ok=True, default=None,
                           doc="explicit limit; overrides fmt"),
      "mode": pp.choice(("clip", "inf"), default="clip",
                        doc="'clip' to +-limit or overflow to +-Inf"),
  }, _saturation, _no_check, "clip at a format's max or overflow to Inf")
  add("ftz", {
      "fmt": pp.choice(_FMT_NAMES + (None,), default=None,
                       doc="flush below this format's smallest normal; None: "
                       "the data's own format"),
  }, _ftz, _no_check, "flush subnormals to (signed) zero")
  add("truncation", {
      "fmt": pp.choice(_FMT_NAMES, default="bf16",
                       doc="format rounded into, toward zero"),
  }, _truncation, _no_check, "round toward zero into a format")
  for f in _FMT_NAMES:
    add(f"precision:{f}", {
        "saturate": pp.choice((False, True), default=False,
                              doc="clip to the format's max before "
                              "rounding (a saturating conversion)"),
    }, _precision(f), _no_check, f"round to nearest {f}")
  add("parameter", {
      "delta": pp.real(-0.5, 0.5, default=1e-3,
                       doc="relative change of a row of mean size"),
  }, _parameter, _no_check,
      "scale each row by its own factor, larger on small rows (the "
      "output pattern of another normalization constant)")
  add("approximation", {
      "rel": pp.real(0.0, 0.1, lo_open=True, default=1e-3,
                     doc="largest relative error"),
  }, _approximation, _no_check,
      "a smooth, bounded relative error that is a function of the value "
      "(the output pattern of another closed form)")
  add("reordering", _NOISE_SPEC, _rounding_noise, _no_check,
      "tensor form: +-1 ulp noise on a share of the elements")
  add("nondeterminism", _NOISE_SPEC, _rounding_noise, _no_check,
      "tensor form: key-dependent +-1 ulp noise on a share of the elements")
  return reg


TENSOR_MODELS: dict[str, Model] = _build_registry()


def lane_spec_for(effect: str) -> dict[str, pp.Param]:
  """The full parameter spec of ``lane`` with ``effect``."""
  return {**TENSOR_MODELS["lane"].spec, **EFFECT_SPECS[effect]}


def validate_tensor_params(name: str, given: Mapping[str, Any]
                           ) -> dict[str, Any]:
  """Validates the params of tensor model ``name`` (shape-free checks)."""
  model = TENSOR_MODELS[name]
  what = f"inject({name!r})"
  if name == "lane":
    effect = pp.validate(what, {"effect": model.spec["effect"]},
                         {k: v for k, v in given.items() if k == "effect"}
                         )["effect"]
    return pp.validate(what, lane_spec_for(effect), given)
  return pp.validate(what, model.spec, given)
