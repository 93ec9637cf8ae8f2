"""The campaign directory layout: every file and folder name, in one place.

A campaign is one directory (docs/campaign.md)::

  <campaign>/campaign.json        settings; another campaign's settings -> error
  <campaign>/.lock                fcntl lock: one writer at a time
  <campaign>/golden/              golden run (peat.golden_train):
      run.json                    what was run (task, config, seed, budget)
      checkpoints/                Orbax CheckpointManager, one step every k
      log.msgpack                 per-step loss, gradient and update norms
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
are described in :mod:`peat_jax.profiler._records`; the report's files are
named by :mod:`peat_jax.report`.
"""

from peat_jax.report import HTML_NAME as REPORT_HTML
from peat_jax.report import JSON_NAME as REPORT_JSON

SETTINGS_FILE = "campaign.json"
LOCK_FILE = ".lock"
GOLDEN_DIR = "golden"
PLAYBACK_FILE = "playback.msgpack"
RUNTIME_FILE = "runtime.msgpack"
RUNTIME_DP_FILE = "runtime_data_parallel.msgpack"
CRASH_FILE = "crashes.msgpack"
CAPTURE_DIR = "captures"
CAPTURE_INDEX_FILE = "index.json"
OPS_FILE = "ops.msgpack"
SHARD_DIR = "playback_shards"
ISOLATE_TMP_DIR = ".isolate"
MONITOR_FILE = "monitor.msgpack"
# Inside the golden run's working directory.
RUN_FILE = "run.json"
CHECKPOINT_DIR = "checkpoints"
LOG_FILE = "log.msgpack"
EVAL_FILE = "eval.json"

__all__ = ["REPORT_HTML", "REPORT_JSON", "SETTINGS_FILE", "LOCK_FILE",
           "GOLDEN_DIR", "PLAYBACK_FILE", "RUNTIME_FILE", "RUNTIME_DP_FILE",
           "CRASH_FILE", "CAPTURE_DIR", "CAPTURE_INDEX_FILE", "OPS_FILE",
           "SHARD_DIR", "ISOLATE_TMP_DIR", "MONITOR_FILE", "RUN_FILE",
           "CHECKPOINT_DIR", "LOG_FILE", "EVAL_FILE"]
