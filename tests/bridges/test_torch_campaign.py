"""A whole validation campaign with a torch KUT (slow)."""

import json
import os

import pytest

import peat_jax as peat
import peat_jax.bridges  # pylint: disable=unused-import  (registers torch:*)
from peat_jax import models

pytest.importorskip("torch")


@pytest.mark.slow
def test_validate_runs_a_torch_conv2d_campaign(tmp_path):
  task = models.get_task("cnn", batch_size=16)
  paths = peat.validate(task, "torch:conv2d", str(tmp_path / "c"), steps=4,
                        checkpoint_every=2, frequencies=("every",),
                        runtime_steps=4, progress=None)
  assert os.path.exists(paths.html) and paths.verdict in ("pass", "warn",
                                                          "fail")
  with open(paths.json) as f:
    data = json.load(f)
  assert [s["site"] for s in data["sites"]] == [
      f"fwd/Cnn/Conv/conv_general_dilated:{i}" for i in range(3)]
  # torch really ran at the sites: the second convolution differs from
  # XLA's in rounding, and stays within a few times XLA's float64 error.
  conv2 = data["sites"][1]
  assert max(conv2["share_differ"]) > 0.1
  assert max(conv2["noise_ratio"]) < 4
  pb = data["playback"]
  assert max(abs(a - b) for a, b in zip(pb["loss_kut"], pb["loss_golden"])
             ) < 1e-5
  assert data["runtime"][0]["diverged_at"] is None
