"""The persistent compilation cache (peat_jax.core.use_compilation_cache): a second
process loads what the first compiled, with the same results, and worker
processes inherit it."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from peat_jax import core
from peat_jax.core import PeatError

# One process: the cache in argv[1], a real record analyzed and diagnosed
# (the Analyzer's executables), or with argv[2] == "playback" a CNN golden
# run and the playback of its first checkpoint under a native KUT; prints
# the cache's events and what was computed, as JSON.
_SCRIPT = textwrap.dedent('''
    import collections, hashlib, json, os, sys, tempfile
    import numpy as np
    from jax import monitoring
    import peat_jax as peat
    from peat_jax import core
    events = collections.Counter()
    monitoring.register_event_listener(
        lambda name, **kw: events.update([name]))
    core.use_compilation_cache(sys.argv[1])
    if sys.argv[2] == "analyze":
      rng = np.random.default_rng(3)
      a = rng.standard_normal((96, 80))
      b = rng.standard_normal((80, 72))
      ref = a @ b
      gold = (a.astype(np.float32) @ b.astype(np.float32))
      test = gold.copy()
      test[5, 7] *= 2.0  # one element doubled: a fault to diagnose
      sig = peat.analyze(test, gold, ref)
      diag = peat.detect(sig)
      out = {"model": diag.model, "verdict": diag.verdict,
             "noise_ratio": float(sig.noise_ratio).hex(),
             "n_out": int(sig.n_out)}
    else:
      from peat_jax import models
      task = models.get_task("cnn")
      work = tempfile.mkdtemp()
      g = peat.golden_train(task, os.path.join(work, "golden"), steps=2,
                            checkpoint_every=1, evaluate=False)
      peat.playback(task, g.workdir, "native:conv2d:in_bf16",
                    campaign_dir=work, steps=[g.steps[0]])
      with open(os.path.join(work, "playback.msgpack"), "rb") as f:
        out = {"records": hashlib.sha256(f.read()).hexdigest()}
    hits = events["/jax/compilation_cache/cache_hits"]
    misses = events["/jax/compilation_cache/cache_misses"]
    print(json.dumps({"hits": hits, "misses": misses, "out": out}))
''')


def _run(cache: str, what: str) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in sys.path if p and os.path.isdir(p)))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  got = subprocess.run([sys.executable, "-c", _SCRIPT, cache, what],
                       capture_output=True, text=True, env=env, timeout=900,
                       check=False)
  assert got.returncode == 0, got.stderr[-3000:]
  return json.loads(got.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", ["analyze", "playback"])
def test_a_second_process_loads_what_the_first_compiled(tmp_path, what):
  cache = str(tmp_path / "xla")
  first = _run(cache, what)
  assert first["misses"] > 0 and os.listdir(cache)
  second = _run(cache, what)
  # Everything the first process compiled is loaded, and computes the
  # same bits (records byte for byte).
  assert second["misses"] == 0, second
  assert second["hits"] >= first["misses"], (first, second)
  assert second["out"] == first["out"]
  if what == "analyze":
    assert first["out"]["verdict"] == "fail"


def test_workers_inherit_the_cache_and_none_turns_it_off(tmp_path):
  path = str(tmp_path / "c")
  try:
    assert core.use_compilation_cache(path) == path
    assert jax.config.jax_compilation_cache_dir == path
    child = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.config."
         "jax_compilation_cache_dir, jax.config."
         "jax_persistent_cache_min_compile_time_secs)"],
        capture_output=True, text=True, check=True, timeout=300)
    assert child.stdout.split() == [path, "0.0"]
  finally:
    assert core.use_compilation_cache(None) is None
  assert jax.config.jax_compilation_cache_dir is None
  assert "JAX_COMPILATION_CACHE_DIR" not in os.environ


def test_a_path_that_cannot_hold_a_cache_is_refused(tmp_path):
  afile = tmp_path / "a_file"
  afile.write_text("x")
  with pytest.raises(PeatError, match="exists and is not a directory"):
    core.use_compilation_cache(afile)
  with pytest.raises(PeatError, match="cannot be created"):
    core.use_compilation_cache(afile / "sub")
  assert jax.config.jax_compilation_cache_dir is None


def test_default_directory_follows_the_environment(monkeypatch):
  monkeypatch.setenv("PEAT_JAX_COMPILATION_CACHE", "/some/where")
  assert core.default_compilation_cache() == "/some/where"
  monkeypatch.delenv("PEAT_JAX_COMPILATION_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
  assert core.default_compilation_cache() == "/xdg/peat_jax/xla"


def test_a_tool_refuses_a_bad_cache_before_running(tmp_path, capsys):
  from peat_jax.tools import _cli  # pylint: disable=g-import-not-at-top
  from peat_jax.tools import sites  # pylint: disable=g-import-not-at-top
  afile = tmp_path / "f"
  afile.write_text("x")
  with pytest.raises(SystemExit) as e:
    _cli.run(sites.main, sites.FLAGS, sites.__doc__,
             argv=["sites", f"--compilation_cache={afile}"])
  assert e.value.code == 2
  assert "error: --compilation_cache:" in capsys.readouterr().err
  assert jax.config.jax_compilation_cache_dir is None


def test_a_tool_warns_and_runs_without_an_unusable_default(
    tmp_path, capsys, monkeypatch):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from peat_jax.tools import _cli  # pylint: disable=g-import-not-at-top
  afile = tmp_path / "f"
  afile.write_text("x")
  monkeypatch.setenv("PEAT_JAX_COMPILATION_CACHE", str(afile))
  ran = []
  with pytest.raises(SystemExit) as e:  # a tool's own fresh flags
    _cli.run(lambda argv: ran.append(argv) or 0, flags.FlagValues(), "doc",
             argv=["tool"])
  assert e.value.code == 0 and ran == [["tool"]]
  err = capsys.readouterr().err
  assert "warning: no compilation cache:" in err and str(afile) in err
  assert jax.config.jax_compilation_cache_dir is None


@pytest.mark.parametrize("env,chosen,expected", [
    ("{tmp}/lib", None, "{tmp}/lib"),  # a library call: the default
    ("", None, "None"),                 # $PEAT_JAX_COMPILATION_CACHE="": off
    ("{tmp}/lib", "{tmp}/own", "{tmp}/own"),  # the process's own choice
    ("{tmp}/lib", "", "None"),          # chosen off: stays off
])
def test_library_calls_use_the_default_cache_unless_told(tmp_path, env,
                                                         chosen, expected):
  code = ("from peat_jax import core\n"
          + (f"core.use_compilation_cache({chosen.format(tmp=tmp_path)!r})\n"
             if chosen is not None else "")
          + "print(core.ensure_compilation_cache())")
  child = subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True,
      check=True, timeout=300,
      env={**os.environ, "PEAT_JAX_COMPILATION_CACHE": env.format(
          tmp=tmp_path)})
  assert child.stdout.split() == [expected.format(tmp=tmp_path)]
