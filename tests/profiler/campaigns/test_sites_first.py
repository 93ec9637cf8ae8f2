"""A KUT with no site in the step is refused before the golden run trains.

On a float32 model (the CNN) and a bf16 mixed-precision one (ViT bf16):
the kernel's name is checked against the step's sites traced with the
initial state's shapes, so a wrong ``--kernel`` costs a trace, not a
golden run.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import pytest

import peat_jax as peat
from peat_jax import models


def _rms_norm(x, scale, eps):
  x32 = x.astype(jnp.float32)
  inv = jnp.reciprocal(jnp.sqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps))
  return (x32 * inv * scale).astype(x.dtype)


@pytest.mark.parametrize("scenario", ["cnn", "vit_bf16"])
def test_kernel_without_sites_fails_before_the_golden_run(scenario, tmp_path):
  peat.register_kut("sites_first_rms", _rms_norm, kernel="rms_norm")
  task = models.get_task(scenario)
  with pytest.raises(peat.PeatError, match=r"no site of kernel 'rms_norm'"):
    peat.validate(task, "sites_first_rms", tmp_path / "c", steps=4,
                  checkpoint_every=2)
  golden = tmp_path / "c" / "golden"
  assert not golden.exists() or not any(os.scandir(golden)), (
      "the golden run trained before the KUT's sites were checked")

