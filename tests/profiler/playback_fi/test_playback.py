"""Tests of the playback FI engine (peat_jax/_playback.py): cost paths.

The fused step, the float64 update difference on the device, batched site
records and the restore prefetcher must give the records the plain path
gives (tapped step and substituted step jitted apart, float64 update
difference on the host), bitwise and on every rerun.
"""

import math
import threading
import time

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest

import peat_jax as peat
from peat_jax import profiler as _golden
from peat_jax import profiler
from peat_jax.profiler.playback_fi import _playback as playback
from peat_jax.profiler.playback_fi import _player as player_mod
from peat_jax.profiler.files import _records as records
from peat_jax.profiler import golden as golden_part
from peat_jax import sites as _sites_subst
from peat_jax import models
from peat_jax.kernels import kut

SPEC = "test:playback_rtz_matmul"


def _rtz_matmul(lhs, rhs, **params):
  """A dot_general KUT with a real, deterministic error: low bits cleared."""
  out = jax.lax.dot_general_p.bind(lhs, rhs, **params)
  bits = jax.lax.bitcast_convert_type(out, jnp.uint32) & jnp.uint32(0xFFFFFF00)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _host_update_rel_diff(p, g, k) -> float:
  """The float64 host formula the device reduction must reproduce."""
  leaves = lambda t: [np.asarray(x, np.float64) for x in jax.tree.leaves(t)]
  num = den = 0.0
  for a, b, c in zip(leaves(p), leaves(g), leaves(k)):
    dg, dk = b - a, c - a
    num += float(np.sum((dk - dg) ** 2))
    den += float(np.sum(dg ** 2))
  if den == 0.0:
    return 0.0 if num == 0.0 else math.inf
  return math.sqrt(num / den)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_update_rel_diff_matches_host_float64(seed):
  rng = np.random.default_rng(seed)
  shapes = [(7, 5), (13,), (3, 4, 2)]
  p = {f"w{i}": rng.standard_normal(s).astype(np.float32)
       for i, s in enumerate(shapes)}
  g = {k: v - 1e-3 * rng.standard_normal(v.shape).astype(np.float32)
       for k, v in p.items()}
  k_ = {k: v + 1e-6 * rng.standard_normal(v.shape).astype(np.float32)
        for k, v in g.items()}
  got = player_mod.update_rel_diff(p, g, k_)
  want = _host_update_rel_diff(p, g, k_)
  assert got > 0 and math.isclose(got, want, rel_tol=1e-12)
  assert player_mod.update_rel_diff(p, g, k_) == got  # deterministic
  assert not jax.config.jax_enable_x64  # x64 stayed scoped to the call
  assert player_mod.update_rel_diff(p, g, g) == 0.0
  assert player_mod.update_rel_diff(p, p, p) == 0.0
  assert player_mod.update_rel_diff(p, p, g) == math.inf


class _FakeRestore:
  """Stands in for _golden.StateReader: records threads, can fail."""

  def __init__(self, fail_at=None):
    self.calls, self.threads, self.fail_at = [], set(), fail_at
    self.lock = threading.Lock()
    self.opened = self.closed = 0

  def __call__(self, ckpt, task):  # the reader's constructor
    self.opened += 1
    return self

  def close(self):
    self.closed += 1

  def restore(self, step):
    with self.lock:
      self.calls.append(step)
      self.threads.add(threading.current_thread().name)
    time.sleep(0.01)
    if step == self.fail_at:
      raise peat.CheckpointError(f"step {step} is corrupt")
    return {"step": step}


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_prefetcher_order_threads_and_errors(monkeypatch, ahead):
  fake = _FakeRestore(fail_at=5)
  # playback reads StateReader through the golden part's facade
  monkeypatch.setattr(golden_part, "StateReader", fake)
  loader = playback._Prefetcher("/ckpt", None, [0, 2, 4, 5, 6], ahead)
  try:
    got = [loader.next() for _ in range(3)]
    assert got == [(s, {"step": s}) for s in (0, 2, 4)]
    # never more than `ahead` restores beyond the one being played
    assert len(fake.calls) <= 3 + ahead
    with pytest.raises(peat.CheckpointError, match="step 5 is corrupt"):
      loader.next()
  finally:
    loader.close()
  assert fake.opened == fake.closed == 1  # one reader for all restores
  if ahead == 0:
    assert fake.threads == {threading.current_thread().name}
  else:
    assert all(t.startswith("peat-restore") for t in fake.threads)


def test_playback_refuses_bad_prefetch(tmp_path):
  with pytest.raises(peat.PeatError, match="prefetch must be an int >= 0"):
    profiler.playback(None, tmp_path, "golden", prefetch=-1)


# ------------------------------------------------------ one golden run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  kut.register_kut(SPEC, _rtz_matmul, kernel="dot_general")
  task = models.get_task("cnn", batch_size=8)
  g = peat.golden_train(task, tmp_path_factory.mktemp("pb") / "golden",
                        steps=2, checkpoint_every=1, evaluate=False)
  return task, g


def _plain_records(task, spec, step, state, probes=None):
  """The plain path: tapped and substituted steps jitted apart, host diff
  (``probes``: the campaign's probe cache, as a Player keeps one)."""
  batch = task.batch_at(int(state.data_position))
  calls, _ = profiler.select_calls(task, state, batch, spec, None)
  store = {}
  subs = [_sites_subst.Substitution(kut.recording(
      c.sub.kut, c.site.name, c.site.kernel, c.site.composite, store),
      sites=(c.site.name,)) for c in calls]
  (gstate, gm), taps = jax.jit(_sites_subst.tap(task.step_fn, *subs))(
      state, batch)
  kstate, km = jax.jit(_sites_subst.substitute(task.step_fn, (
      _sites_subst.Substitution(calls[0].sub.kut,
                                sites=tuple(c.site.name for c in calls)))))(
                                    state, batch)
  recs = [profiler.site_record(c.site, store[c.site.name], taps[c.site.name],
                               spec, step, probe_cache=probes)
          for c in calls]
  return recs, gm, km, _host_update_rel_diff(state.params, gstate.params,
                                            kstate.params)


@pytest.mark.slow  # two step compilations and an analyzer compilation
def test_player_matches_plain_path_bitwise_and_reruns(run):
  task, g = run
  state0 = _golden.restore_state(g.checkpoint_dir, task, 0)
  player = profiler.Player(task, SPEC, state0, task.batch_at(0))
  probes = profiler.ProbeCache()
  for step in (0, 1):
    state = _golden.restore_state(g.checkpoint_dir, task, step)
    recs = player.play(step, state)
    again = player.play(step, state)
    assert msgpack.packb(recs) == msgpack.packb(again)  # bitwise rerun
    plain, gm, km, upd = _plain_records(task, SPEC, step, state, probes)
    assert msgpack.packb(recs[:-1]) == msgpack.packb(plain)
    eff = recs[-1]
    assert eff["loss_golden"] == float(gm["loss"])
    assert eff["loss_kut"] == float(km["loss"])
    assert eff["loss_kut"] != eff["loss_golden"]
    assert math.isclose(eff["update_rel_diff"], upd, rel_tol=1e-12)
    # The fused step's golden half is the golden run's step, bitwise.
    i = list(g.log["step"]).index(step + 1)
    assert np.float32(eff["loss_golden"]) == g.log["loss"][i]
    assert [r["diagnosis"]["model"] for r in recs[:-1]] == ["truncation"]
  assert player._steps._cache_size() == 1  # no recompilation per checkpoint


@pytest.mark.slow  # compiles a Player per playback
def test_playback_records_do_not_depend_on_prefetch(run, tmp_path):
  task, g = run
  files = []
  for ahead in (0, 2):
    d = tmp_path / f"prefetch{ahead}"
    res = profiler.playback(task, g.workdir, SPEC, campaign_dir=d, steps=[0, 1],
                     prefetch=ahead)
    assert [e["step"] for e in res.effects] == [0, 1]
    files.append((d / profiler.PLAYBACK_FILE).read_bytes())
  assert files[0] == files[1]


def test_playback_many_refuses_bad_spec_lists(tmp_path):
  with pytest.raises(peat.PeatError, match="more than once"):
    profiler.playback_many(None, tmp_path, [SPEC, "golden", SPEC])
  with pytest.raises(peat.PeatError, match="one or more KUT spec strings"):
    profiler.playback_many(None, tmp_path, [])


@pytest.mark.slow  # compiles three Players and two groups
def test_playback_many_equals_each_kut_alone_and_resumes_per_kut(run,
                                                                 tmp_path):
  """Several KUTs played together (one golden step, shared references)
  write, per KUT, the records of that KUT played alone, bitwise; a KUT
  missing a step is replayed for that step only."""
  task, g = run
  # Two KUTs on the same dense site (its reference is shared), one on the
  # convolutions.
  specs = [SPEC, "native:matmul:in_bf16", "native:conv2d:in_bf16"]
  together = tmp_path / "together"
  res = profiler.playback_many(task, g.workdir, specs, campaign_dir=together,
                        steps=[0, 1])
  path = together / profiler.PLAYBACK_FILE
  mine = lambda recs, k: [r for r in recs if r["kut"] == k]
  for k in specs:
    alone = profiler.playback(task, g.workdir, k, campaign_dir=tmp_path / "alone",
                       steps=[0, 1])
    assert msgpack.packb(res[k].records) == msgpack.packb(alone.records)
    assert msgpack.packb(res[k].effects) == msgpack.packb(alone.effects)
  models_of = {k: {r["diagnosis"]["model"] for r in res[k].records}
               for k in specs}
  assert models_of[SPEC] == {"truncation"}
  assert models_of["native:conv2d:in_bf16"] == {"precision:bf16"}
  # Resume: drop the first KUT's effect record of step 1.
  recs = profiler.read_records(str(path))
  records.rewrite_records(str(path), [
      r for r in recs if not (r["kut"] == SPEC and r["step"] == 1
                              and r["kind"] == "effect")])
  lines = []
  again = profiler.playback_many(task, g.workdir, specs, campaign_dir=together,
                          steps=[0, 1], progress=lines.append)
  played = [ln for ln in lines if "done before" not in ln]
  assert len(played) == 1 and played[0].startswith(f"playback step 1 {SPEC}:")
  assert sum("done before" in ln for ln in lines) == 5
  after = profiler.read_records(str(path))
  for k in specs:
    # The resumed step carries the port probes of step 0's records, as the
    # uninterrupted run did: the same records, bitwise.
    assert msgpack.packb(again[k].records) == msgpack.packb(res[k].records)
    assert len(mine(after, k)) == len(mine(recs, k))
