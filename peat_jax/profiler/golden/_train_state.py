"""The training contract peat_jax works with: a state pytree and a task.

A train step is a pure function ``(state, batch) -> (state, metrics)`` over the
forward pass, the backward pass and the Optax update. peat_jax traces it to find
kernel sites, substitutes kernels under test in it, checkpoints its state with
Orbax and replays it (playback FI) from any saved step.
"""

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

import jax

PyTree = Any
Batch = Any


class TrainState(NamedTuple):
  """Everything a training run needs to continue bitwise from a step.

  Attributes:
    step: int32 scalar, number of optimizer updates applied so far.
    params: model parameters as a nested dict of arrays (``nnx`` pure dict).
    opt_state: the Optax optimizer state for ``params``.
    rng: uint32[2] raw PRNG key; the step splits it for per-step randomness.
    data_position: int32 scalar, number of batches consumed so far; the task's
      ``batch_at(data_position)`` yields the next batch.
  """

  step: jax.Array
  params: PyTree
  opt_state: PyTree
  rng: jax.Array
  data_position: jax.Array


@dataclasses.dataclass(frozen=True)
class TrainTask:
  """A model, its data and its training step, as peat_jax consumes them.

  Attributes:
    name: scenario name, e.g. ``"cnn"``.
    config: JSON-serialisable hyper-parameters (stored with checkpoints).
    init_state: ``seed -> TrainState`` (fresh or from a pretraining checkpoint).
    step_fn: the pure, un-jitted train step ``(state, batch) -> (state,
      metrics)``; ``metrics`` holds at least ``loss``, ``grad_norm`` and
      ``update_norm`` (float32 scalars).
    train_step: ``jax.jit(step_fn)``, compiled once per task.
    batch_at: ``data_position -> batch`` (a pytree of numpy arrays); a pure
      function of the position and the task's seed, so a resumed run sees the
      same batches.
    evaluate: ``state -> {metric name: float}`` on the held-out split.
    default_steps: training budget of the scenario's default run.
    default_checkpoint_every: default checkpoint interval (steps).
    model_fn: ``(params, inputs) -> outputs``, the forward pass alone.
  """

  name: str
  config: Mapping[str, Any]
  init_state: Callable[[int], TrainState]
  step_fn: Callable[[TrainState, Batch], tuple[TrainState, dict]]
  train_step: Callable[[TrainState, Batch], tuple[TrainState, dict]]
  batch_at: Callable[[int], Batch]
  evaluate: Callable[[TrainState], dict]
  default_steps: int
  default_checkpoint_every: int
  model_fn: Callable[[PyTree, Any], Any]
