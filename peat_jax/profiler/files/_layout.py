"""The campaign directory layout: every file and folder name, in one place.

A campaign is one directory (docs/campaign.md)::

  <campaign>/campaign.json        settings; another campaign's settings -> error
  <campaign>/provenance.json      what ran: KUT (content hash), platform,
                                  versions, the sites' shapes and dtypes
  <campaign>/.lock                fcntl lock: one writer at a time
  <campaign>/golden/              golden run (peat.golden_train):
      run.json                    what was run (task, config, seed, budget)
      checkpoints/                Orbax CheckpointManager, one step every k
      log.msgpack                 per-step loss, gradient and update norms
      golden_step/                the parameters after each checkpoint's
                                  next step (<s>.npz, <s>.json): playback
                                  runs the KUT's step only
      eval.json                   held-out metrics of the final state
  <campaign>/playback.msgpack     one record per (step, site) + one per step
  <campaign>/runtime.msgpack      one record per frequency + golden/spread
  <campaign>/runtime_data_parallel.msgpack   data-parallel runtime FI
  <campaign>/crashes.msgpack      crash and hang findings (process isolation)
  <campaign>/captures/            captured site inputs: index.json, step_<s>/
  <campaign>/ops.msgpack          op-level playback records
  <campaign>/playback_shards/     per-process record files of a scale-out
  <campaign>/.isolate/            scratch of isolated runtime FI workers
  <campaign>/report.html, report.json

The Monitor writes ``monitor.msgpack`` into its own directory. Record files
are described in :mod:`peat_jax.profiler.files._records`; the report's files are
named by :mod:`peat_jax.report`.
"""

import os
from typing import NamedTuple

from peat_jax.report import HTML_NAME as REPORT_HTML
from peat_jax.report import JSON_NAME as REPORT_JSON

SETTINGS_FILE = "campaign.json"
PROVENANCE_FILE = "provenance.json"
LOCK_FILE = ".lock"
GOLDEN_DIR = "golden"
PLAYBACK_FILE = "playback.msgpack"
RUNTIME_FILE = "runtime.msgpack"
RUNTIME_DP_FILE = "runtime_data_parallel.msgpack"
CRASH_FILE = "crashes.msgpack"
CAPTURE_DIR = "captures"
CAPTURE_INDEX_FILE = "index.json"
OPS_FILE = "ops.msgpack"
FUZZ_FILE = "fuzz.msgpack"
REPRO_DIR = "repro"
SHARD_DIR = "playback_shards"
ISOLATE_TMP_DIR = ".isolate"
MONITOR_FILE = "monitor.msgpack"
# Inside the golden run's working directory.
RUN_FILE = "run.json"
CHECKPOINT_DIR = "checkpoints"
LOG_FILE = "log.msgpack"
EVAL_FILE = "eval.json"
GOLDEN_STEP_DIR = "golden_step"



def checkpoint_dir_of(path: str | os.PathLike) -> str:
  """The checkpoint directory of a golden run's workdir (or that directory).

  Args:
    path: a golden run's workdir, or its ``checkpoints/`` directory.

  Returns:
    The absolute path of the checkpoint directory.
  """
  path = os.path.abspath(os.fspath(path))
  sub = os.path.join(path, CHECKPOINT_DIR)
  return sub if os.path.isdir(sub) else path


class CampaignDirs(NamedTuple):
  """Where a campaign driver reads the golden run and writes its records.

  Attributes:
    golden: the golden run's workdir (absolute).
    checkpoints: its checkpoint directory.
    campaign: the campaign directory (created).
  """

  golden: str
  checkpoints: str
  campaign: str


def campaign_dirs(golden_dir: str | os.PathLike,
                  campaign_dir: str | os.PathLike | None) -> CampaignDirs:
  """The directories of a playback or runtime FI call (see CampaignDirs).

  Args:
    golden_dir: the golden run's workdir (or its checkpoint directory).
    campaign_dir: where the records go (default: the golden workdir's
      parent, the campaign directory of ``peat.validate``).

  Returns:
    :class:`CampaignDirs`, the campaign directory created.
  """
  golden = os.path.abspath(os.fspath(golden_dir))
  campaign = os.path.abspath(os.fspath(campaign_dir or
                                       os.path.dirname(golden)))
  os.makedirs(campaign, exist_ok=True)
  return CampaignDirs(golden, checkpoint_dir_of(golden), campaign)


__all__ = ["checkpoint_dir_of", "campaign_dirs", "CampaignDirs", "REPORT_HTML", "REPORT_JSON", "SETTINGS_FILE", "PROVENANCE_FILE", "LOCK_FILE",
           "GOLDEN_DIR", "PLAYBACK_FILE", "RUNTIME_FILE", "RUNTIME_DP_FILE",
           "CRASH_FILE", "CAPTURE_DIR", "CAPTURE_INDEX_FILE", "OPS_FILE", "FUZZ_FILE", "REPRO_DIR",
           "SHARD_DIR", "ISOLATE_TMP_DIR", "MONITOR_FILE", "RUN_FILE",
           "CHECKPOINT_DIR", "LOG_FILE", "EVAL_FILE", "GOLDEN_STEP_DIR"]
