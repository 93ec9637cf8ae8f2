"""The error models' glossary: every name the Detector gives has an entry,
and the verdict the entry states is the one records of that model get."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import detector
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


def _records():
  """(name, test, golden, reference) of seeded records of several models."""
  rng = np.random.default_rng(11)
  x = rng.standard_normal((64, 96)).astype(np.float32)
  w = rng.standard_normal((96, 48)).astype(np.float32)
  g = np.asarray(jnp.asarray(x) @ jnp.asarray(w))
  r = peat.reference_matmul(x, w)
  key = jax.random.key(3)
  out = [("exact", g.copy(), g, r)]
  for model, params in (("bitflip", {"count": 3}), ("zero", {"count": 40}),
                        ("precision:bf16", {}), ("scale", {"factor": 1.5}),
                        ("stuck_at", {"bit": 20, "value": 1})):
    out.append((model, np.asarray(peat.inject(model, key, g, **params)), g,
                r))
  v = rng.standard_normal((64, 96)).astype(np.float32) * 2
  ge = np.asarray(jax.nn.gelu(v, approximate=False))
  gt = np.asarray(jax.nn.gelu(v, approximate=True))
  out.append(("gelu tanh for erf", gt, ge,
              peat.reference(lambda a: jax.nn.gelu(a, approximate=False), v)))
  return out


def test_each_records_verdict_is_the_one_its_entry_states():
  seen = set()
  for label, t, g, r in _records():
    d = peat.detect(peat.analyze(t, g, r))
    rule = detector.verdict_of(d.model)
    assert d.verdict in rule, (label, d.model, d.verdict, rule)
    seen.add(d.verdict)
  assert seen == {"pass", "warn", "fail"}
