"""Fixtures of the playback tests."""

import pytest

import peat_jax as peat
from peat_jax import models


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
  """A short golden run of the CNN (batch 8, three steps, a checkpoint at
  each), once per test module: ``(task, GoldenResult)``."""
  task = models.get_task("cnn", batch_size=8)
  g = peat.golden_train(task, tmp_path_factory.mktemp("cnn") / "golden",
                        steps=3, checkpoint_every=1, evaluate=False)
  return task, g
