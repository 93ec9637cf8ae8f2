"""Floating-point facts and the derived numbers every Detector rule reads.

The Detector's thresholds come from these facts (unit roundoff, format
maxima, smallest normals), not from tuning; :class:`_Facts` holds what the
rules derive from one signature."""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from peat_jax import core as _core
from peat_jax.core import PeatError

#: Unit roundoff (2**-precision) of the formats the Detector knows.
UNIT_ROUNDOFF = {k: f.unit_roundoff for k, f in _core.FORMATS.items()}
#: Order of the analyzer's representability shares (Signature.repr_test).
NARROW_FORMATS = _core.NARROW_FORMATS
#: Largest finite value of the narrow formats (saturation targets).
FORMAT_MAX = {k: _core.FORMATS[k].max
              for k in ("fp16", "fp8_e4m3", "fp8_e5m2", "bf16")}
#: Error models after which a kernel under test fails / only warns.
FAULT_MODELS = ("nan", "saturation", "bitflip", "stuck_at", "random_value",
                "zero", "lane", "indexing", "scale", "unknown")
#: Port mismatches: another constant or closed form of the same kernel.
#: They warn while their error stays within bf16's unit roundoff (what
#: training in bf16 tolerates, docs/detector.md), and fail beyond it.
PORT_MODELS = ("parameter", "approximation")
PRECISION_MODELS = ("precision", "accumulation", "truncation", "ftz",
                    "nondeterminism")
#: torch.compile's fp64 check: the KUT's RMS error against the float64
#: reference may be at most this many times the golden kernel's. The
#: naming rules read it (what is still the golden kernel's own noise).
NOISE_FLOOR_MULTIPLIER = 2.0
#: The verdict's noise-floor envelope: ``reordering`` passes while the KUT's
#: RMS error against float64 is at most this many times the golden
#: kernel's, and a record within it does not localize. Wider than the 2x of
#: torch.compile's check because the golden kernel's own distance to
#: float64 is no constant of the kernel: two x86-64 CPUs of one machine
#: kind rounded the same golden dots 1.7x apart (their noise floors, the
#: record fixture of tests/profiler), and correct kernels written another
#: standard way sit at up to 2x on one of them (torch's SDPA backward:
#: 1.4-1.9x on eight seeds): a verdict on the kernel must not flip with
#: the processor that measured its golden. Another correct order of a
#: float32 sum was measured up to ~4x (analyzer.signature._decompose).
BENIGN_NOISE_RATIO = 4.0
#: With a reference, a KUT more than this many times the golden kernel's
#: float64 RMS error is not "reordering" (a different order of a float32
#: sum has errors of the golden's own size; measured <= 4x in calibration).
REORDERING_ENVELOPE = 16.0
#: Least elements that must agree on a structural pattern (a stuck bit's
#: polarity, a lane) before it is called a pattern: 8 random events share
#: one polarity with probability 2**-7.
MIN_PATTERN = 8
#: A permutation's largest moved value errs by at least this share of the
#: RMS of golden (two random places of one tensor differ by about the RMS;
#: quantized outputs exchanging neighbouring values err by an ULP).
PERMUTED_ERROR = 2.0 ** -4


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

  A real port's fault rides on its own benign error, so a diagnosis may
  name two causes: the primary one (``model``, the worst: the fault) and a
  secondary one (``secondary``, e.g. the port's ``reordering`` under an
  ``indexing`` bug in its last tile, or ``precision:tf32`` under three bit
  flips), each with its evidence and parameters (``params["covers"]``: the
  elements a cause explains, where known).

  Attributes:
    model: the primary (top-ranked, worst) error model.
    confidence: its confidence.
    evidence: its evidence sentence.
    params: its inferred parameters.
    candidates: every model whose rule held, best first.
    verdict: ``pass``, ``warn`` or ``fail`` for this one record: that of
      the worst cause.
    secondary: the second cause (a :class:`Candidate`), or None.
  """

  model: str
  confidence: float
  evidence: str
  params: Mapping[str, Any]
  candidates: tuple[Candidate, ...]
  verdict: str
  secondary: Candidate | None = None


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
    if name not in _core.DTYPE_FORMAT:
      raise PeatError(f"dtype must be float32, float64, bfloat16 or float16, "
                      f"got {name}")
    return _core.DTYPE_FORMAT[name]
  if "dtype_code" in s:
    return _core.format_of_code(int(s["dtype_code"])).name
  nbits = s["bits_xor"].shape[-1]
  return {32: "fp32", 64: "fp64", 16: "fp16"}[nbits]


def _pct(x: float) -> str:
  return f"{100.0 * x:.3g}%"


#: Median relative error of a K-term reduction whose running sum is rounded
#: to u at every add: about 0.3 sqrt(K) u (random-walk growth of K
#: roundings, measured 0.25-0.42 sqrt(K) u on matmul, softmax, layer norm).
ACCUMULATION_LEVEL = 0.3
#: A level hypothesis is accepted within this many octaves of the observed.
LEVEL_OCTAVES = 1.5


def working_sum_bound(f: "_Facts") -> float:
  """The relative error a K-term reduction kept in a wide record's own
  format (float32, float64) reaches in any order: ACCUMULATION_LEVEL
  sqrt(K) u, LEVEL_OCTAVES above; 0 without a reduction length or for a
  16-bit record. A long reduction's golden kernel (XLA's blocked and
  vectorized sums) can be far more accurate than a correct kernel that
  adds in order (a GEMM thread's accumulator over K = 65,536: ten times
  the golden error; a softmax's sum of 2^20 terms: one row scaled by
  1 - 4e-5); within this level such a difference is another order, not
  a fault or a port's constant."""
  k = f.context.get("reduction")
  if not k or f.work not in ("fp32", "fp64"):
    return 0.0
  return ACCUMULATION_LEVEL * math.sqrt(float(k)) * f.u * 2.0 ** LEVEL_OCTAVES


def within_working_sum(f: "_Facts") -> bool:
  """Whether the record's median relative error is within
  :func:`working_sum_bound`."""
  bound = working_sum_bound(f)
  return bool(bound > 0 and np.isfinite(f.rel_med) and f.rel_med <= bound)


#: A reduction is long when its working-sum level exceeds this many u: a
#: shorter one's other orders stay inside the golden kernel's envelope
#: (16 u, the reordering level without a reference), so a dense error
#: beyond that envelope is no other order there (K = 40: 5.4 u; the
#: level passes 16 u from K = 356).
LONG_SUM_MIN_U = 16.0


def long_sum_bound(f: "_Facts") -> float:
  """:func:`working_sum_bound` of a long reduction (its level above
  LONG_SUM_MIN_U u), where another correct order of the sum can reach far
  beyond the golden kernel's envelope; 0 for a shorter one."""
  bound = working_sum_bound(f)
  return bound if bound > LONG_SUM_MIN_U * f.u else 0.0


def within_long_sum(f: "_Facts") -> bool:
  """:func:`within_working_sum` for a long reduction
  (:func:`long_sum_bound`)."""
  return bool(long_sum_bound(f) > 0 and within_working_sum(f))


def outliers_within_long_sum(f: "_Facts") -> bool:
  """Whether a long reduction's outliers (beyond the golden kernel's
  envelope: outputs whose terms cancel) are no further from golden, at the
  output's scale (its RMS), than the working-sum level: another order's
  error, with no fault confined to them (none non-finite, none zeroed)."""
  s = f.s
  bound = long_sum_bound(f)
  return bool(f.n_out and bound > 0
              and not int(s["n_nonfinite_new"]) and not int(s["n_out_zero"])
              and float(s["out_abs_max"]) <= bound * float(s["golden_rms"]))


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
    self.mant = _core.FORMATS[work].mantissa_bits
    self.bits_per_diff = self.xor.sum() / max(self.ndiff, 1)
    self.rel_med = float(s["rel_pct"][0])
    self.rel_max = float(s["rel_max"])
    self.rel_rms = float(s["rel_rms"])
    self.has_ref = bool(s["has_reference"])
    self.noise_ratio = float(s["noise_ratio"]) if self.has_ref else math.nan
    self.larger = int(s["n_mag_larger"])
    self.smaller = int(s["n_mag_smaller"])
    # The noise-aware decomposition (analyzer.signature._decompose), when computed.
    self.dec = bool(s.get("decomposed", False))
    if self.dec:
      self.n_out = int(s["n_out"])
      self.n_beyond = int(s["n_beyond"])
      self.out_share = self.n_out / max(self.n, 1)
      self.beyond_share = self.n_beyond / max(self.n, 1)
      self.theta = float(s["env_theta"])
      self.theta_g = float(s["env_theta_golden"])
      self.zmed_t = float(s["z_med_test"])
      self.zmed_g = float(s["z_med_golden"])

  def field_of_bit(self, k: int) -> str:
    if k == self.nbits - 1:
      return "sign"
    return "exponent" if k >= self.mant else "mantissa"


#: Smallest normal magnitude of each format: values below it are subnormal
#: there, and a flush-to-zero mode returns 0 for them.
MIN_NORMAL = {k: _core.FORMATS[k].min_normal
              for k in ("fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3")}
