"""The campaign directory's files: their names, the record files, the lock.

The lowest layer of the Profiler: every other part reads and writes a
campaign directory through it (docs/campaign.md). Private modules:
``_layout`` (every file and folder name of a campaign directory),
``_records`` (append-only, checksummed msgpack record files, their repair,
the record form of a Signature) and ``_lock`` (one writer per directory) and ``_arrays`` (``.npz`` files of
arrays with their dtypes, shapes and SHA-256 checked on load).
"""

from peat_jax.profiler.files._layout import CAPTURE_DIR as CAPTURE_DIR
from peat_jax.profiler.files._layout import CAPTURE_INDEX_FILE as CAPTURE_INDEX_FILE
from peat_jax.profiler.files._layout import CHECKPOINT_DIR as CHECKPOINT_DIR
from peat_jax.profiler.files._layout import CRASH_FILE as CRASH_FILE
from peat_jax.profiler.files._layout import EVAL_FILE as EVAL_FILE
from peat_jax.profiler.files._layout import GOLDEN_DIR as GOLDEN_DIR
from peat_jax.profiler.files._layout import GOLDEN_STEP_DIR as GOLDEN_STEP_DIR
from peat_jax.profiler.files._layout import ISOLATE_TMP_DIR as ISOLATE_TMP_DIR
from peat_jax.profiler.files._layout import LOCK_FILE as LOCK_FILE
from peat_jax.profiler.files._layout import LOG_FILE as LOG_FILE
from peat_jax.profiler.files._layout import MONITOR_FILE as MONITOR_FILE
from peat_jax.profiler.files._layout import OPS_FILE as OPS_FILE
from peat_jax.profiler.files._layout import FUZZ_FILE as FUZZ_FILE
from peat_jax.profiler.files._layout import REPRO_DIR as REPRO_DIR
from peat_jax.profiler.files._layout import PLAYBACK_FILE as PLAYBACK_FILE
from peat_jax.profiler.files._layout import PROVENANCE_FILE as PROVENANCE_FILE
from peat_jax.profiler.files._layout import REPORT_HTML as REPORT_HTML
from peat_jax.profiler.files._layout import REPORT_JSON as REPORT_JSON
from peat_jax.profiler.files._layout import RUNTIME_DP_FILE as RUNTIME_DP_FILE
from peat_jax.profiler.files._layout import RUNTIME_FILE as RUNTIME_FILE
from peat_jax.profiler.files._layout import RUN_FILE as RUN_FILE
from peat_jax.profiler.files._layout import SETTINGS_FILE as SETTINGS_FILE
from peat_jax.profiler.files._layout import SHARD_DIR as SHARD_DIR
from peat_jax.profiler.files._layout import campaign_dirs as campaign_dirs
from peat_jax.profiler.files._layout import checkpoint_dir_of as checkpoint_dir_of
from peat_jax.profiler.files._records import RecordFileError as RecordFileError
from peat_jax.profiler.files._records import append_records as append_records
from peat_jax.profiler.files._records import of_campaign as of_campaign
from peat_jax.profiler.files._records import read_records as read_records
from peat_jax.profiler.files._records import record_backward as record_backward
from peat_jax.profiler.files._records import repair_records as repair_records
from peat_jax.profiler.files._records import rewrite_records as rewrite_records
from peat_jax.profiler.files._records import signature_record as signature_record
from peat_jax.profiler.files._records import tag_backward as tag_backward
from peat_jax.profiler.files._lock import campaign_lock as campaign_lock
from peat_jax.profiler.files._arrays import arrays_bytes as arrays_bytes
from peat_jax.profiler.files._arrays import load_arrays as load_arrays
from peat_jax.profiler.files._arrays import sha256 as sha256
from peat_jax.profiler.files._arrays import storable as storable
from peat_jax.profiler.files._arrays import write_file as write_file
