"""The Detector: which error model explains a signature, with evidence.

Each rule is a *sufficient condition* on a :class:`~peat_jax.Signature`
(docs/detector.md lists them with their derivations): when it holds, the
named error model explains the pseudo-error. Thresholds come from
floating-point facts, not from tuning:

* ``u(fmt)``, the unit roundoff of a format (``2**-p`` with ``p`` the
  significand precision including the implicit bit): float32 ``2**-24``,
  bf16 ``2**-8``, fp16 and tf32 ``2**-11``, fp8_e4m3 ``2**-4``, fp8_e5m2
  ``2**-3``. Rounding to nearest into ``fmt`` has relative error ``<= u``;
  round toward zero has ``< 2u`` and is one-signed.
* Rounding noise of another summation order is unbiased (about as many
  positive as negative errors) and within a small multiple of the golden
  kernel's own distance to the float64 reference (the noise floor).
* Faults (bit flips, stuck bits, wrong values, missed writes, wrong
  indices) leave exact structural traces: single bit positions in the XOR of
  the bit patterns, a single polarity, periodic positions, bit patterns of
  the golden output found elsewhere, a constant ratio.

Rules run from the most specific (exact relations) to the least specific
(statistical noise levels); every rule that holds yields a
:class:`Candidate`, the candidates are ranked by confidence, and the first
is the diagnosis.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.core._errors import PeatError

#: Unit roundoff (2**-precision) of the formats the Detector knows.
UNIT_ROUNDOFF = {
    "fp64": 2.0**-53, "fp32": 2.0**-24, "tf32": 2.0**-11, "fp16": 2.0**-11,
    "bf16": 2.0**-8, "fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3,
}
#: Order of the analyzer's representability shares (Signature.repr_test).
NARROW_FORMATS = ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2")
#: Largest finite value of the narrow formats (saturation targets).
FORMAT_MAX = {"fp16": 65504.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0,
              "bf16": 3.3895314e38}
#: Error models after which a kernel under test fails / only warns.
FAULT_MODELS = ("nan", "saturation", "bitflip", "stuck_at", "random_value",
                "zero", "lane", "indexing", "scale", "unknown")
PRECISION_MODELS = ("precision", "accumulation", "truncation", "ftz",
                    "nondeterminism")
#: torch.compile's fp64 check: the KUT's RMS error against the float64
#: reference may be at most this many times the golden kernel's.
NOISE_FLOOR_MULTIPLIER = 2.0
#: With a reference, a KUT more than this many times the golden kernel's
#: float64 RMS error is not "reordering" (a different order of a float32
#: sum has errors of the golden's own size; measured <= 4x in calibration).
REORDERING_ENVELOPE = 16.0
#: Least elements that must agree on a structural pattern (a stuck bit's
#: polarity, a lane) before it is called a pattern: 8 random events share
#: one polarity with probability 2**-7.
MIN_PATTERN = 8


class Candidate(NamedTuple):
  """One error model that a rule found consistent with the signature.

  Attributes:
    model: error-model name (``precision:bf16``, ``bitflip``, ...).
    confidence: in (0, 1]; how sharply the rule's statistics held.
    evidence: one sentence with the numbers that fired the rule.
    params: what the rule inferred (bit positions, format, lane, shift...).
  """

  model: str
  confidence: float
  evidence: str
  params: Mapping[str, Any]


class Diagnosis(NamedTuple):
  """The Detector's answer for one signature.

  Attributes:
    model: the top-ranked error model.
    confidence: its confidence.
    evidence: its evidence sentence.
    params: its inferred parameters.
    candidates: every model whose rule held, best first.
    verdict: ``pass``, ``warn`` or ``fail`` for this one record.
  """

  model: str
  confidence: float
  evidence: str
  params: Mapping[str, Any]
  candidates: tuple[Candidate, ...]
  verdict: str


def _host(sig) -> dict[str, np.ndarray]:
  fields = getattr(sig, "_fields", None)
  if fields is None or "share_differ" not in fields:
    raise PeatError(
        f"detect() takes a Signature from peat_jax.analyze, got "
        f"{type(sig).__name__}; call peat.analyze(test, golden) first")
  host = host_signature(sig)
  return {k: np.asarray(getattr(host, k)) for k in fields}


def host_signature(sig):
  """``sig`` with NumPy fields: fetched from the device unless every field
  is a NumPy value already (a packed fetch, `analyze_split_many`)."""
  if all(isinstance(v, (np.ndarray, np.generic)) for v in sig):
    return sig
  return jax.device_get(sig)


def _working_format(s: Mapping[str, np.ndarray], dtype) -> str:
  if dtype is not None:
    name = np.dtype(dtype).name
    table = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16",
             "float16": "fp16"}
    if name not in table:
      raise PeatError(f"dtype must be float32, float64, bfloat16 or float16, "
                      f"got {name}")
    return table[name]
  if "dtype_code" in s:
    return ("fp32", "bf16", "fp16", "fp64")[int(s["dtype_code"])]
  nbits = s["bits_xor"].shape[-1]
  return {32: "fp32", 64: "fp64", 16: "fp16"}[nbits]


def _pct(x: float) -> str:
  return f"{100.0 * x:.3g}%"


class _Facts:
  """Derived numbers shared by the rules."""

  def __init__(self, s: Mapping[str, np.ndarray], work: str,
               context: Mapping[str, Any] | None = None):
    self.s = s
    self.context = dict(context or {})
    self.work = work
    self.u = UNIT_ROUNDOFF[work]
    self.n = int(s["n"])
    self.ndiff = self.n - int(s["n_bit_equal"])
    self.share = self.ndiff / max(self.n, 1)
    self.xor = s["bits_xor"].astype(np.int64)
    self.nbits = self.xor.shape[0]
    self.mant = {"fp32": 23, "fp64": 52, "bf16": 7, "fp16": 10}[work]
    self.bits_per_diff = self.xor.sum() / max(self.ndiff, 1)
    self.rel_med = float(s["rel_pct"][0])
    self.rel_max = float(s["rel_max"])
    self.rel_rms = float(s["rel_rms"])
    self.has_ref = bool(s["has_reference"])
    self.noise_ratio = float(s["noise_ratio"]) if self.has_ref else math.nan
    self.larger = int(s["n_mag_larger"])
    self.smaller = int(s["n_mag_smaller"])

  def field_of_bit(self, k: int) -> str:
    if k == self.nbits - 1:
      return "sign"
    return "exponent" if k >= self.mant else "mantissa"


# ---------------------------------------------------------------------------
# Rules. Each returns a Candidate when its sufficient condition holds.
# ---------------------------------------------------------------------------


def _rule_nonfinite(f: _Facts) -> list[Candidate]:
  s = f.s
  new = int(s["n_nonfinite_new"])
  if not new:
    return []
  new_nan = max(int(s["n_nan_test"]) - int(s["n_nan_golden"]), 0)
  new_inf = max(int(s["n_inf_test"]) - int(s["n_inf_golden"]), 0)
  gmax = float(s["golden_absmax"])
  # Overflow to Inf: only Infs appear, and the golden output holds values
  # beyond a narrow format's maximum, so a conversion into it overflowed.
  over = [k for k, m in FORMAT_MAX.items() if gmax > m and k != "bf16"]
  if new_nan == 0 and new_inf > 0 and over and "n_overflow" in s and int(
      s["n_overflow"]) >= new_inf:
    fmt = min(over, key=lambda k: FORMAT_MAX[k])
    return [Candidate(
        "saturation", 0.9,
        f"{new_inf} elements became +-Inf where |golden| exceeds the "
        f"{fmt} maximum {FORMAT_MAX[fmt]:g} (max |golden| {gmax:.4g}): a "
        "conversion overflowed", {"format": fmt, "to": "inf",
                                  "count": new_inf})]
  out = []
  if f.ndiff <= 0.25 * f.n and f.bits_per_diff <= 2.0:
    bits = [int(k) for k in np.nonzero(f.xor)[0]]
    out.append(Candidate(
        "bitflip", 0.98,
        f"{new} of {f.ndiff} differing elements became NaN/Inf by flipping "
        f"{f.bits_per_diff:.2g} bits each, at bit positions {bits[:8]} "
        f"({', '.join(sorted({f.field_of_bit(k) for k in bits}))})",
        {"count": f.ndiff, "bits": bits}))
  return out + [Candidate(
      "nan", 0.97,
      f"{new} elements are NaN/Inf where golden is finite ({new_nan} NaN, "
      f"{new_inf} Inf, {_pct(new / f.n)} of elements)",
      {"count": new, "nan": new_nan, "inf": new_inf})]


def _rule_saturation_clip(f: _Facts) -> list[Candidate]:
  s = f.s
  out = []
  for fmt, field in (("fp16", "n_saturated_fp16"),
                     ("fp8_e4m3", "n_saturated_fp8_e4m3")):
    count = int(s.get(field, 0))
    if count and count >= 0.5 * f.ndiff:
      out.append(Candidate(
          "saturation", 0.95,
          f"{count} of {f.ndiff} differing elements are clipped at the {fmt} "
          f"maximum {FORMAT_MAX[fmt]:g} where |golden| is larger",
          {"format": fmt, "to": "max", "count": count}))
  return out


def _rule_indexing(f: _Facts) -> list[Candidate]:
  s = f.s
  out = []
  tshare = float(s["transpose_share"])
  if tshare >= 0.9:
    out.append(Candidate(
        "indexing", min(0.99, tshare),
        f"t[i, j] == g[j, i] bitwise at {_pct(tshare)} of the sampled "
        f"nonzero elements that differ ({_pct(f.share)} of elements differ): "
        "a transposed layout",
        {"kind": "transpose"}))
  for axis in ("col", "row"):
    shares = s[f"shift_{axis}_share"]
    best = int(s[f"best_shift_{axis}"])
    if best and shares[best + (len(shares) // 2)] >= 0.9:
      sh = float(shares[best + len(shares) // 2])
      out.append(Candidate(
          "indexing", min(0.99, sh),
          f"t equals g shifted by {best} {axis}s bitwise at {_pct(sh)} of "
          f"the sampled nonzero elements that differ ({_pct(f.share)} of "
          "elements differ)",
          {"kind": "shift", "axis": "columns" if axis == "col" else "rows",
           "shift": best}))
  if bool(s["is_permutation"]) and not out:
    out.append(Candidate(
        "indexing", 0.9,
        f"t holds exactly the multiset of golden bit patterns, in other "
        f"places ({_pct(f.share)} of elements moved)",
        {"kind": "permutation", "moved": f.ndiff}))
  return out


def _hot(v: np.ndarray) -> np.ndarray:
  """Indices whose value stands far above the typical one (>= 64x median)."""
  v = np.asarray(v, np.float64)
  base = float(np.median(v))
  if base > 0:
    return np.nonzero(v >= 64.0 * base)[0]
  return np.nonzero(v > 0)[0]


def _rule_edge(f: _Facts) -> list[Candidate]:
  """Errors confined to trailing rows/columns: a tile-edge index bug.

  Uses the per-column (per-row) mean |error|, so rounding noise elsewhere
  (a KUT with another summation order) does not hide the band: the band is
  the set of columns whose error is >= 64x the median column's.
  """
  s = f.s
  if f.ndiff < MIN_PATTERN:
    return []
  out = []
  for axis, field in (("columns", "col_abs_mean"), ("rows", "row_abs_mean")):
    v = s[field]
    size = v.shape[0]
    hit = _hot(v)
    if size < 4 or not len(hit) or len(hit) == size:
      continue
    first = int(hit[0])
    contiguous = len(hit) == size - first
    if contiguous and hit[-1] == size - 1 and 0 < first and (
        size - first <= size // 2):
      band = size - first
      mass = float(np.sum(v[hit]) / max(np.sum(v), 1e-300))
      out.append(Candidate(
          "indexing", 0.9,
          f"{_pct(mass)} of the error sits in the last {band} {axis} "
          f"({first}..{size - 1} of {size}), each >= 64x the median "
          f"{axis[:-1]}'s mean error: the last partial tile is indexed "
          "wrongly", {"kind": "tile_edge", "axis": axis, "first": first,
                      "band": band}))
  return out


def _rule_scale(f: _Facts) -> list[Candidate]:
  s = f.s
  scale = float(s["scale"])
  spread = float(s["scale_spread"])
  if f.share < 0.5 or not math.isfinite(scale):
    return []
  # t = c * g rounded: t/g varies by at most ~2u around c.
  if spread <= 8 * f.u and abs(scale - 1.0) > 8 * f.u:
    return [Candidate(
        "scale", 0.97,
        f"t / g is constant: {scale:.6g} (spread {spread:.2g} <= 8 u = "
        f"{8 * f.u:.2g}) over {_pct(f.share)} differing elements",
        {"factor": scale})]
  return []


#: Smallest normal magnitude of each format: values below it are subnormal
#: there, and a flush-to-zero mode returns 0 for them.
MIN_NORMAL = {"fp32": 2.0**-126, "bf16": 2.0**-126, "fp16": 2.0**-14,
              "fp8_e5m2": 2.0**-14, "fp8_e4m3": 2.0**-6}


def _rule_ftz(f: _Facts) -> list[Candidate]:
  s = f.s
  flushed = int(s["n_flushed"])
  if flushed and f.ndiff - flushed <= 0.05 * f.ndiff:
    return [Candidate(
        "ftz", 0.95,
        f"{flushed} of {f.ndiff} differing elements are golden subnormals "
        f"returned as zero ({int(s['n_golden_subnormal'])} golden "
        "subnormals in all)", {"flushed": flushed, "format": f.work})]
  zeroed = int(s["n_zeroed"])
  gmax = float(s.get("zeroed_golden_absmax", math.inf))
  if zeroed and zeroed >= 0.95 * f.ndiff:
    # Every zeroed value lies below a narrow format's smallest normal: a
    # flush of values that are subnormal in that format, not missed writes.
    fits = [k for k, m in MIN_NORMAL.items() if gmax < m]
    if fits:
      fmt = min(fits, key=lambda k: MIN_NORMAL[k])
      return [Candidate(
          "ftz", 0.96,
          f"{zeroed} of {f.ndiff} differing elements became 0 and all of "
          f"them are below {MIN_NORMAL[fmt]:.3g}, the smallest normal of "
          f"{fmt} (largest zeroed |golden| {gmax:.3g}): subnormals flushed "
          f"in {fmt}", {"flushed": zeroed, "format": fmt})]
  return []


def _rule_zero(f: _Facts) -> list[Candidate]:
  s = f.s
  zeroed = int(s["n_zeroed"])
  if not zeroed or zeroed < 0.9 * f.ndiff:
    return []
  params: dict[str, Any] = {"count": zeroed}
  rows = s["row_ndiff"]
  cols = s["col_ndiff"].shape[0]
  full_rows = int(np.sum(rows == cols))
  where = f"{zeroed} elements"
  if full_rows and full_rows * cols >= 0.9 * zeroed:
    params["rows"] = full_rows
    where = f"{full_rows} whole rows"
  else:
    tiles_all = s["tiles_all"]
    for i, ts in enumerate((8, 16, 32)):
      if tiles_all[i] and tiles_all[i] * ts * ts >= 0.9 * zeroed:
        params["tiles"] = int(tiles_all[i])
        params["tile"] = ts
        where = f"{int(tiles_all[i])} whole {ts}x{ts} tiles"
  return [Candidate(
      "zero", 0.95,
      f"{zeroed} of {f.ndiff} differing elements are 0 where golden is "
      f"nonzero ({where}): missed writes", params)]


def _rule_lane(f: _Facts) -> list[Candidate]:
  """Errors confined to one lane (column index mod 32).

  By count of differing elements, or, when rounding noise makes every
  element differ, by the share of the summed per-column mean |error|.
  """
  s = f.s
  cols = s["col_ndiff"].shape[0]
  if f.ndiff < MIN_PATTERN or cols < 64:
    return []
  lanes = s["lane_ndiff"].astype(np.int64)
  col_err = np.asarray(s["col_abs_mean"], np.float64)
  mass = np.bincount(np.arange(cols) % 32, weights=col_err, minlength=32)
  lane = int(np.argmax(lanes))
  in_lane = int(lanes[lane])
  if in_lane >= 0.95 * f.ndiff:
    how = (f"{in_lane} of {f.ndiff} differing elements sit in lane {lane} of "
           f"32 (column index mod 32); a uniform spread would put "
           f"{f.ndiff / 32:.3g} there")
  elif mass.sum() > 0 and mass.max() >= 0.95 * mass.sum():
    lane = int(np.argmax(mass))
    how = (f"{_pct(mass[lane] / mass.sum())} of the error mass sits in lane "
           f"{lane} of 32 (column index mod 32), the rest is rounding noise")
  else:
    return []
  what = ("zeroed" if int(s["n_zeroed"]) >= 0.9 * in_lane and in_lane else
          "non-finite" if int(s["n_nonfinite_new"]) >= 0.9 * in_lane and
          in_lane else "corrupted")
  return [Candidate("lane", 0.95, f"{how}; values there are {what}",
                    {"stride": 32, "lane": lane, "what": what})]


def _rule_tile(f: _Facts) -> list[Candidate]:
  s = f.s
  if f.ndiff < MIN_PATTERN:
    return []
  for i, ts in enumerate((8, 16, 32)):
    full = int(s["tiles_all"][i])
    anyd = int(s["tiles_any"][i])
    total = int(s["tiles_total"][i])
    if full and full == anyd and full * ts * ts >= 0.9 * f.ndiff and (
        full < total):
      return [Candidate(
          "lane", 0.9,
          f"every differing element lies in {full} of {total} aligned "
          f"{ts}x{ts} tiles, each wrong in every element: tile corruption",
          {"tile": ts, "tiles": full})]
  return []


def _rule_stuck(f: _Facts) -> list[Candidate]:
  s = f.s
  if f.ndiff < MIN_PATTERN:
    return []
  out = []
  for polarity, field in ((1, "bits_up"), (0, "bits_down")):
    v = s[field].astype(np.int64)
    k = int(np.argmax(v))
    others = f.xor.sum() - f.xor[k]
    if v[k] >= 0.95 * f.ndiff and f.xor[k] == v[k] and (
        others <= 0.05 * f.ndiff):
      out.append(Candidate(
          "stuck_at", 0.95,
          f"all {f.ndiff} differing elements differ only in bit {k} "
          f"({f.field_of_bit(k)}), always {1 - polarity}->{polarity}: a "
          f"stuck-at-{polarity} bit", {"bit": k, "polarity": polarity,
                                       "count": f.ndiff}))
  return out


#: Above this share of differing elements, errors no larger than
#: ROUNDING_ABS_ULPS units of roundoff of the golden RMS are rounding noise
#: (e.g. a 9-term convolution whose outputs near zero cancel), not flips.
SPARSE_MAX_SHARE_AT_ROUNDING = 0.01
ROUNDING_ABS_ULPS = 1024.0


def _rule_sparse(f: _Facts) -> list[Candidate]:
  """Few elements with errors far above rounding: bit flips or wild values."""
  s = f.s
  if not f.ndiff or f.share > 0.25:
    return []
  # Rounding noise at working precision stays within a few ulps relative to
  # the output scale; a fault is far outside it.
  grms = float(s["golden_rms"]) or 1.0
  outlier = float(s["abs_max"]) / grms
  # Largest ULP distance: the top nonempty bucket k of ulp_hist holds
  # distances in [2**(k-1), 2**k). Rounding noise moves values by a few
  # ULPs; a flip of mantissa bit b moves one by exactly 2**b ULPs.
  hist = np.asarray(s["ulp_hist"])
  top = int(np.nonzero(hist)[0][-1]) if hist.any() else 0
  max_ulp = 2.0 ** (top - 1) if top else 0.0
  nonfinite = int(s["n_nonfinite_new"]) > 0
  if max_ulp < 8 and not nonfinite:
    return []  # within a few ULPs: rounding-sized, left to the level rules
  if (not nonfinite and f.share > SPARSE_MAX_SHARE_AT_ROUNDING
      and outlier <= ROUNDING_ABS_ULPS * f.u):
    # Many elements differ, none by more than rounding of the output's
    # scale: a short reduction's cancellation noise (outputs near zero are
    # many of their own ULPs off), not faults; left to the level rules.
    return []
  bits = [int(k) for k in np.nonzero(f.xor)[0]]
  if f.bits_per_diff <= 3.0:
    fields = sorted({f.field_of_bit(k) for k in bits})
    return [Candidate(
        "bitflip", 0.9,
        f"{f.ndiff} elements ({_pct(f.share)}) differ in "
        f"{f.bits_per_diff:.2g} bits each on average, at bit positions "
        f"{bits[:8]} ({', '.join(fields)}); up to {max_ulp:.3g}+ ULPs, max "
        f"error {outlier:.3g} x RMS golden", {"count": f.ndiff, "bits": bits})]
  return [Candidate(
      "random_value", 0.85,
      f"{f.ndiff} elements ({_pct(f.share)}) hold unrelated values: "
      f"{f.bits_per_diff:.3g} of {f.nbits} bits differ per element, max "
      f"error {outlier:.3g} x RMS golden", {"count": f.ndiff})]


#: Median relative error of a float32 result whose inputs were rounded to a
#: format with unit roundoff u: about 0.6 u (half the inputs' rounding error
#: survives a dot product of random-signed terms; measured 0.5-1.5 u on
#: matmul, layer norm and softmax of normal inputs).
INPUT_ROUNDING_LEVEL = 0.6
#: Median relative error of a K-term reduction whose running sum is rounded
#: to u at every add: about 0.3 sqrt(K) u (random-walk growth of K
#: roundings, measured 0.25-0.42 sqrt(K) u on matmul, softmax, layer norm).
ACCUMULATION_LEVEL = 0.3
#: A level hypothesis is accepted within this many octaves of the observed.
LEVEL_OCTAVES = 1.5
_GEMM_KERNELS = ("matmul", "dot_general", "conv", "conv2d",
                 "conv_general_dilated", "attention")
_NORMALIZING_KERNELS = ("softmax", "layer_norm", "log_softmax",
                        "cross_entropy")


def _level_hypotheses(context: Mapping[str, Any]) -> list[tuple[str, float]]:
  """(model, predicted median relative error) for dense precision loss."""
  kernel = str(context.get("kernel", ""))
  # tf32 and fp16 share u = 2**-11; GEMM ports round to tf32 (tensor-core
  # input format), others to fp16. Listed first wins a tie.
  fmts = (("bf16", "tf32", "fp16", "fp8_e4m3", "fp8_e5m2")
          if kernel.split(":")[0] in _GEMM_KERNELS else
          ("bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2"))
  hyps = [(f"precision:{k}", INPUT_ROUNDING_LEVEL * UNIT_ROUNDOFF[k])
          for k in fmts]
  reduction = context.get("reduction")
  # A GEMM's accumulator is its output: a narrow accumulator leaves narrow
  # outputs, which the representability rule names. Only a normalizing
  # kernel (softmax, layer norm) divides by a narrow sum and returns wide
  # outputs; such ports keep the sum in bf16 (an fp16 sum of D exp terms
  # or squares overflows at 65504), so bf16 is the one hypothesis.
  if reduction and kernel.split(":")[0] in _NORMALIZING_KERNELS:
    hyps.append(("accumulation:bf16", ACCUMULATION_LEVEL *
                 math.sqrt(float(reduction)) * UNIT_ROUNDOFF["bf16"]))
  return hyps


def _rule_rounding(f: _Facts) -> list[Candidate]:
  """Dense, bounded errors: truncation, precision, accumulation, reordering."""
  s = f.s
  out = []
  if not f.ndiff:
    return out
  repr_t = {k: float(v) for k, v in zip(NARROW_FORMATS, s["repr_test"])}
  repr_g = {k: float(v) for k, v in zip(NARROW_FORMATS, s["repr_golden"])}
  # Formats the test output is confined to (and golden is not).
  narrow = [k for k in NARROW_FORMATS
            if repr_t[k] >= 0.99 and repr_g[k] <= repr_t[k] - 0.2]
  narrowest = narrow[-1] if narrow else None
  if narrow:
    # The coarsest format the output fits (fp8 before fp16 before bf16).
    narrowest = max(narrow, key=lambda k: UNIT_ROUNDOFF[k])

  # Truncation against the float64 reference: the KUT never lands above
  # the exact magnitude while the golden kernel (round to nearest) does as
  # often as below. Needs the reference: against golden, the KUT's
  # truncation of an exact result looks like noise of either sign.
  if f.has_ref and f.ndiff >= 16:
    t_up, t_dn = float(s["ref_test_grown"]), float(s["ref_test_shrunk"])
    g_up, g_dn = float(s["ref_golden_grown"]), float(s["ref_golden_shrunk"])
    if t_up <= 0.01 * (t_up + t_dn) and t_dn >= 0.2 and g_up >= 0.25 * (
        g_up + g_dn):
      fmt = narrowest or f.work
      out.append(Candidate(
          "truncation", 0.93,
          f"against the float64 reference {_pct(t_dn)} of outputs are "
          f"smaller in magnitude and {_pct(t_up)} larger (golden: "
          f"{_pct(g_dn)} / {_pct(g_up)}): results rounded toward zero",
          {"format": fmt, "against": "reference"}))
      return out
  # Truncation: every changed magnitude went down, over many elements.
  if f.ndiff >= 16 and f.larger <= 0.01 * f.ndiff and f.smaller > 0:
    fmt = narrowest or f.work
    bound = 2 * UNIT_ROUNDOFF.get(fmt, f.u)
    conf = 0.95 if f.rel_max <= bound * 1.01 else 0.7
    out.append(Candidate(
        "truncation", conf,
        f"{f.smaller} of {f.ndiff} differing elements shrank in magnitude "
        f"and {f.larger} grew; max relative "
        f"error {f.rel_max:.3g} vs 2u({fmt}) = {bound:.3g}: round toward "
        "zero", {"format": fmt}))

  if narrowest is not None:
    u = UNIT_ROUNDOFF[narrowest]
    # One rounding to nearest into fmt leaves every relative error <= u and
    # a median near 3u/8 (a uniform position within the last place, over a
    # log-uniform spread of significands); a running sum rounded at every
    # add leaves more. A median above 3u/4 is therefore more than one
    # rounding. (The median, not the max, is compared: values below the
    # format's normal range round more coarsely.)
    is_acc = f.rel_med > 0.75 * u
    if not is_acc:
      out.append(Candidate(
          f"precision:{narrowest}", 0.95,
          f"{_pct(repr_t[narrowest])} of outputs are exact {narrowest} "
          f"values (golden {_pct(repr_g[narrowest])}) and the median relative "
          f"error {f.rel_med:.3g} is within one rounding (<= 3u/4 = "
          f"{0.75 * u:.3g}): "
          f"outputs rounded to {narrowest}",
          {"format": narrowest, "where": "output"}))
    else:
      out.append(Candidate(
          f"accumulation:{narrowest}", 0.85,
          f"{_pct(repr_t[narrowest])} of outputs are exact {narrowest} "
          f"values but the median relative error {f.rel_med:.3g} exceeds "
          f"one rounding (3u/4 = {0.75 * u:.3g}): partial sums were "
          f"kept in {narrowest}", {"format": narrowest}))
    return out

  # Outputs at working precision: the error level tells the story.
  level = f.rel_med
  within_floor = f.has_ref and f.noise_ratio <= NOISE_FLOOR_MULTIPLIER * 2
  # Another order of the same float32 sum stays within a small multiple of
  # the golden kernel's own error; far beyond it (a few huge errors under a
  # small median) is no reordering, whatever the median says.
  far_beyond = f.has_ref and f.noise_ratio > REORDERING_ENVELOPE
  if within_floor or (level <= 16 * f.u and not far_beyond):
    conf = 0.95 if within_floor else 0.8
    floor = (f"KUT/golden RMS error vs float64 = {f.noise_ratio:.3g}"
             if f.has_ref else "no float64 reference")
    out.append(Candidate(
        "reordering", conf,
        f"unbiased rounding noise: median relative error {level:.3g} "
        f"({level / f.u:.3g} u(fp32)), bias {float(s['bias']):+.2f}, "
        f"{f.larger} up / {f.smaller} down; {floor}",
        {"level_u": level / f.u}))
    return out
  best, dist = None, math.inf
  for model, predicted in _level_hypotheses(f.context):
    d = abs(math.log2(max(level, 1e-300)) - math.log2(predicted))
    if d < dist:
      best, dist, pred = model, d, predicted
  if best is not None and dist <= LEVEL_OCTAVES:
    fmt = best.split(":")[1]
    if best.startswith("accumulation"):
      why = (f"0.3 sqrt(K) u({fmt}) = {pred:.3g} for a K = "
             f"{int(f.context['reduction'])} reduction whose running sum is "
             f"kept in {fmt}")
    else:
      why = (f"0.6 u({fmt}) = {pred:.3g} for inputs or intermediates rounded "
             f"to {fmt}")
    out.append(Candidate(
        best, 0.85 - 0.1 * dist,
        f"outputs are at working precision with median relative error "
        f"{level:.3g}, {dist:.2g} octaves from {why}",
        {"format": fmt, "where": "inputs" if best.startswith("precision")
         else "accumulator"}))
  return out


_RULES = (_rule_nonfinite, _rule_saturation_clip, _rule_indexing, _rule_scale,
          _rule_ftz, _rule_lane, _rule_zero, _rule_tile, _rule_stuck,
          _rule_edge, _rule_sparse, _rule_rounding)


def _record_verdict(model: str, f: _Facts) -> str:
  base = model.split(":")[0]
  if base == "exact":
    return "pass"
  if base == "reordering":
    if not f.has_ref or f.noise_ratio <= NOISE_FLOOR_MULTIPLIER:
      return "pass"
    return "warn"
  if base in PRECISION_MODELS:
    return "warn"
  return "fail"


def detect(sig, *, repeat=None, dtype=None,
           context: Mapping[str, Any] | None = None) -> Diagnosis:
  """Names the error model that explains one signature.

  Args:
    sig: a Signature of one record (``peat.analyze``).
    repeat: optionally the Signature of a second KUT call on the same
      inputs against the first; any difference there is ``nondeterminism``.
    dtype: the compared arrays' dtype when the signature cannot tell
      (16-bit records: bfloat16 vs float16); inferred otherwise.
    context: what the site is, when known: ``{"kernel": "dot_general",
      "reduction": K}``. The reduction length K separates accumulation in a
      narrow format (error grows like sqrt(K)) from rounded inputs.

  Returns:
    A :class:`Diagnosis`; ``model`` is ``exact`` for bitwise-equal outputs
    and ``unknown`` when no rule explains a real difference.

  Raises:
    PeatError: ``sig`` is not a single-record Signature.
  """
  s = _host(sig)
  if np.ndim(s["n"]) != 0:
    raise PeatError(
        f"detect() takes one record's Signature; this one holds "
        f"{np.shape(s['n'])[0]} records (from analyze_batch): use "
        "detect_batch()")
  f = _Facts(s, _working_format(s, dtype), context)
  cands: list[Candidate] = []
  if repeat is not None:
    r = _host(repeat)
    rdiff = int(r["n"]) - int(r["n_bit_equal"])
    if rdiff:
      cands.append(Candidate(
          "nondeterminism", 0.99,
          f"two KUT calls on identical inputs differ at {rdiff} of "
          f"{int(r['n'])} elements (max |diff| {float(r['abs_max']):.3g})",
          {"differing": rdiff}))
  if f.ndiff == 0 and not cands:
    cand = Candidate("exact", 1.0, f"all {f.n} elements are bitwise equal "
                     "to golden", {})
    return Diagnosis(*cand, candidates=(cand,), verdict="pass")
  if f.ndiff and int(s["n_value_equal"]) == f.n:
    cands.append(Candidate(
        "exact", 0.9, f"values equal; {f.ndiff} elements differ only in the "
        "sign of zero", {"signed_zeros": f.ndiff}))
  for rule in _RULES:
    if cands and cands[0].model == "exact":
      break
    if rule is _rule_rounding and cands:
      break  # a structural fault explains it; noise levels would only blur
    cands.extend(rule(f))
  if not cands:
    floor = (f", {f.noise_ratio:.3g}x the golden noise floor"
             if f.has_ref else "")
    cands.append(Candidate(
        "unknown", 0.5,
        f"{f.ndiff} elements ({_pct(f.share)}) differ, median relative "
        f"error {f.rel_med:.3g}, max {f.rel_max:.3g}{floor}; no error model "
        "explains it", {}))
  cands.sort(key=lambda c: -c.confidence)
  top = cands[0]
  return Diagnosis(top.model, top.confidence, top.evidence, top.params,
                   tuple(cands), _record_verdict(top.model, f))


def detect_batch(sig, *, dtype=None,
                 context: Mapping[str, Any] | None = None) -> list[Diagnosis]:
  """``detect`` for each record of a batched Signature (``analyze_batch``)."""
  s = jax.device_get(sig)
  count = np.shape(s.n)[0] if np.ndim(s.n) else None
  if count is None:
    return [detect(sig, dtype=dtype, context=context)]
  return [detect(jax.tree.map(lambda x, i=i: x[i], s), dtype=dtype,
                 context=context) for i in range(count)]


class Verdict(NamedTuple):
  """A kernel under test's verdict over many (site, step) records.

  Attributes:
    verdict: ``pass``, ``warn`` or ``fail``.
    deciding: the records (keys as given) that decided it, worst first.
    models: count of records per diagnosed model.
    summary: one sentence.
  """

  verdict: str
  deciding: tuple
  models: Mapping[str, int]
  summary: str


def verdict(diagnoses: Mapping[Any, Diagnosis] | Sequence[Diagnosis]
            ) -> Verdict:
  """Aggregates per-record diagnoses into one verdict for the KUT.

  ``fail`` when any record fails (a fault model, or an error no model
  explains), else ``warn`` when any record warns (precision loss,
  accumulation, truncation, flushing, nondeterminism, or reordering beyond
  the noise-floor envelope), else ``pass``.

  Args:
    diagnoses: ``{record key: Diagnosis}`` (e.g. key ``(site, step)``) or a
      sequence of diagnoses.

  Returns:
    A :class:`Verdict`.

  Raises:
    PeatError: no diagnoses.
  """
  items = (list(diagnoses.items()) if isinstance(diagnoses, Mapping)
           else list(enumerate(diagnoses)))
  if not items:
    raise PeatError("verdict() needs at least one diagnosis")
  order = {"fail": 0, "warn": 1, "pass": 2}
  items.sort(key=lambda kv: (order[kv[1].verdict], -kv[1].confidence))
  worst = items[0][1].verdict
  deciding = tuple(k for k, d in items if d.verdict == worst)
  models: dict[str, int] = {}
  for _, d in items:
    models[d.model] = models.get(d.model, 0) + 1
  top = ", ".join(f"{m} x{c}" for m, c in sorted(
      models.items(), key=lambda mc: -mc[1]))
  summary = (f"{worst}: {len(deciding)} of {len(items)} records decided it "
             f"(diagnoses: {top})")
  return Verdict(worst, deciding, models, summary)
