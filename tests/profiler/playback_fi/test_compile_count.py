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
def run(tmp_path_factory):
  task = models.get_task("cnn", batch_size=8)
  g = peat.golden_train(task, tmp_path_factory.mktemp("cc") / "golden",
                        steps=3, checkpoint_every=1, evaluate=False)
  return task, g


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
