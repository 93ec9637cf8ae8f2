"""The error models' glossary: every name the Detector gives has an entry,
and the verdict the entry states is the one the Detector gives
(``model_verdict`` on real records' facts, both sides of a conditional
rule)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import detector
from peat_jax.detector import facts
from peat_jax.detector.hypotheses import _rank
from peat_jax.detector.verdicts import _glossary


def test_every_model_the_detector_gives_has_one_entry():
  assert set(_glossary.names()) == set(detector.GLOSSARY)
  for name, e in detector.GLOSSARY.items():
    assert e.meaning and e.look_at, name
    assert detector.verdict_of(name).split()[0].strip(";(") in (
        "pass", "warn", "fail"), name


def test_a_suffixed_name_reads_its_family():
  assert detector.glossary_entry("precision:tf32").name == "precision"
  assert detector.glossary_entry("accumulation:bf16").name == "accumulation"
  with pytest.raises(KeyError, match="unknown error model 'teleport'"):
    detector.glossary_entry("teleport")


def test_the_verdict_rule_names_every_threshold_it_reads():
  text = detector.verdict_rule()
  cfg = detector.CONFIG
  for name in ("benign_noise_ratio", "formula_fail_level",
               "reordering_envelope", "BF16_PROXY_LIMIT",
               "BENIGN_TRAINING_LIMIT"):
    assert f"`{name}`" in text, name
  assert f"{cfg.benign_noise_ratio:g}x" in text


def _facts():
  """Facts of two seeded matmul records against float64: rounding-size
  noise (a tenth of the elements one ulp off) and a 1% error."""
  rng = np.random.default_rng(11)
  x = rng.standard_normal((64, 96)).astype(np.float32)
  w = rng.standard_normal((96, 48)).astype(np.float32)
  g = np.asarray(jnp.asarray(x) @ jnp.asarray(w))
  r = peat.reference_matmul(x, w)
  moved = np.where(rng.random(g.shape) < 0.1,
                   np.nextafter(g, np.float32(np.inf)), g)
  out = []
  for t in (moved, (g * np.float32(1.01)).astype(np.float32)):
    s = facts.host_signature(peat.analyze(t, g, r))
    out.append(facts.Facts(s, "fp32", facts.Context.of(None),
                           detector.CONFIG))
  return out


@pytest.mark.parametrize("name", [
    "precision:bf16" if n == "precision" else
    "accumulation:bf16" if n == "accumulation" else n
    for n in detector.GLOSSARY if n not in detector.INVARIANCE_MODELS])
def test_the_verdict_a_record_gets_is_the_one_its_entry_states(name):
  """model_verdict, on real records' facts, gives a verdict the entry's
  sentence names (both sides of a conditional rule: small and large)."""
  for f in _FACTS():
    v = _rank.model_verdict(name, f)
    assert v in detector.verdict_of(name), (name, v, f.noise_ratio)


_FACTS = functools.lru_cache(maxsize=None)(_facts)
