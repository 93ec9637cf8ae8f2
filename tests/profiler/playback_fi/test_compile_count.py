"""A campaign compiles once: what XLA compiles does not grow with its
checkpoints, and a second call in one process loads what the first one
compiled (peat.core.count_compilations counts both)."""

import jax
import jax.numpy as jnp
import pytest

import peat_jax as peat
from peat_jax import core
from peat_jax import models
from peat_jax import profiler

KUT = "native:matmul:default"


@pytest.fixture(scope="module")
def run(cnn_run):
  return cnn_run


@pytest.fixture
def cache(tmp_path):
  """A persistent cache of this test's own, off again afterwards (the
  suite runs without one: tests/conftest.py)."""
  path = core.use_compilation_cache(tmp_path / "xla")
  yield path
  core.use_compilation_cache(None)


def test_the_counter_counts_compiles_and_cache_loads(cache):
  f = lambda x: jnp.sin(x) * 3.0 + 1.0
  x = jnp.arange(7.0)
  with core.count_compilations() as first:
    jax.jit(f)(x).block_until_ready()
  with core.count_compilations() as again:  # a new jit: traced, loaded
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(x).block_until_ready()
  assert (first.compiled, first.loaded) == (1, 0)
  assert (again.compiled, again.loaded) == (0, 1)
  assert first.seconds > 0


def test_playback_compiles_nothing_after_its_first_checkpoint(run, tmp_path):
  task, g = run
  per_step = []
  with core.count_compilations() as c:
    profiler.playback(task, g.workdir, KUT, campaign_dir=tmp_path / "c",
                      steps=[0, 1, 2, 3],
                      progress=lambda line: per_step.append(c.compiled))
  assert len(per_step) == 4 and per_step[0] > 0
  assert per_step[1:] == [per_step[0]] * 3, per_step


def test_a_second_playback_in_one_process_compiles_nothing(run, tmp_path,
                                                           cache):
  task, g = run
  with core.count_compilations() as first:
    profiler.playback(task, g.workdir, KUT, campaign_dir=tmp_path / "a",
                      steps=[0])
  with core.count_compilations() as second:
    profiler.playback(task, g.workdir, KUT, campaign_dir=tmp_path / "b",
                      steps=[0])
  assert first.compiled > 0
  assert second.compiled == 0, (first.compiled, second.compiled)
  assert second.loaded > 0


@pytest.mark.parametrize("name", [
    "cnn", pytest.param("gpt", marks=pytest.mark.slow)])  # gpt: ~24 s
def test_a_worker_compiles_what_it_plays_before_its_first_checkpoint(
    name, tmp_path):
  """An isolated worker compiles before the KUT runs (Player.compile),
  so that its time limit tells a hang from a compilation: that warm-up
  must be what a benign KUT's checkpoint runs, no more (no
  decomposition of stand-ins the screen flags) and no less (no program
  left to compile at the first checkpoint)."""
  # A process that ran many tests is near the mapping limit at which the
  # Analyzer's entry points clear JAX's caches (core.release_compiled):
  # start from empty caches, as a worker process does.
  jax.clear_caches()
  small = dict(context=16, model_kwargs=dict(dim=32, depth=1, heads=2))
  task = models.get_task(name, batch_size=4, **(small if name == "gpt"
                                                else {}))
  g = peat.golden_train(task, tmp_path / "golden", steps=1,
                        checkpoint_every=1, evaluate=False)
  kut = peat.kernels.kut.checked(KUT)
  state = peat.restore_state(g.checkpoint_dir, task, 0)
  # The float32 GPT reads the golden run's stored step (the worker's
  # default), the CNN replays it: both programs are warmed.
  stored = (profiler.golden.stored_golden_steps(g.workdir, [0])
            if name == "gpt" else None)
  player = profiler.playback_fi.Player(
      task, kut, state, task.batch_at(int(state.data_position)),
      golden_steps=stored)
  assert (player.golden_steps is not None) == (name == "gpt")
  with core.count_compilations() as warm:
    player.compile(state)
  with core.count_compilations() as played:
    recs = player.play(0, state)
  sites = [r for r in recs if r["kind"] != "effect"]
  assert sites and all(r["diagnosis"]["verdict"] == "pass" for r in sites)
  assert warm.compiled > 0
  assert played.compiled == 0, played.compiled


@pytest.mark.slow  # ~25-38 s: two cold playbacks of a 2-block GPT
def test_what_playback_compiles_does_not_grow_with_its_sites(tmp_path):
  """One site or every site of the kernel (13 of several shapes): the same
  programs (one step, one set of references, one screen), each holding
  every selected site, so their count stays."""
  small = dict(context=16, model_kwargs=dict(dim=32, depth=2, heads=2))
  task = models.get_task("gpt", batch_size=2, **small)
  g = peat.golden_train(task, tmp_path / "golden", steps=1,
                        checkpoint_every=1, evaluate=False)
  counts = {}
  for select in ("*Mlp/Linear/dot_general:0", None):
    with core.count_compilations() as c:
      got = profiler.playback(task, g.workdir, KUT, select=select,
                              campaign_dir=tmp_path / str(select))
    counts[select] = (len(got.sites), c.compiled)
  (one, n_one), (every, n_every) = counts.values()
  assert one == 1 and every > 4 * one, counts
  # The second call reuses what does not hold sites (the update norm):
  # what it compiles is no more than the first's.
  assert 0 < n_every <= n_one, counts
