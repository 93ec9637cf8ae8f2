"""``assert_records_close``: campaign records compared across machines.

Two machines of one kind (same core count, same jaxlib) may still round a
golden kernel differently: another processor's vector paths change the low
bits of XLA's dots and transcendental functions. Records made on one
machine and read on another therefore agree exactly only in what does not
depend on those bits. Measured between two x86-64 CPUs (an Intel one that
made tests/profiler/playback_fi/records_fixture and an AMD EPYC), on records of
bf16-level kernels under test: models, verdicts, structure and element
counts equal; the KUT's error statistics within 6%; golden's own distance
to float64 (the noise floor, and all that is scaled by it) up to 1.9x apart;
bit-position histograms up to 43% apart.

The rule, one class per field (:data:`FIELD_CLASSES`):

* ``exact``: structure (keys, list lengths), strings, booleans, models and
  verdicts, and integers that count structural facts (elements, NaN and
  Inf, zeros, saturated values, shifts). Evidence sentences are compared
  with their numbers masked.
* ``value``: golden's own outputs and the losses: relative ``2**-16``.
* ``error``: the pseudo-error against golden or the float64 reference, the
  port probe's distances, the effect on a step: magnitudes within a
  factor ``1.25``, bounded statistics (shares, correlations, biases) within
  ``0.05`` absolute, counts within ``1%`` of the elements plus 4.
* ``rounding``: the machine's own rounding (golden against float64, the
  envelope calibrated on it, the noise ratio, bit-position and ULP
  histograms, bitwise-equality counts): magnitudes and counts within a
  factor ``4`` (counts plus 8), shares within ``0.25`` absolute, and the
  maximum and mean of golden's relative error (dominated by elements near
  zero) within a factor ``16``.

A field no class names fails the comparison: a new field is classified on
purpose, never compared by accident.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

#: Relative tolerance of ``value`` fields.
VALUE_RTOL = 2.0 ** -16
#: Largest ratio between two magnitudes of an ``error`` field.
ERROR_FACTOR = 1.25
#: Largest difference of a bounded ``error`` statistic (share, bias, r2).
ERROR_ATOL = 0.05
#: ``error`` counts: within this share of the record's elements, plus 4.
ERROR_COUNT_SHARE = 0.01
#: Largest ratio between two magnitudes or counts of a ``rounding`` field.
ROUNDING_FACTOR = 4.0
#: Largest ratio between two maxima of golden's relative error.
ROUNDING_EXTREME_FACTOR = 16.0
#: Largest difference of a bounded ``rounding`` statistic.
ROUNDING_ATOL = 0.25

_EXACT = """
kind kut step site kernel phase reduction backward port.model port.name
port.explains port.tried port.carried_from port.rounding port.where
decided_by diagnosis.model
diagnosis.verdict
diagnosis.secondary.model name
n n_nan_test n_nan_golden n_inf_test n_inf_golden n_finite_pairs
n_nonfinite_new n_zeroed n_flushed n_golden_subnormal n_saturated
n_saturated_fp16 n_saturated_fp8_e4m3 n_golden_zero n_overflow dtype_code
is_permutation best_shift_col best_shift_row has_reference decomposed
n_nonfinite_mismatch n_tiny n_tiny_zeroed n_out_zero n_rounded base_format
base_candidate base_mode base_explained base_ties n_golden_explained
"""
_VALUE = "golden_absmax golden_rms loss_golden"
#: Magnitudes of the pseudo-error (a factor apart at most).
_ERROR_MAGNITUDE = """
abs_max abs_mean abs_rms rel_max rel_mean rel_rms scale scale_spread
ref_test_abs_max ref_test_abs_rms ref_test_rel_mean zeroed_golden_absmax
z_max_test out_abs_max in_rel_rms fit_delta fit_resid rel_max_test
out_err_sum out_sorted_err
abs_pct rel_pct port.distance port.ratio port.reference_distance
grad_rel_diff update_rel_diff loss_kut diagnosis.confidence
diagnosis.secondary.confidence
"""
#: Bounded (or centred) statistics of the pseudo-error.
_ERROR_BOUNDED = """
share_differ bias mag_bias err_slope err_corr transpose_share
ref_test_shrunk ref_test_grown out_transpose in_bias value_r2
balance_test null_flips
"""
#: Counts of elements by the size or sign of their error.
_ERROR_COUNT = """
n_sign_flip n_err_pos n_err_neg n_mag_larger n_mag_smaller n_beyond n_out
n_out_flip1 n_out_flip2 n_out_flip3 n_out_far n_out_clear n_shoulder
n_out_exact_flips
n_out_moved n_out_matched out_shift_n n_small
n_small_err_test
"""
#: The machine's own rounding, and what is measured in its units.
_ROUNDING_MAGNITUDE = """
ref_golden_abs_max ref_golden_abs_rms noise_ratio
env_theta env_theta_golden env_golden_z z_med_test z_med_golden
"""
#: The maximum and the mean of golden's relative error: over elements near
#: zero one element's last bit moves the ratio several times, and the mean
#: with it (under XLA:CPU's AVX code path instead of AVX2 the GPT backward
#: fixture's mean moved 5.1x: 1.84e-06 -> 3.60e-07).
_ROUNDING_EXTREME = "rel_max_golden ref_golden_rel_mean"

_ROUNDING_BOUNDED = """
share_test_closer share_golden_closer ref_golden_shrunk ref_golden_grown
balance_golden
"""
_ROUNDING_COUNT = """
n_bit_equal n_value_equal n_small_err_golden n_ulps_test n_ulps_golden
ulp_hist bits_xor
"""

#: field name (dotted below a record: ``port.ratio``; signature fields by
#: their own name) -> (class, kind), kind one of ``exact``, ``magnitude``,
#: ``bounded``, ``count``, ``extreme``, ``signed``.
FIELD_CLASSES: dict[str, tuple[str, str]] = {}
for _names, _cls, _kind in (
    (_EXACT, "exact", "exact"), (_VALUE, "value", "magnitude"),
    (_ERROR_MAGNITUDE, "error", "magnitude"),
    (_ERROR_BOUNDED, "error", "bounded"), (_ERROR_COUNT, "error", "count"),
    (_ROUNDING_MAGNITUDE, "rounding", "magnitude"),
    (_ROUNDING_EXTREME, "rounding", "extreme"),
    (_ROUNDING_BOUNDED, "rounding", "bounded"),
    (_ROUNDING_COUNT, "rounding", "count")):
  for _name in _names.split():
    assert _name not in FIELD_CLASSES, _name
    FIELD_CLASSES[_name] = (_cls, _kind)
#: The signed mean error, compared in units of the record's RMS error.
FIELD_CLASSES["err_mean"] = ("error", "signed")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _key(path: Sequence[str]) -> str:
  """The class key of a field: signature fields by name, others dotted."""
  if len(path) >= 2 and path[-2] == "signature":
    return path[-1]
  return ".".join(p for p in path if p not in ("signature",))


def _within(cls: str, kind: str, a: float, b: float, n: float) -> bool:
  if a == b or (math.isnan(a) and math.isnan(b)):
    return True
  if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
    return False
  if cls == "value":
    return abs(a - b) <= VALUE_RTOL * max(abs(a), abs(b))
  if kind == "bounded":
    return abs(a - b) <= (ERROR_ATOL if cls == "error" else ROUNDING_ATOL)
  if kind == "count":
    if cls == "error":
      return abs(a - b) <= ERROR_COUNT_SHARE * n + 4
    lo, hi = sorted((abs(a), abs(b)))
    return hi <= ROUNDING_FACTOR * lo + 8
  factor = {"error": ERROR_FACTOR, "rounding": ROUNDING_FACTOR}[cls]
  if kind == "extreme":
    factor = ROUNDING_EXTREME_FACTOR
  if (a > 0) != (b > 0):
    return False
  lo, hi = sorted((abs(a), abs(b)))
  return hi <= factor * lo


def _compare(exp: Any, got: Any, path: list[str], record: Mapping,
             bad: list[str]) -> None:
  where = ".".join(path) or "<record>"
  if isinstance(exp, Mapping):
    if not isinstance(got, Mapping):
      bad.append(f"{where}: expected a mapping, got {type(got).__name__}")
      return
    if set(exp) != set(got):
      bad.append(f"{where}: keys differ: only expected "
                 f"{sorted(set(exp) - set(got))}, only actual "
                 f"{sorted(set(got) - set(exp))}")
    for k in sorted(set(exp) & set(got)):
      _compare(exp[k], got[k], path + [str(k)], record, bad)
    return
  key = _key(path)
  if key.endswith("evidence"):
    if _NUMBER.sub("#", str(exp)) != _NUMBER.sub("#", str(got)):
      bad.append(f"{where}: evidence differs beyond its numbers:\n  "
                 f"expected {exp!r}\n  actual   {got!r}")
    return
  if isinstance(exp, (list, tuple)) and exp and isinstance(
      exp[0], Mapping):
    if not isinstance(got, (list, tuple)) or len(got) != len(exp):
      bad.append(f"{where}: expected {len(exp)} entries, got "
                 f"{len(got) if isinstance(got, (list, tuple)) else got!r}")
      return
    for i, (e, g) in enumerate(zip(exp, got)):
      _compare(e, g, path + [f"[{i}]"], record, bad)
    return
  cls, kind = FIELD_CLASSES.get(key, (None, None))
  if cls is None:
    bad.append(f"{where}: field {key!r} has no class in peat_jax.testing's "
               "FIELD_CLASSES (classify it: exact, value, error or rounding)")
    return
  if cls == "exact" or isinstance(exp, (str, bool)) or exp is None:
    if exp != got:
      bad.append(f"{where}: expected {exp!r}, got {got!r}")
    return
  seq_e = list(exp) if isinstance(exp, (list, tuple)) else [exp]
  seq_g = list(got) if isinstance(got, (list, tuple)) else [got]
  if len(seq_e) != len(seq_g):
    bad.append(f"{where}: expected {len(seq_e)} values, got {len(seq_g)}")
    return
  sig = record.get("signature", record)
  n = float(sig.get("n", 0)) if isinstance(sig, Mapping) else 0.0
  for i, (a, b) in enumerate(zip(seq_e, seq_g)):
    a, b = float(a), float(b)
    if kind == "signed":
      scale = float(sig.get("abs_rms", 0.0)) or 1.0
      ok = abs(a - b) <= ERROR_ATOL * scale
    else:
      ok = _within(cls, kind, a, b, n)
    if not ok:
      at = f"[{i}]" if len(seq_e) > 1 else ""
      bad.append(f"{where}{at}: expected {a!r}, got {b!r} (a {cls} "
                 f"{kind} field: {_rule(cls, kind)})")


def _rule(cls: str, kind: str) -> str:
  if cls == "value":
    return f"relative {VALUE_RTOL:.3g}"
  if kind == "signed":
    return f"within {ERROR_ATOL} of the record's RMS error"
  if kind == "bounded":
    return f"absolute {ERROR_ATOL if cls == 'error' else ROUNDING_ATOL}"
  if kind == "count":
    return (f"within {ERROR_COUNT_SHARE:.0%} of the elements + 4"
            if cls == "error" else f"within a factor {ROUNDING_FACTOR:g} + 8")
  if kind == "extreme":
    return f"within a factor {ROUNDING_EXTREME_FACTOR:g}"
  return f"within a factor {ERROR_FACTOR if cls == 'error' else ROUNDING_FACTOR:g}"


def records_differences(expected: Sequence[Mapping],
                        actual: Sequence[Mapping]) -> list[str]:
  """Where ``actual`` records leave ``expected`` beyond the tolerances.

  Args:
    expected: records (``peat.profiler.read_records``) made on one machine.
    actual: the same campaign's records made on another (or the same).

  Returns:
    One line per difference (empty when they agree), naming the record,
    the field, both values and the rule applied.
  """
  bad: list[str] = []
  if len(expected) != len(actual):
    return [f"expected {len(expected)} records, got {len(actual)}"]
  for i, (e, a) in enumerate(zip(expected, actual)):
    found: list[str] = []
    _compare(e, a, [], e, found)
    label = f"record {i} ({e.get('kind', '?')} {e.get('site', '')} step " \
            f"{e.get('step', '?')})"
    bad.extend(f"{label}: {line}" for line in found)
  return bad


def assert_records_close(expected: Sequence[Mapping],
                         actual: Sequence[Mapping]) -> None:
  """Asserts two campaigns' records agree as two machines' records can.

  Exact on what no rounding moves (structure, names, models, verdicts,
  element counts), within the module's stated tolerances on the rest (see
  the module docstring and :data:`FIELD_CLASSES`). Bitwise determinism on
  one machine is a stronger check: compare the record files' bytes there.

  >>> import peat_jax as peat
  >>> old = peat.profiler.read_records("fixture/playback.msgpack")  # doctest: +SKIP
  >>> new = peat.profiler.read_records(d / "playback.msgpack")      # doctest: +SKIP
  >>> peat.testing.assert_records_close(old, new)                   # doctest: +SKIP

  Args:
    expected: records made on one machine (a stored fixture).
    actual: the same campaign's records made here.

  Raises:
    AssertionError: with every difference, one per line.
  """
  bad = records_differences(expected, actual)
  if bad:
    shown = "\n".join(bad[:40])
    more = f"\n... and {len(bad) - 40} more" if len(bad) > 40 else ""
    raise AssertionError(f"{len(bad)} differences beyond the cross-machine "
                         f"tolerances:\n{shown}{more}")
