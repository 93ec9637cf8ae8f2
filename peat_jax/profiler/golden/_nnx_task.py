"""A :class:`TrainTask` from an nnx model, an Optax transformation and a loss.

:func:`nnx_task` fills in what peat_jax needs around a user's model: the
pure train step (forward, ``jax.value_and_grad``, the Optax update; metrics
``loss``, ``grad_norm``, ``update_norm``), the checkpointed
:class:`TrainState` (parameters, optimizer state, step, RNG key, data
position) and an evaluation.

>>> task = peat.nnx_task(lambda rngs: Model(rngs=rngs), optax.adamw(1e-3),
...                      loss_fn, batch_at, name="my_model")  # doctest: +SKIP
>>> peat.validate(task, "native:matmul:acc_bf16", "runs/mine")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax

from peat_jax.core import PeatError
from peat_jax.profiler.golden._train_state import TrainState, TrainTask


def nnx_step_fn(graphdef, tx: optax.GradientTransformation,
                loss_fn: Callable[[Any, Any], jax.Array]) -> Callable:
  """The pure train step ``(state, batch) -> (state, metrics)`` of an nnx model.

  Args:
    graphdef: the model's ``nnx.GraphDef`` (static).
    tx: the Optax transformation.
    loss_fn: ``(model, batch) -> scalar loss``; ``model`` is the nnx module
      with the state's parameters.

  Returns:
    The un-jitted step: ``value_and_grad`` of the loss over
    ``state.params`` (an nnx pure dict), the Optax update, metrics
    ``loss``, ``grad_norm`` and ``update_norm``; ``step`` and
    ``data_position`` advance by one and the RNG key is split once.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  def loss_of(params, batch):
    loss = loss_fn(nnx.merge(graphdef, params), batch)
    if jnp.ndim(loss) != 0:
      raise PeatError(f"the loss function returned shape {jnp.shape(loss)}; "
                      "expected a scalar loss (reduce it, e.g. .mean())")
    return loss

  def step_fn(state: TrainState, batch):
    rng, _ = jax.random.split(state.rng)  # per-step key for stochastic layers
    loss, grads = jax.value_and_grad(loss_of)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "update_norm": optax.tree.norm(updates)}
    return TrainState(state.step + 1, params, opt_state, rng,
                      state.data_position + 1), metrics

  return step_fn


def _graphdef(make_model: Callable) -> tuple[Any, str]:
  from flax import nnx  # pylint: disable=g-import-not-at-top

  if isinstance(make_model, nnx.Module) or not callable(make_model):
    raise PeatError(
        f"nnx_task needs a function that builds the model from its rngs, "
        f"e.g. lambda rngs: MyModel(..., rngs=rngs), so that every seed "
        f"starts from fresh parameters; got {type(make_model).__name__}")
  try:
    abstract = nnx.eval_shape(lambda: make_model(nnx.Rngs(0)))
  except TypeError as err:
    raise PeatError(f"nnx_task: calling the model function with "
                    f"nnx.Rngs(0) failed ({err}); expected "
                    "make_model(rngs) -> nnx.Module") from err
  if not isinstance(abstract, nnx.Module):
    raise PeatError(f"nnx_task: the model function returned "
                    f"{type(abstract).__name__}; expected an nnx.Module")
  graphdef, _ = nnx.split(abstract)
  _, _, rest = nnx.split(abstract, nnx.Param, ...)
  leftover = sorted({type(v).__name__ for v in jax.tree.leaves(
      rest, is_leaf=lambda x: isinstance(x, nnx.Variable))})
  if leftover:
    raise PeatError(
        f"nnx_task: {type(abstract).__name__} holds state other than "
        f"nnx.Param ({', '.join(leftover)}); expected parameters only (no "
        "batch statistics, no rngs kept in the model: pass rngs to the "
        "layers that need them at call time, or build a peat.TrainTask "
        "yourself)")
  return graphdef, type(abstract).__name__


def nnx_task(make_model: Callable[[Any], Any],
             tx: optax.GradientTransformation,
             loss_fn: Callable[[Any, Any], jax.Array],
             batch_at: Callable[[int], Any], *, name: str | None = None,
             config: Mapping[str, Any] | None = None,
             eval_batches: Sequence[Any] | None = None,
             evaluate: Callable[[Any], Mapping[str, float]] | None = None,
             default_steps: int = 100,
             default_checkpoint_every: int = 10) -> TrainTask:
  """Builds a :class:`TrainTask` from an nnx model, Optax and a loss.

  Args:
    make_model: ``rngs -> nnx.Module``, called with one argument,
      ``nnx.Rngs(jax.random.key(seed))``: ``init_state(seed)`` builds the
      model with it (fresh parameters per seed, as runtime FI's
      seed-to-seed spread needs), and it is traced, so it must not read
      the parameters' values. The model's state must be ``nnx.Param``
      only (no batch statistics, no stored rngs).
    tx: the Optax transformation (``optax.adamw(1e-3)``, a chain, ...).
    loss_fn: ``(model, batch) -> scalar loss``: the model merged with the
      step's parameters, and the batch as ``batch_at`` returned it with
      every array a ``jax.Array``.
    batch_at: ``position -> batch``, a pure function of ``position``, the
      number of batches the run consumed before this step (0 for the
      first step; the step number in a run from scratch), so that a run
      restored at any checkpoint sees the same data. The batch is any
      pytree (a dict, a tuple) of NumPy arrays whose shapes and dtypes do
      not change with the position (the step compiles once).
    name: the task's name (default: the model class's name, lowercase).
    config: JSON-serialisable hyper-parameters stored with the checkpoints.
    eval_batches: held-out batches; the evaluation is their mean loss
      (``eval_loss``).
    evaluate: ``model -> {metric: float}`` instead (default: as above, or
      no metric without ``eval_batches``).
    default_steps: the task's default training steps.
    default_checkpoint_every: its default checkpoint interval.

  Returns:
    The task (its ``train_step`` is ``jax.jit(step_fn)``).

  Raises:
    PeatError: ``make_model`` is a module instance or not a model
      function, the model holds non-parameter state, ``batch_at`` or
      ``loss_fn`` is not callable.
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  for what, fn in (("loss_fn", loss_fn), ("batch_at", batch_at)):
    if not callable(fn):
      raise PeatError(f"nnx_task: {what} must be callable, got "
                      f"{type(fn).__name__}")
  if evaluate is not None and not callable(evaluate):
    raise PeatError(f"nnx_task: evaluate must be callable, got "
                    f"{type(evaluate).__name__}")
  graphdef, cls = _graphdef(make_model)
  step_fn = nnx_step_fn(graphdef, tx, loss_fn)
  # The seed is an operand, not a constant: the golden run and the
  # seed-to-seed spread's runs share one executable.
  init_params = jax.jit(lambda seed: nnx.to_pure_dict(nnx.state(
      make_model(nnx.Rngs(jax.random.key(seed))), nnx.Param)))

  def init_state(seed: int) -> TrainState:
    params = init_params(jnp.asarray(int(seed), jnp.int32))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params),
                      rng=jax.random.PRNGKey(int(seed) + 1),
                      data_position=jnp.zeros((), jnp.int32))

  def model_fn(params, inputs):
    return nnx.merge(graphdef, params)(inputs)

  eval_loss = jax.jit(lambda params, batch: loss_fn(nnx.merge(graphdef,
                                                              params), batch))

  def evaluation(state: TrainState) -> dict:
    if evaluate is not None:
      return {k: float(v) for k, v in
              evaluate(nnx.merge(graphdef, state.params)).items()}
    if not eval_batches:
      return {}
    losses = [float(eval_loss(state.params, b)) for b in eval_batches]
    return {"eval_loss": sum(losses) / len(losses)}

  return TrainTask(
      name=name or cls.lower(), config=dict(config or {"model": cls}),
      init_state=init_state, step_fn=step_fn, train_step=jax.jit(step_fn),
      batch_at=batch_at, evaluate=evaluation,
      default_steps=int(default_steps),
      default_checkpoint_every=int(default_checkpoint_every),
      model_fn=model_fn)
