"""Scale-out: playback over devices and hosts, data-parallel runtime FI.

Private modules: ``_scaleout`` (checkpoints sharded over devices and
processes, shards merged) and ``_data_parallel`` (runtime FI of
data-parallel training with the KUT on one shard).
"""

from peat_jax.profiler.scaleout._scaleout import init_distributed as init_distributed
from peat_jax.profiler.scaleout._scaleout import merge_shards as merge_shards
from peat_jax.profiler.scaleout._scaleout import sharded_playback as sharded_playback
from peat_jax.profiler.scaleout._data_parallel import data_parallel_runtime as data_parallel_runtime
from peat_jax.profiler.scaleout._data_parallel import shard_kut as shard_kut
