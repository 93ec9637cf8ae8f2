"""What every hypothesis of the Detector reads: facts of one record.

Floating-point facts of the formats (unit roundoff, maxima, smallest
normals), the model names and their families, the typed context of a
call (:class:`Context`, with the port probe as a :class:`Probe`), the
Candidate and Diagnosis types, and :class:`Facts`: the numbers the
hypotheses derive from one host Signature, read by attribute (never by a
string key) with the thresholds of the call's
:class:`~peat_jax.detector.DetectorConfig`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.detector.facts._config import CONFIG, DetectorConfig

#: Unit roundoff (2**-precision) of the formats the Detector knows.
UNIT_ROUNDOFF = {k: f.unit_roundoff for k, f in _core.FORMATS.items()}
#: Order of the analyzer's representability shares (Signature.repr_test)
#: and of its ``base_format`` index.
NARROW_FORMATS = _core.NARROW_FORMATS
#: Largest finite value of the narrow formats (saturation targets).
FORMAT_MAX = {k: _core.FORMATS[k].max
              for k in ("fp16", "fp8_e4m3", "fp8_e5m2", "bf16")}
#: Smallest normal magnitude of each format: values below it are subnormal
#: there, and a flush-to-zero mode returns 0 for them.
MIN_NORMAL = {k: _core.FORMATS[k].min_normal
              for k in ("fp32", "bf16", "fp16", "fp8_e5m2", "fp8_e4m3")}
#: Error models after which a kernel under test fails / only warns.
FAULT_MODELS = ("nan", "saturation", "bitflip", "stuck_at", "random_value",
                "zero", "lane", "indexing", "scale", "unknown")
#: Port mismatches: another constant or closed form of the same kernel
#: (warn within formula_fail_level of the scale, fail beyond).
PORT_MODELS = ("parameter", "approximation")
PRECISION_MODELS = ("precision", "accumulation", "truncation", "ftz",
                    "nondeterminism")
#: Benign models: a verdict of pass (reordering within its envelope).
BENIGN_MODELS = ("exact", "reordering")
#: The site kinds whose inputs meet in a product (a GEMM's two operands).
GEMM_KERNELS = ("matmul", "dot_general", "conv", "conv2d",
                "conv_general_dilated", "attention")
#: The site kinds that divide by a sum over their row.
NORMALIZING_KERNELS = ("softmax", "layer_norm", "log_softmax",
                       "cross_entropy", "rms_norm")
#: Records at least this wide (float32, float64) keep many bits above
#: their rounding envelope; 16-bit ones few.
WIDE_BITS = 32
# The defaults of the config, under the names other packages read.
NOISE_FLOOR_MULTIPLIER = CONFIG.noise_floor_multiplier
BENIGN_NOISE_RATIO = CONFIG.benign_noise_ratio
REORDERING_ENVELOPE = CONFIG.reordering_envelope
MIN_PATTERN = int(CONFIG.min_pattern)


def family(model: str) -> str:
  """The family of an error-model name: ``precision`` of
  ``precision:bf16``."""
  return model.partition(":")[0]


def format_of_model(model: str) -> str | None:
  """The format of an error-model name (``bf16`` of ``precision:bf16``),
  or None."""
  return model.partition(":")[2] or None


class Candidate(NamedTuple):
  """One error model that a hypothesis found consistent with the record.

  Attributes:
    model: error-model name (``precision:bf16``, ``bitflip``, ...).
    confidence: in (0, 1]: how closely the hypothesis's statistic fits.
    evidence: one sentence with the numbers that accepted it.
    params: the typed evidence's fields (bit positions, format, lane,
      shift, ``covers``: the elements the cause explains), for records and
      reports.
    found: the typed evidence (a NamedTuple of
      :mod:`~peat_jax.detector.facts`), None for a candidate made
      outside the Detector's hypotheses.
  """

  model: str
  confidence: float
  evidence: str
  params: Mapping[str, Any]
  found: Any = None


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
    candidates: every model whose hypothesis held, best first.
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


class Probe(NamedTuple):
  """The port probe's answer, typed (peat.analyzer.port_probe's dict).

  Attributes:
    model: the hypothesis's error model (``parameter``,
      ``precision:bf16``, ...).
    name: its name (``eps``, ``inputs_bf16``, ...).
    explains: whether it explains the KUT's output.
    evidence: its sentence.
    tried: the names of the hypotheses tried.
    ratio: its median distance ratio.
    row_order: the row factor's rank correlation with the row statistic
      (None where not read).
    signature: the KUT's Signature against the hypothesis (None where not
      computed).
    extra: the probe's other fields (estimate, distances, ...).
  """

  model: str
  name: str
  explains: bool
  evidence: str
  tried: tuple[str, ...]
  ratio: float
  row_order: float | None
  signature: Any
  extra: Mapping[str, Any]

  @classmethod
  def of(cls, found: Mapping[str, Any] | None) -> "Probe | None":
    """The typed form of a probe dict (None stays None)."""
    if not found:
      return None
    known = ("model", "name", "explains", "evidence", "tried", "ratio",
             "row_order", "signature")
    order = found.get("row_order")
    return cls(str(found.get("model", "")), str(found.get("name", "")),
               bool(found.get("explains", False)),
               str(found.get("evidence", "")),
               tuple(str(t) for t in found.get("tried", ()) or ()),
               float(found.get("ratio", math.nan)),
               None if order is None else float(order),
               found.get("signature"),
               {k: v for k, v in found.items() if k not in known})

  @property
  def tried_inputs(self) -> bool:
    """Whether the probe tried an input-precision hypothesis."""
    return any(t.startswith("inputs_") for t in self.tried)


class Context(NamedTuple):
  """What the site is, when known.

  Attributes:
    kernel: the site kind (``dot_general``, ``softmax``, ...), "" unknown.
    reduction: the reduction length K, None unknown.
    probe: the port probe's answer, or None.
  """

  kernel: str = ""
  reduction: int | None = None
  probe: Probe | None = None

  @classmethod
  def of(cls, context: Mapping[str, Any] | "Context" | None) -> "Context":
    """The typed context of a ``detect(context=...)`` mapping."""
    if isinstance(context, Context):
      return context
    context = dict(context or {})
    red = context.get("reduction")
    return cls(str(context.get("kernel") or "").partition(":")[0],
               int(red) if red else None, Probe.of(context.get("port")))

  @property
  def gemm(self) -> bool:
    """Whether the site is a GEMM kind (two operands in a product)."""
    return self.kernel in GEMM_KERNELS

  @property
  def normalizing(self) -> bool:
    """Whether the site divides by a sum over its row."""
    return self.kernel in NORMALIZING_KERNELS


def host_signature(sig):
  """``sig`` with NumPy fields: fetched from the device unless every field
  is a NumPy value already (a packed fetch, `analyze_split_many`)."""
  if all(isinstance(v, (np.ndarray, np.generic)) for v in sig):
    return sig
  return jax.device_get(sig)


def checked_signature(sig):
  """The host form of a single-record Signature.

  Raises:
    PeatError: not a Signature from ``peat.analyze``.
  """
  fields = getattr(sig, "_fields", None)
  if fields is None or "share_differ" not in fields:
    raise PeatError(
        f"detect() takes a Signature from peat_jax.analyze, got "
        f"{type(sig).__name__}; call peat.analyze(test, golden) first")
  return host_signature(sig)


def working_format(sig, dtype) -> str:
  """The record's format name (``fp32``, ``bf16``, ...).

  Raises:
    PeatError: a dtype the Detector does not know.
  """
  if dtype is not None:
    name = np.dtype(dtype).name
    if name not in _core.DTYPE_FORMAT:
      raise PeatError(f"dtype must be float32, float64, bfloat16 or float16, "
                      f"got {name}")
    return _core.DTYPE_FORMAT[name]
  if hasattr(sig, "dtype_code"):
    return _core.format_of_code(int(sig.dtype_code)).name
  nbits = np.shape(sig.bits_xor)[-1]
  return {32: "fp32", 64: "fp64", 16: "fp16"}[nbits]


def pct(x: float) -> str:
  """A share as a percentage with three significant digits."""
  return f"{100.0 * x:.3g}%"


def _f(x) -> float:
  return float(np.asarray(x))


def _i(x) -> int:
  return int(np.asarray(x))


class Facts:
  """The numbers every hypothesis derives from one host Signature.

  Attributes (beyond the Signature itself, ``sig``): ``cfg`` (the
  thresholds), ``ctx`` (the :class:`Context`), ``work`` (the format name),
  ``u``, ``n``, ``ndiff``, ``share``, ``xor`` (bit histogram),
  ``nbits``, ``mant``, ``bits_per_diff``, ``rel_med``, ``rel_max``,
  ``rel_rms``, ``has_ref``, ``noise_ratio``, ``larger``, ``smaller``,
  ``dec`` (decomposed) and, decomposed, ``n_out``, ``n_beyond``,
  ``out_share``, ``beyond_share``, ``theta``, ``theta_g``, ``zmed_t``,
  ``zmed_g``.
  """

  def __init__(self, sig, work: str, context: Context | None = None,
               config: DetectorConfig = CONFIG):
    s = sig
    self.sig = sig
    self.cfg = config
    self.ctx = context or Context()
    self.work = work
    self.u = UNIT_ROUNDOFF[work]
    self.n = _i(s.n)
    self.ndiff = self.n - _i(s.n_bit_equal)
    self.share = self.ndiff / max(self.n, 1)
    self.xor = np.asarray(s.bits_xor).astype(np.int64)
    self.nbits = self.xor.shape[0]
    self.mant = _core.FORMATS[work].mantissa_bits
    self.bits_per_diff = self.xor.sum() / max(self.ndiff, 1)
    self.rel_med = float(np.asarray(s.rel_pct)[0])
    self.rel_max = _f(s.rel_max)
    self.rel_rms = _f(s.rel_rms)
    self.has_ref = bool(np.asarray(s.has_reference))
    self.noise_ratio = _f(s.noise_ratio) if self.has_ref else math.nan
    self.larger = _i(s.n_mag_larger)
    self.smaller = _i(s.n_mag_smaller)
    self.golden_rms = _f(s.golden_rms)
    self.dec = bool(np.asarray(s.decomposed))
    self.n_out = _i(s.n_out) if self.dec else 0
    self.n_beyond = _i(s.n_beyond) if self.dec else 0
    self.out_share = self.n_out / max(self.n, 1)
    self.beyond_share = self.n_beyond / max(self.n, 1)
    self.theta = _f(s.env_theta) if self.dec else math.nan
    self.theta_g = _f(s.env_theta_golden) if self.dec else math.nan
    self.zmed_t = _f(s.z_med_test) if self.dec else math.nan
    self.zmed_g = _f(s.z_med_golden) if self.dec else math.nan
    self.new_nonfinite = _i(s.n_nonfinite_new)

  def field_of_bit(self, k: int) -> str:
    """``sign``, ``exponent`` or ``mantissa``: the field of bit ``k``."""
    if k == self.nbits - 1:
      return "sign"
    return "exponent" if k >= self.mant else "mantissa"

  def fields_of(self, bits) -> str:
    """The fields of bit positions, comma-separated."""
    return ", ".join(sorted({self.field_of_bit(k) for k in bits})) or "none"

  @property
  def sparse_limit(self) -> float:
    """The most elements a sparse fault touches (sparse_share of the
    record, and min_pattern at least)."""
    return max(self.cfg.min_pattern, self.cfg.sparse_share * self.n)

  @property
  def biased(self) -> bool:
    """Whether the dense error (inside the envelope) is one-sided beyond
    what rounding to nearest leaves (|in_bias| >= biased, on at least
    biased_min_count elements)."""
    cfg = self.cfg
    inside = self.n - self.n_out
    return bool(self.dec and self.has_ref
                and inside >= cfg.biased_min_count
                and abs(_f(self.sig.in_bias)) >= cfg.biased)

  @property
  def scaled_max(self) -> float:
    """The largest relative error with the golden RMS as floor
    (``peat.analyzer.relative_to_scale``)."""
    return float(_analyzer.relative_to_scale(self.sig._asdict())["rel_max"])

  @property
  def wide(self) -> bool:
    """A 32- or 64-bit record (its envelope leaves many bits to test)."""
    return self.nbits >= WIDE_BITS


def working_sum_bound(f: Facts) -> float:
  """The relative error a K-term reduction kept in a wide record's own
  format reaches in any order: accumulation_level sqrt(K) u, level_octaves
  above; 0 without a reduction length or for a 16-bit record. A long
  reduction's golden kernel (XLA's blocked sums) can be far more accurate
  than a correct kernel that adds in order (a GEMM thread's accumulator
  over K = 65,536: ten times the golden error); within this level such a
  difference is another order, not a fault or a port's constant."""
  k = f.ctx.reduction
  if not k or f.work not in ("fp32", "fp64"):
    return 0.0
  cfg = f.cfg
  return (cfg.accumulation_level * math.sqrt(float(k)) * f.u
          * 2.0 ** cfg.level_octaves)


def within_working_sum(f: Facts) -> bool:
  """Whether the record's median relative error is within
  :func:`working_sum_bound`."""
  bound = working_sum_bound(f)
  return bool(bound > 0 and np.isfinite(f.rel_med) and f.rel_med <= bound)


def long_sum_bound(f: Facts) -> float:
  """:func:`working_sum_bound` of a long reduction (its level above
  long_sum_min_u u), where another correct order of the sum can reach far
  beyond the golden kernel's envelope; 0 for a shorter one."""
  bound = working_sum_bound(f)
  return bound if bound > f.cfg.long_sum_min_u * f.u else 0.0


def within_long_sum(f: Facts) -> bool:
  """:func:`within_working_sum` for a long reduction."""
  return bool(long_sum_bound(f) > 0 and within_working_sum(f))


def outliers_within_long_sum(f: Facts) -> bool:
  """Whether a long reduction's outliers (outputs whose terms cancel) are
  no further from golden, at the output's scale, than the working-sum
  level: another order's error, no fault confined to them."""
  return _outliers_within(f, long_sum_bound(f))


def _outliers_within(f: Facts, bound: float) -> bool:
  """Whether there are outliers, all finite and nonzero, none further
  from golden than ``bound`` x the golden RMS (a positive bound)."""
  s = f.sig
  return bool(f.n_out and bound > 0 and not _i(s.n_nonfinite_new)
              and not _i(s.n_out_zero)
              and _f(s.out_abs_max) <= bound * f.golden_rms)


def accumulator_format(f: Facts) -> str | None:
  """The narrow format a reduction site's running sum may be kept in: a
  16-bit site's own, or the one a float32 GEMM's or normalizing kernel's
  outputs are confined to (None: no reduction, or outputs not narrow)."""
  if not f.ctx.reduction or not (f.ctx.gemm or f.ctx.normalizing):
    return None
  fmt = f.work if f.work in ("bf16", "fp16") else narrowest(f)
  return fmt if fmt in ("bf16", "fp16") else None


def outliers_within_narrow_sum(f: Facts) -> bool:
  """Whether the outliers of a reduction kept in a narrow format are no
  further from golden than such an accumulator reaches (accumulation_tail
  K u(fmt) x the golden RMS): a narrow sum's tail, not a fault's values."""
  fmt = accumulator_format(f)
  return fmt is not None and _outliers_within(
      f, f.cfg.accumulation_tail * f.ctx.reduction * UNIT_ROUNDOFF[fmt])


def narrowest(f: Facts) -> str | None:
  """The coarsest narrow format the test output is confined to (at least
  repr_share of it representable there) and golden is not (repr_gap
  less), or None."""
  cfg = f.cfg
  repr_t = dict(zip(NARROW_FORMATS, map(float, f.sig.repr_test)))
  repr_g = dict(zip(NARROW_FORMATS, map(float, f.sig.repr_golden)))
  narrow = [k for k in NARROW_FORMATS if repr_t[k] >= cfg.repr_share
            and repr_g[k] <= repr_t[k] - cfg.repr_gap]
  return max(narrow, key=lambda k: UNIT_ROUNDOFF[k]) if narrow else None


def octaves(observed: float, predicted: float) -> float:
  """|log2(observed / predicted)| (inf when either is not positive)."""
  if not (observed > 0 and predicted > 0):
    return math.inf
  return abs(math.log2(observed / predicted))
