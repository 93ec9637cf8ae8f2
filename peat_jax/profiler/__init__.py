"""The Profiler: golden runs, playback FI, runtime FI, captures, campaigns.

PEAT's Profiler invokes the kernel under test operation by operation inside
a training flow and collects model states. It is made of parts, one
sub-package each (a facade and private modules), lowest first; a part
imports only the parts before it, through their facades
(tests/test_structure.py):

* ``files``: the campaign directory's files (their names, the append-only
  checksummed record files, the one-writer lock);
* ``golden``: the training contract (``TrainState``, ``TrainTask``,
  ``nnx_task``), golden training with Orbax checkpoints, restores;
* ``playback_fi``: playback FI (the jitted pair of steps, a checkpoint's
  records, the driver over checkpoints);
* ``runtime_fi``: runtime FI at a frequency against the golden trajectory,
  the weight distances and their yardsticks, the ``Monitor`` inside a
  user's own training loop;
* ``capture``: golden profiles with captured site inputs, op-level
  playback on them;
* ``isolation``: playback and runtime FI in worker processes (crashes and
  hangs become findings);
* ``scaleout``: playback over devices and hosts, runtime FI of
  data-parallel training;
* ``fuzz``: ``fuzz`` (the KUT on variants of captured real inputs: other
  shapes, masks, magnitudes) and ``export_repro`` (one record as a
  regression test for the kernel's repository);
* ``campaigns``: ``validate`` (the whole pipeline), provenance, a report
  rebuilt from a campaign directory, ``read_campaign``.

This facade lists the Profiler's public names; ``peat_jax`` re-exports the
main ones.
"""

from peat_jax.profiler.campaigns import CampaignPaths as CampaignPaths
from peat_jax.profiler.fuzz import FUZZ_FAMILIES as FUZZ_FAMILIES
from peat_jax.profiler.fuzz import FamilyCoverage as FamilyCoverage
from peat_jax.profiler.fuzz import FuzzResult as FuzzResult
from peat_jax.profiler.fuzz import coverage_line as fuzz_coverage_line
from peat_jax.profiler.fuzz import Repro as Repro
from peat_jax.profiler.fuzz import export_repro as export_repro
from peat_jax.profiler.fuzz import fuzz as fuzz
from peat_jax.profiler.files import campaign_lock as campaign_lock
from peat_jax.profiler.campaigns import validate as validate
from peat_jax.profiler.campaigns import SOURCES as SOURCES
from peat_jax.profiler.campaigns import load_report_data as load_report_data
from peat_jax.profiler.campaigns import rebuild_report as rebuild_report
from peat_jax.profiler.capture import ProfileResult as ProfileResult
from peat_jax.profiler.capture import capture_step_list as capture_step_list
from peat_jax.profiler.capture import profile as profile
from peat_jax.profiler.capture import load_record as load_record
from peat_jax.profiler.capture import read_index as read_index
from peat_jax.profiler.golden import saved_steps as saved_steps
from peat_jax.profiler.golden import reader as local_reader
from peat_jax.profiler.golden import restore_on as restore_on
from peat_jax.profiler.scaleout import data_parallel_runtime as data_parallel_runtime
from peat_jax.profiler.scaleout import shard_kut as shard_kut
from peat_jax.profiler.golden import GoldenResult as GoldenResult
from peat_jax.profiler.golden import StateReader as StateReader
from peat_jax.profiler.golden import abstract_state as abstract_state
from peat_jax.profiler.golden import golden_train as golden_train
from peat_jax.profiler.golden import read_log as read_log
from peat_jax.profiler.golden import restore_state as restore_state
from peat_jax.profiler.isolation import MEMORY_LIMIT_MB as MEMORY_LIMIT_MB
from peat_jax.profiler.isolation import STARTUP_S as STARTUP_S
from peat_jax.profiler.isolation import TIMEOUT_S as TIMEOUT_S
from peat_jax.profiler.isolation import TaskFactory as TaskFactory
from peat_jax.profiler.isolation import check_kut as check_kut
from peat_jax.profiler.isolation import read_findings as read_findings
from peat_jax.profiler.files import CAPTURE_DIR as CAPTURE_DIR
from peat_jax.profiler.files import CHECKPOINT_DIR as CHECKPOINT_DIR
from peat_jax.profiler.files import CRASH_FILE as CRASH_FILE
from peat_jax.profiler.files import EVAL_FILE as EVAL_FILE
from peat_jax.profiler.files import GOLDEN_DIR as GOLDEN_DIR
from peat_jax.profiler.files import LOCK_FILE as LOCK_FILE
from peat_jax.profiler.files import LOG_FILE as LOG_FILE
from peat_jax.profiler.files import MONITOR_FILE as MONITOR_FILE
from peat_jax.profiler.files import OPS_FILE as OPS_FILE
from peat_jax.profiler.files import FUZZ_FILE as FUZZ_FILE
from peat_jax.profiler.files import PLAYBACK_FILE as PLAYBACK_FILE
from peat_jax.profiler.files import REPORT_HTML as REPORT_HTML
from peat_jax.profiler.files import REPORT_JSON as REPORT_JSON
from peat_jax.profiler.files import RUNTIME_DP_FILE as RUNTIME_DP_FILE
from peat_jax.profiler.files import RUNTIME_FILE as RUNTIME_FILE
from peat_jax.profiler.files import RUN_FILE as RUN_FILE
from peat_jax.profiler.files import SETTINGS_FILE as SETTINGS_FILE
from peat_jax.profiler.files import SHARD_DIR as SHARD_DIR
from peat_jax.profiler.runtime_fi import Monitor as Monitor
from peat_jax.profiler.capture import OpsResult as OpsResult
from peat_jax.profiler.capture import captures_dir_of as captures_dir_of
from peat_jax.profiler.capture import playback_ops as playback_ops
from peat_jax.profiler.capture import select_entries as select_entries
from peat_jax.profiler.playback_fi import Player as Player
from peat_jax.profiler.playback_fi import PlayerGroup as PlayerGroup
from peat_jax.profiler.playback_fi import select_calls as select_calls
from peat_jax.profiler.playback_fi import PlaybackResult as PlaybackResult
from peat_jax.profiler.playback_fi import playback as playback
from peat_jax.profiler.playback_fi import playback_many as playback_many
from peat_jax.profiler.files import RecordFileError as RecordFileError
from peat_jax.profiler.files import append_records as append_records
from peat_jax.profiler.files import read_records as read_records
from peat_jax.profiler.files import repair_records as repair_records
from peat_jax.profiler.files import signature_record as signature_record
from peat_jax.profiler.runtime_fi import RuntimeResult as RuntimeResult
from peat_jax.profiler.runtime_fi import divergence as divergence
from peat_jax.profiler.runtime_fi import envelope as envelope
from peat_jax.profiler.runtime_fi import parse_frequency as parse_frequency
from peat_jax.profiler.runtime_fi import runtime as runtime
from peat_jax.profiler.scaleout import init_distributed as init_distributed
from peat_jax.profiler.scaleout import merge_shards as merge_shards
from peat_jax.profiler.scaleout import sharded_playback as sharded_playback
from peat_jax.profiler.playback_fi import site_record as site_record
from peat_jax.profiler.playback_fi import ProbeCache as ProbeCache
from peat_jax.profiler.golden import TrainState as TrainState
from peat_jax.profiler.golden import TrainTask as TrainTask
from peat_jax.profiler.campaigns import CampaignFiles as CampaignFiles
from peat_jax.profiler.campaigns import read_campaign_files as read_campaign_files
from peat_jax.profiler.golden import nnx_step_fn as nnx_step_fn
from peat_jax.profiler.golden import nnx_task as nnx_task
from peat_jax.profiler.campaigns import CampaignResults as CampaignResults
from peat_jax.profiler.campaigns import CampaignVerdict as CampaignVerdict
from peat_jax.profiler.campaigns import EffectRecord as EffectRecord
from peat_jax.profiler.campaigns import Finding as Finding
from peat_jax.profiler.campaigns import Provenance as Provenance
from peat_jax.profiler.campaigns import RuntimeRun as RuntimeRun
from peat_jax.profiler.campaigns import SiteRecord as SiteRecord
from peat_jax.profiler.campaigns import read_campaign as read_campaign
from peat_jax.profiler.runtime_fi import distances as weight_distances
