"""The Detector as hypotheses over one frozen config.

Every threshold lives in ``DetectorConfig`` with its basis and derivation,
the rules read it from the call's config (no bare number in a
comparison), no function of the Detector grows a long cascade of
branches, every error model has a hypothesis that names it, and
docs/detector.md's tables are generated from the code.
"""

import ast
import dataclasses
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import detector
from peat_jax.detector.facts import _config  # pylint: disable=protected-access

ROOT = pathlib.Path(__file__).resolve().parents[2]
DETECTOR = ROOT / "peat_jax" / "detector"
#: The Detector's rule modules (the calibration generators aside).
RULES = sorted(p for p in DETECTOR.glob("*/_*.py")
               if p.parent.name != "calibration" and p.stem != "__init__")
#: Numbers a comparison may hold bare: signs, counts, an empty record.
NEUTRAL = {0, 1, -1, 2}
#: The most branches a function of the Detector may hold.
MAX_BRANCHES = 25


def _numbers(node):
  for n in ast.walk(node):
    if (isinstance(n, ast.Constant) and not isinstance(n.value, bool)
        and isinstance(n.value, (int, float))):
      yield n


def _branches(fn) -> int:
  n = 1
  for node in ast.walk(fn):
    if isinstance(node, (ast.If, ast.For, ast.While, ast.ExceptHandler,
                         ast.IfExp)):
      n += 1
    elif isinstance(node, ast.BoolOp):
      n += len(node.values) - 1
    elif isinstance(node, ast.comprehension):
      n += 1 + len(node.ifs)
  return n


def test_every_threshold_has_a_basis_and_a_derivation():
  fields = dataclasses.fields(detector.DetectorConfig)
  assert len(fields) >= 40
  for f in fields:
    basis, why = _config.derivation(f.name)
    assert basis in (_config.FACT, _config.CALIBRATION), f.name
    assert len(why.split()) >= 8, (f.name, why)
    if basis == _config.CALIBRATION:  # names the measurement it rests on
      assert re.search(r"measured|calibration|tests/|seeds|sweep", why), (
          f.name, why)


def test_the_config_is_frozen_and_each_call_reads_its_own():
  with pytest.raises(dataclasses.FrozenInstanceError):
    detector.CONFIG.benign_noise_ratio = 1.0  # type: ignore[misc]
  rng = np.random.default_rng(3)
  a = rng.standard_normal((96, 160)).astype(np.float32)
  b = rng.standard_normal((160, 64)).astype(np.float32)
  g = a @ b
  t = a[:, :80] @ b[:80] + a[:, 80:] @ b[80:]  # another order of the sum
  r = a.astype(np.float64) @ b.astype(np.float64)
  sig = peat.analyze(jnp.asarray(t), jnp.asarray(g), reference=r)
  ratio = float(np.asarray(sig.noise_ratio))
  assert 0.0 < ratio <= detector.CONFIG.benign_noise_ratio
  d = peat.detect(sig)
  assert (d.model, d.verdict) == ("reordering", "pass")
  strict = dataclasses.replace(detector.CONFIG, benign_noise_ratio=ratio / 2)
  d = peat.detect(sig, config=strict)
  assert (d.model, d.verdict) == ("reordering", "warn")


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.stem)
def test_no_bare_threshold_in_a_comparison(path):
  tree = ast.parse(path.read_text(encoding="utf-8"))
  bare = [f"{path.name}:{n.lineno}: {n.value}"
          for node in ast.walk(tree) if isinstance(node, ast.Compare)
          for n in _numbers(node) if n.value not in NEUTRAL]
  assert not bare, "thresholds belong in DetectorConfig:\n" + "\n".join(bare)


@pytest.mark.parametrize(
    "path", sorted(p for p in DETECTOR.glob("*/_*.py")
                   if p.stem != "__init__"), ids=lambda p: p.stem)
def test_no_function_is_a_long_cascade(path):
  tree = ast.parse(path.read_text(encoding="utf-8"))
  long = [f"{path.name}:{fn.name} ({_branches(fn)} branches)"
          for fn in ast.walk(tree)
          if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
          and _branches(fn) > MAX_BRANCHES]
  assert not long, "\n".join(long)


def test_every_hypothesis_reads_thresholds_of_the_config():
  names = {f.name for f in dataclasses.fields(detector.DetectorConfig)}
  for h in detector.HYPOTHESES:
    assert h.role in ("fault", "base"), h
    assert h.scope in ("plain", "any", "residual"), h
    assert set(h.thresholds) <= names, (h.name, set(h.thresholds) - names)
    assert len(h.predicts.split()) >= 8, h.name


def test_every_error_model_has_a_hypothesis():
  named = " / ".join(h.models for h in detector.HYPOTHESES)
  for model in ("reordering", "precision", "accumulation", "truncation",
                "ftz", "saturation", "bitflip", "stuck_at", "random_value",
                "zero", "nan", "lane", "indexing", "scale", "parameter",
                "approximation", "unknown"):
    assert re.search(rf"\b{model}\b", named), model
