"""Reference Flax (nnx) models on real data (installed as ``peat_jax.models``).

>>> from peat_jax import models
>>> task = models.get_task("cnn")
"""

from peat_jax.models.tasks import DEFAULT_SCENARIO as DEFAULT_SCENARIO
from peat_jax.models.tasks import SCENARIOS as SCENARIOS
from peat_jax.models.tasks import get_task as get_task
from peat_jax.models.tasks import make_step_fn as make_step_fn
from peat_jax.models.tasks import prepare_task as prepare_task
from peat_jax.models.tasks import prepare_task_factory as prepare_task_factory
from peat_jax.models.tasks import scenario_config as scenario_config
from peat_jax.models.tasks import scenario_names as scenario_names
