"""Captures: golden profiles with site inputs saved, and op-level playback.

Private modules: ``_capture`` (``profile``: a golden run that saves the
inputs of chosen sites at chosen steps under a storage budget),
``_capture_io`` (the capture files and their index) and ``_oplevel``
(``playback_ops``: the KUT on captured inputs, no train step).
"""

from peat_jax.profiler.capture._capture_io import load_record as load_record
from peat_jax.profiler.capture._capture_io import read_index as read_index
from peat_jax.profiler.capture._capture_io import _Slot as ArraySlot
from peat_jax.profiler.capture._capture_io import decode_params as decode_params
from peat_jax.profiler.capture._capture_io import decode_value as decode_value
from peat_jax.profiler.capture._capture_io import encode_value as encode_value
from peat_jax.profiler.capture._capture_io import eqn_at as eqn_at
from peat_jax.profiler.capture._capture_io import site_fields as site_fields
from peat_jax.profiler.capture._capture_io import site_of as site_of
from peat_jax.profiler.capture._capture import ProfileResult as ProfileResult
from peat_jax.profiler.capture._capture import capture_step_list as capture_step_list
from peat_jax.profiler.capture._capture import profile as profile
from peat_jax.profiler.capture._oplevel import OpsResult as OpsResult
from peat_jax.profiler.capture._oplevel import captures_dir_of as captures_dir_of
from peat_jax.profiler.capture._oplevel import playback_ops as playback_ops
from peat_jax.profiler.capture._oplevel import select_entries as select_entries
