"""Shared fixtures of the campaign tools' tests: one tiny profiled campaign.

The tools build their task from flags with ``tools/_cli.make_task``; these
fast tests hand them a tiny task instead (one dense layer and softmax
cross-entropy, compiling in a fraction of a second) so that they test each
tool's flags, loops, output and exit codes, not the model zoo. The dense
layer's output is float32[8, 10], the shape tests/test_capture.py analyzes
too (one Analyzer compilation per process). Tests marked slow run the tools
on the CNN scenario itself.
"""

import contextlib
import io
import shutil
import types
from unittest import mock

from absl.testing import flagsaver
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import peat_jax as peat
from peat_jax.tools import _cli
from peat_jax.tools import playback
from peat_jax.tools import profile

KUT = "native:matmul:in_bf16"
DENSE = "fwd/dot_general:0"
_TX = optax.sgd(0.1)


def _step_fn(state, batch):
  def loss_fn(params):
    logits = batch["x"] @ params["w"] + params["b"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], 1))

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt = _TX.update(grads, state.opt_state, state.params)
  new = state._replace(step=state.step + 1,
                       params=optax.apply_updates(state.params, updates),
                       opt_state=opt, data_position=state.data_position + 1)
  return new, {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "update_norm": optax.tree.norm(updates)}


def _init_state(seed):
  rng = np.random.default_rng(seed)
  params = {"w": jnp.asarray(0.3 * rng.standard_normal((16, 10)),
                             jnp.float32),
            "b": jnp.zeros((10,), jnp.float32)}
  return peat.TrainState(jnp.zeros((), jnp.int32), params, _TX.init(params),
                         jax.random.PRNGKey(seed), jnp.zeros((), jnp.int32))


def _batch_at(position):
  rng = np.random.default_rng(500 + int(position))
  return {"x": rng.standard_normal((8, 16)).astype(np.float32),
          "y": rng.integers(0, 10, 8).astype(np.int32)}


TINY = peat.TrainTask(
    name="tiny", config={"batch": 8}, init_state=_init_state,
    step_fn=_step_fn, train_step=jax.jit(_step_fn), batch_at=_batch_at,
    evaluate=lambda state: {}, default_steps=4, default_checkpoint_every=2,
    model_fn=None)


def run_tool(module, argv: list[str], task=TINY) -> tuple[int, str, str]:
  """Parses ``argv`` into the tool's own flags, runs main: (rc, out, err).

  Args:
    module: the tool module.
    argv: its flags.
    task: the task the tool gets from ``_cli.make_task`` (None: the real
      scenario named by the flags).
  """
  out, err = io.StringIO(), io.StringIO()
  patch = (mock.patch.object(_cli, "make_task", return_value=task)
           if task is not None else contextlib.nullcontext())
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out), \
      contextlib.redirect_stderr(err), patch:
    module.FLAGS.unparse_flags()
    module.FLAGS([module.__name__] + argv)
    rc = module.main([module.__name__])
  return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="session")
def cli():
  """``run(module, argv, task=TINY) -> (rc, stdout, stderr)`` and settings."""
  return types.SimpleNamespace(run=run_tool, kut=KUT, dense=DENSE, task=TINY)


@pytest.fixture(scope="session")
def profiled(tmp_path_factory):
  """(campaign dir, profile tool output): golden run + captured dense inputs."""
  d = tmp_path_factory.mktemp("tools") / "campaign"
  rc, out, err = run_tool(profile, [
      f"--campaign_dir={d}", "--steps=4", "--checkpoint_every=2",
      "--capture_kernel=dot_general", "--capture_steps=0,1,2,3",
      "--budget=6kB"])
  assert rc == 0, err
  return d, out


@pytest.fixture
def profiled_copy(profiled, tmp_path):
  """A copy of the profiled campaign for a test that writes records into
  it: the session's own stays as profiled whatever order the tests run in
  (pytest-xdist's workers take the files in another order)."""
  d = tmp_path / "campaign"
  shutil.copytree(profiled[0], d)
  return d


@pytest.fixture(scope="session")
def ops_played(profiled):
  """The profiled campaign after op-level playback of KUT (tool output)."""
  d, _ = profiled
  rc, out, err = run_tool(playback, [f"--campaign_dir={d}", f"--kut={KUT}",
                                     "--ops"])
  assert rc == 0, err
  return d, out
