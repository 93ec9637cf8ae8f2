"""A KUT spec is parsed and checked once, where a campaign enters peat_jax.

``validate`` parses the spec string and checks it against its ``backward``
setting (``kernels.checked``); playback, runtime FI, the players and the
provenance get that object and neither parse nor check it again.
"""

import importlib.util
import os

import pytest

import peat_jax as peat
from peat_jax import kernels
from peat_jax.kernels import kut as kut_module

_spec = importlib.util.spec_from_file_location(
    "peat_old_campaign_tiny_once",
    os.path.join(os.path.dirname(os.path.dirname(__file__)), "old_campaign",
                 "tiny.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


def _counting(monkeypatch):
  calls = {"parse_kut": 0, "check_backward": 0}
  for name in calls:
    real = getattr(kut_module, name)

    def spy(*a, _real=real, _name=name, **k):
      calls[_name] += 1
      return _real(*a, **k)
    monkeypatch.setattr(kut_module, name, spy)
  return calls


def test_validate_parses_and_checks_the_spec_once(tmp_path, monkeypatch):
  """With the KUT's VJP at the backward sites (test_campaign.py has the
  forward-only case for parsing): playback, runtime FI and provenance get
  the checked spec."""
  calls = _counting(monkeypatch)
  paths = peat.validate(tiny.get_task(), "native:matmul:in_bf16", tmp_path,
                        steps=4, checkpoint_every=2, frequencies=("every",),
                        runtime_steps=2, isolate=False, backward="kut",
                        progress=None)
  assert paths.verdict in ("warn", "fail")
  assert calls == {"parse_kut": 1, "check_backward": 1}


def test_a_checked_spec_is_handed_down_as_is(monkeypatch):
  kut = kernels.checked("native:matmul:in_bf16", "kut")
  calls = _counting(monkeypatch)
  assert kernels.checked(kut, "kut") is kut
  assert calls == {"parse_kut": 0, "check_backward": 0}
  with pytest.raises(peat.PeatError, match="checked for backward='kut'"):
    kernels.checked(kut, "golden")
  with pytest.raises(peat.PeatError, match="kernel='softmax' does not"):
    kernels.checked(kut, "kut", kernel="softmax")


def test_an_ffi_kut_without_a_backward_target_is_refused_at_the_entry(
    tmp_path, escape_lib):
  """backward='kut' needs the backward target: the campaign says so before
  any golden training, not when a backward site is traced."""
  spec = kernels.parse_kut(f"ffi:{escape_lib}:EscMatmul", kernel="dot_general")
  with pytest.raises(peat.PeatError, match="names no backward target"):
    peat.validate(tiny.get_task(), spec, tmp_path / "c", steps=4,
                  checkpoint_every=2, backward="kut", isolate=False,
                  progress=None)
  assert not (tmp_path / "c" / peat.profiler.GOLDEN_DIR).exists()
