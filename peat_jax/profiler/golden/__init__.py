"""Golden runs: the training contract, golden training, Orbax checkpoints.

PEAT's first step: train with the golden kernels and save the full state
every k steps. Private modules: ``_train_state`` (``TrainState``,
``TrainTask``: what a scenario hands peat_jax), ``_checkpoint`` (Orbax
checkpoint managers, fingerprints, ``saved_steps``), ``_checkpoint_local``
(restores onto devices of one process of a multi-process run),
``_golden`` (``golden_train``, ``restore_state``, ``StateReader``, the
per-step log), ``_golden_log`` (the per-step log), ``_golden_step`` (the step after
each checkpoint, kept for playback) and ``_nnx_task`` (``nnx_task``: a TrainTask from an nnx
model, an Optax transformation, a loss and ``batch_at``).
"""

from peat_jax.profiler.golden._train_state import TrainState as TrainState
from peat_jax.profiler.golden._train_state import TrainTask as TrainTask
from peat_jax.profiler.golden._checkpoint import saved_steps as saved_steps
from peat_jax.profiler.golden._checkpoint_local import reader as reader
from peat_jax.profiler.golden._checkpoint_local import restore_on as restore_on
from peat_jax.profiler.golden._checkpoint_local import saved_steps_local as saved_steps_local
from peat_jax.profiler.golden._golden import GoldenResult as GoldenResult
from peat_jax.profiler.golden._golden import StateReader as StateReader
from peat_jax.profiler.golden._golden import abstract_state as abstract_state
from peat_jax.profiler.golden._golden import golden_train as golden_train
from peat_jax.profiler.golden._golden import read_log as read_log
from peat_jax.profiler.golden._golden import restore_state as restore_state
from peat_jax.profiler.golden._golden import committed as committed
from peat_jax.profiler.golden._golden_step import GoldenStep as GoldenStep
from peat_jax.profiler.golden._golden_step import GoldenSteps as GoldenSteps
from peat_jax.profiler.golden._golden_step import golden_step_dir as golden_step_dir
from peat_jax.profiler.golden._golden_step import stored_golden_steps as stored_golden_steps
from peat_jax.profiler.golden._golden_step import write_golden_step as write_golden_step
from peat_jax.profiler.golden._nnx_task import nnx_step_fn as nnx_step_fn
from peat_jax.profiler.golden._nnx_task import nnx_task as nnx_task
