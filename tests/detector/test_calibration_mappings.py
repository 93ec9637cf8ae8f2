"""A calibration compiles thousands of shapes in one process (the full run
reached 47,327 of Linux's 65,530 memory mappings): between cases it gives
the executables back once half the limit is used, and its diagnoses are
the same whether or not it had to.

Fresh seeded inputs, float64 references.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from peat_jax import detector
from peat_jax.core import PeatError
from peat_jax.core import _mappings
from peat_jax.detector.calibration import _calibration as cal  # pylint: disable=protected-access


def _cases():
  out = []
  for seed, (m, k, n) in enumerate([(16, 24, 16), (8, 40, 40)]):
    rng = np.random.default_rng(900 + seed)
    a = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32))
    b = jnp.asarray((0.2 * rng.standard_normal((k, n))).astype(np.float32))
    out.append(cal.CalibrationCase("matmul", f"random:{seed}", jnp.matmul,
                                   (a, b), reduction=k))
  return out


def _past_the_limit(monkeypatch, tmp_path) -> list:
  """A mapping limit this process is always past; the calls of
  jax.clear_caches (the real one) are counted in the list returned."""
  limit = tmp_path / "max_map_count"
  limit.write_text("64\n")
  monkeypatch.setattr(_mappings, "_LIMIT", str(limit))
  cleared = []
  real = jax.clear_caches
  monkeypatch.setattr(jax, "clear_caches",
                      lambda: (cleared.append(1), real())[1])
  return cleared


def _run(cases):
  return cal.run_calibration(cases, dtypes=("float32",), seeds=(0,),
                             native=False, compute=False).records


@pytest.mark.parametrize("runner", [detector.run_calibration,
                                    detector.run_composed_calibration])
@pytest.mark.parametrize("dtypes, message", [
    ((), r"dtypes=\(\)"), (("float32", "fp16"), r"unknown: \['fp16'\]")])
def test_no_or_unknown_dtypes_are_named_before_any_work(runner, dtypes,
                                                        message):
  with pytest.raises(PeatError, match=message):
    runner(_cases(), dtypes=dtypes)


def test_nothing_to_summarize_is_named():
  with pytest.raises(PeatError, match="no calibration records"):
    cal.summarize([])


@pytest.mark.slow  # compiles two cases' diagnoses twice (~40 s)
def test_diagnoses_are_the_same_after_a_release(monkeypatch, tmp_path):
  cases = _cases()
  plain = _run(cases)
  cleared = _past_the_limit(monkeypatch, tmp_path)
  released = _run(cases)
  # Each case starts by releasing; the Analyzer's entry points release
  # too after a call that compiled (peat_jax.analyzer.signature._api).
  assert len(cleared) >= len(cases)
  # Everything the plain run compiled was compiled again: same records.
  assert len(plain) >= 30  # the injections of two float32 cases
  assert released == plain
