"""Verdict provenance (profiler/_provenance.py) and its report statement."""

import hashlib
import os

import jax
import pytest

import peat_jax as peat
from peat_jax import kernels
from peat_jax import report
from peat_jax.kernels import kut
from peat_jax.profiler.campaigns import _provenance


def _sha(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_native_kut_hash_is_its_library():
  spec = kut.as_spec("native:matmul:in_bf16@16")
  entry = _provenance.kut_entry(spec)
  lib = kernels.library_path(kernels.jax_platform())
  assert entry["content"]["files"] == [{"path": lib, "sha256": _sha(lib)}]
  assert entry["content"]["sha256"] == hashlib.sha256(
      _sha(lib).encode()).hexdigest()
  assert (entry["variant"], entry["tile"]) == ("in_bf16", 16)
  assert _provenance.kut_entry(kut.as_spec("golden"))["content"] is None


def _helper(x):
  return x


def _user_matmul(lhs, rhs, **params):
  return _helper(jax.lax.dot_general_p.bind(lhs, rhs, **params))


def test_registered_kut_hash_covers_its_module(tmp_path):
  kut.register_kut("test:provenance_matmul", _user_matmul,
                   kernel="dot_general")
  entry = _provenance.kut_entry(kut.as_spec("test:provenance_matmul"))
  files = [f["path"] for f in entry["content"]["files"]]
  assert files == [os.path.abspath(__file__)]
  assert entry["content"]["files"][0]["sha256"] == _sha(__file__)
  # Another module's content, another hash.
  other = tmp_path / "user_kut.py"
  other.write_text("import jax\n\ndef kut(lhs, rhs, **p):\n"
                   "  return jax.lax.dot_general_p.bind(lhs, rhs, **p)\n")
  ns = {}
  exec(compile(other.read_text(), str(other), "exec"), ns)
  kut.register_kut("test:provenance_other", ns["kut"], kernel="dot_general")
  e2 = _provenance.kut_entry(kut.as_spec("test:provenance_other"))
  assert [f["path"] for f in e2["content"]["files"]] == [str(other)]
  assert e2["content"]["sha256"] != entry["content"]["sha256"]


def test_xla_flags_split_by_numerics():
  known, other = _provenance.xla_flags(
      "--xla_cpu_enable_fast_math=true --xla_dump_to=/tmp/x "
      "--xla_force_host_platform_device_count=8 "
      "--xla_gpu_deterministic_ops=true")
  assert known == ["--xla_cpu_enable_fast_math=true",
                   "--xla_force_host_platform_device_count=8",
                   "--xla_gpu_deterministic_ops=true"]
  assert other == ["--xla_dump_to=/tmp/x"]
  assert _provenance.xla_flags("") == ([], [])


def test_versions_and_platform_are_this_process():
  v = _provenance.versions_entry()
  assert v["jax"] == jax.__version__ and v["peat_jax"] == peat.__version__
  assert v["jaxlib"] and isinstance(v["xla_flags"], list)
  p = _provenance.platform_entry()
  assert p["backend"] == jax.default_backend()
  assert p["device_count"] == jax.device_count() >= 1


def test_provenance_without_a_stored_file_comes_from_the_records():
  records = [{"site": "fwd/dot_general:0", "kernel": "dot_general",
              "phase": "fwd", "step": s} for s in (4, 0)]
  runs = [{"frequency": "every call", "steps": [0, 1, 2], "crashed": False},
          {"frequency": "every 4th step", "steps": [], "crashed": True}]
  prov = _provenance.provenance({}, "native:matmul:default", records, runs)
  assert prov["kut"] == {"spec": "native:matmul:default"}
  assert prov["platform"] == {} and prov["versions"] == {}
  assert prov["sites"] == [{"site": "fwd/dot_general:0",
                            "kernel": "dot_general", "phase": "fwd"}]
  assert prov["checkpoint_steps"] == [0, 4]
  assert prov["frequencies"] == ["every call"]  # the crashed run covers none
  assert prov["runtime_steps"] == [0, 2]
  text = report.covers_sentence(prov)
  assert "an unrecorded platform" in text and "unrecorded versions" in text
  assert text.endswith("were not exercised.")
  lines = report.provenance_lines(prov)
  assert "site fwd/dot_general:0: inputs not recorded" in lines


def test_phases_and_backward_setting():
  fwd = {"site": "fwd/dot_general:0", "kernel": "dot_general",
         "phase": "fwd", "step": 0}
  bwd = dict(fwd, site="bwd/dot_general:0", phase="bwd")
  stored = {"kut": {"spec": "native:matmul:in_bf16"},
            "sites": [{"site": fwd["site"], "kernel": "dot_general",
                       "phase": "fwd", "in_shapes": [[4, 8], [8, 2]],
                       "in_dtypes": ["float32", "float32"]}]}
  run = [{"frequency": "every call", "steps": [0, 1], "crashed": False}]
  # The KUT's VJP: the backward records' phase and the setting.
  prov = _provenance.provenance(stored, "native:matmul:in_bf16",
                                [fwd, bwd], run, backward="kut")
  assert prov["phases"] == ["bwd", "fwd"] and prov["backward"] == "kut"
  assert [s["site"] for s in prov["sites"]] == [fwd["site"], bwd["site"]]
  text = report.covers_sentence(prov)
  assert ("in phases bwd, fwd (the KUT's VJP at the backward sites)"
          in text)
  assert "(1 distinct kernel signatures)" in text
  # Forward records only, golden backward: one phase, said so.
  prov = _provenance.provenance(stored, "native:matmul:in_bf16", [fwd], run)
  assert prov["phases"] == ["fwd"] and prov["backward"] == "golden"
  assert ("in phase fwd (the golden kernel at the backward sites)"
          in report.covers_sentence(prov))
  # No playback record (every checkpoint crashed) but runtime FI ran the
  # KUT's VJP: both phases are covered.
  prov = _provenance.provenance(stored, "native:matmul:in_bf16", [], run,
                                backward="kut")
  assert prov["phases"] == ["bwd", "fwd"]
  prov = _provenance.provenance(stored, "native:matmul:in_bf16", [], [],
                                backward="kut")
  assert prov["phases"] == ["fwd"]


def test_py_kut_hash_covers_its_module(byo):
  spec = kut.as_spec("py:byo_model:layer_norm", "layer_norm")
  content = _provenance.kut_entry(spec)["content"]
  path = str(byo / "byo_model.py")
  assert content["files"] == [{"path": path, "sha256": _sha(path)}]


def test_ffi_kut_hash_is_its_library(tmp_path):
  lib = tmp_path / "libmine.so"
  lib.write_bytes(b"\x7fELF one build")
  spec = kut.KutSpec(f"ffi:{lib}:Mine@dot_general", "ffi", "dot_general",
                     "default", None, "dot_general", (str(lib), "Mine", None))
  first = _provenance.kut_entry(spec)["content"]
  assert first["files"] == [{"path": str(lib), "sha256": _sha(lib)}]
  lib.write_bytes(b"\x7fELF another build")   # rebuilt: another hash
  assert _provenance.kut_entry(spec)["content"]["sha256"] != first["sha256"]
  lib.unlink()
  with pytest.raises(peat.PeatError, match="cannot hash the code of KUT"):
    _provenance.kut_entry(spec)


def test_write_keeps_earlier_environments(tmp_path):
  first = {"kut": {"spec": "golden"}, "platform": {"backend": "cpu"},
           "versions": {"jax": "0.1"}, "sites": []}
  _provenance.write(str(tmp_path), first)
  assert _provenance.read(str(tmp_path)) == first
  second = dict(first, versions={"jax": "0.2"})
  _provenance.write(str(tmp_path), second)
  got = _provenance.read(str(tmp_path))
  assert got["versions"] == {"jax": "0.2"}
  assert got["earlier"] == [{"platform": {"backend": "cpu"},
                             "versions": {"jax": "0.1"}}]
  (tmp_path / _provenance.PROVENANCE_FILE).write_text("[1, 2")
  with pytest.raises(peat.PeatError, match="not readable JSON"):
    _provenance.read(str(tmp_path))
