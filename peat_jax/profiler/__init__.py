"""The Profiler: golden runs, playback FI, runtime FI, captures, campaigns.

PEAT's Profiler invokes the kernel under test operation by operation inside
a training flow and collects model states. Private modules:

* ``_train_state``: the training contract (``TrainState``, ``TrainTask``);
* ``_checkpoint``, ``_checkpoint_local``, ``_golden``: golden training with
  Orbax checkpoints, restores (also one process of a multi-process run);
* ``_layout``: every file name of a campaign directory;
* ``_records``: the campaign's append-only, checksummed record files;
* ``_site_records``, ``_player``, ``_playback``: playback FI (a checkpoint's
  records, the jitted pair of steps, the driver over checkpoints);
* ``_runtime``: runtime FI at a frequency against the golden trajectory;
* ``_weights``, ``_significance``: the runs' weight distances to the golden
  trajectory, the bf16-proxy step, and the distances in units of the seed
  and bf16 yardsticks (training-level significance);
* ``_provenance``: what a verdict covers (KUT content hash, platform,
  versions, the sites' shapes and dtypes), ``provenance.json``;
* ``_capture``, ``_capture_io``, ``_oplevel``: golden profiles with
  captured site inputs, and op-level playback on them;
* ``_monitor``: a KUT inside a user's own training loop;
* ``_isolate``, ``_isolated``, ``_isolate_worker``: playback and runtime FI
  in worker processes (crashes and hangs become findings);
* ``_scaleout``, ``_data_parallel``: playback over devices and hosts,
  runtime FI of data-parallel training;
* ``_campaign``, ``_campaign_report``: ``validate`` (the whole pipeline)
  and rebuilding a report from a campaign directory;
* ``_results``: ``read_campaign``, a campaign's results as typed data;
* ``_nnx_task``: ``nnx_task``, a TrainTask from an nnx model, an Optax
  transformation, a loss and ``batch_at``.
"""

from peat_jax.profiler._campaign import CampaignPaths as CampaignPaths
from peat_jax.profiler._campaign import campaign_lock as campaign_lock
from peat_jax.profiler._campaign import validate as validate
from peat_jax.profiler._campaign_report import SOURCES as SOURCES
from peat_jax.profiler._campaign_report import load_report_data as load_report_data
from peat_jax.profiler._campaign_report import rebuild_report as rebuild_report
from peat_jax.profiler._capture import ProfileResult as ProfileResult
from peat_jax.profiler._capture import capture_step_list as capture_step_list
from peat_jax.profiler._capture import profile as profile
from peat_jax.profiler._capture_io import load_record as load_record
from peat_jax.profiler._capture_io import read_index as read_index
from peat_jax.profiler._checkpoint import saved_steps as saved_steps
from peat_jax.profiler._checkpoint_local import reader as local_reader
from peat_jax.profiler._checkpoint_local import restore_on as restore_on
from peat_jax.profiler._data_parallel import data_parallel_runtime as data_parallel_runtime
from peat_jax.profiler._data_parallel import shard_kut as shard_kut
from peat_jax.profiler._golden import GoldenResult as GoldenResult
from peat_jax.profiler._golden import StateReader as StateReader
from peat_jax.profiler._golden import abstract_state as abstract_state
from peat_jax.profiler._golden import golden_train as golden_train
from peat_jax.profiler._golden import read_log as read_log
from peat_jax.profiler._golden import restore_state as restore_state
from peat_jax.profiler._isolate import MEMORY_LIMIT_MB as MEMORY_LIMIT_MB
from peat_jax.profiler._isolate import STARTUP_S as STARTUP_S
from peat_jax.profiler._isolate import TIMEOUT_S as TIMEOUT_S
from peat_jax.profiler._isolate import TaskFactory as TaskFactory
from peat_jax.profiler._isolated import check_kut as check_kut
from peat_jax.profiler._isolated import read_findings as read_findings
from peat_jax.profiler._layout import CAPTURE_DIR as CAPTURE_DIR
from peat_jax.profiler._layout import CHECKPOINT_DIR as CHECKPOINT_DIR
from peat_jax.profiler._layout import CRASH_FILE as CRASH_FILE
from peat_jax.profiler._layout import EVAL_FILE as EVAL_FILE
from peat_jax.profiler._layout import GOLDEN_DIR as GOLDEN_DIR
from peat_jax.profiler._layout import LOCK_FILE as LOCK_FILE
from peat_jax.profiler._layout import LOG_FILE as LOG_FILE
from peat_jax.profiler._layout import MONITOR_FILE as MONITOR_FILE
from peat_jax.profiler._layout import OPS_FILE as OPS_FILE
from peat_jax.profiler._layout import PLAYBACK_FILE as PLAYBACK_FILE
from peat_jax.profiler._layout import REPORT_HTML as REPORT_HTML
from peat_jax.profiler._layout import REPORT_JSON as REPORT_JSON
from peat_jax.profiler._layout import RUNTIME_DP_FILE as RUNTIME_DP_FILE
from peat_jax.profiler._layout import RUNTIME_FILE as RUNTIME_FILE
from peat_jax.profiler._layout import RUN_FILE as RUN_FILE
from peat_jax.profiler._layout import SETTINGS_FILE as SETTINGS_FILE
from peat_jax.profiler._layout import SHARD_DIR as SHARD_DIR
from peat_jax.profiler._monitor import Monitor as Monitor
from peat_jax.profiler._oplevel import OpsResult as OpsResult
from peat_jax.profiler._oplevel import captures_dir_of as captures_dir_of
from peat_jax.profiler._oplevel import playback_ops as playback_ops
from peat_jax.profiler._oplevel import select_entries as select_entries
from peat_jax.profiler._player import Player as Player
from peat_jax.profiler._player import PlayerGroup as PlayerGroup
from peat_jax.profiler._player import select_calls as select_calls
from peat_jax.profiler._playback import PlaybackResult as PlaybackResult
from peat_jax.profiler._playback import playback as playback
from peat_jax.profiler._playback import playback_many as playback_many
from peat_jax.profiler._records import RecordFileError as RecordFileError
from peat_jax.profiler._records import append_records as append_records
from peat_jax.profiler._records import read_records as read_records
from peat_jax.profiler._records import repair_records as repair_records
from peat_jax.profiler._records import signature_record as signature_record
from peat_jax.profiler._runtime import RuntimeResult as RuntimeResult
from peat_jax.profiler._runtime import divergence as divergence
from peat_jax.profiler._runtime import envelope as envelope
from peat_jax.profiler._runtime import parse_frequency as parse_frequency
from peat_jax.profiler._runtime import runtime as runtime
from peat_jax.profiler._scaleout import init_distributed as init_distributed
from peat_jax.profiler._scaleout import merge_shards as merge_shards
from peat_jax.profiler._scaleout import sharded_playback as sharded_playback
from peat_jax.profiler._site_records import site_record as site_record
from peat_jax.profiler._train_state import TrainState as TrainState
from peat_jax.profiler._train_state import TrainTask as TrainTask
from peat_jax.profiler._campaign_report import CampaignFiles as CampaignFiles
from peat_jax.profiler._campaign_report import read_campaign_files as read_campaign_files
from peat_jax.profiler._nnx_task import nnx_step_fn as nnx_step_fn
from peat_jax.profiler._nnx_task import nnx_task as nnx_task
from peat_jax.profiler._results import CampaignResults as CampaignResults
from peat_jax.profiler._results import CampaignVerdict as CampaignVerdict
from peat_jax.profiler._results import EffectRecord as EffectRecord
from peat_jax.profiler._results import Finding as Finding
from peat_jax.profiler._results import Provenance as Provenance
from peat_jax.profiler._results import RuntimeRun as RuntimeRun
from peat_jax.profiler._results import SiteRecord as SiteRecord
from peat_jax.profiler._results import read_campaign as read_campaign
from peat_jax.profiler._weights import distances as weight_distances
