"""Playback FI: saved golden steps replayed with the KUT at chosen sites.

Private modules: ``_player`` (the jitted pair of steps, golden and
substituted, with taps on identical inputs), ``_site_records`` (a
checkpoint's records: references, the triage screen, the
decomposition of flagged records, the port probe carried per site,
diagnoses), ``_probe_refs`` (the port probe's input-precision
hypotheses, an executable each), ``_carried_probe`` (the port probe's
tries on the device), ``_invariance`` (the invariance checks of
``invariance=True``), ``_timing`` (per-phase timers) and ``_playback``
(the driver over checkpoints: ``playback``, ``playback_many``).
"""

from peat_jax.profiler.playback_fi._site_records import ProbeCache as ProbeCache
from peat_jax.profiler.playback_fi._site_records import site_record as site_record
from peat_jax.profiler.playback_fi._site_records import site_reference as site_reference
from peat_jax.profiler.playback_fi._site_records import reduction_length as reduction_length
from peat_jax.profiler.playback_fi._player import Player as Player
from peat_jax.profiler.playback_fi._player import PlayerGroup as PlayerGroup
from peat_jax.profiler.playback_fi._player import select_calls as select_calls
from peat_jax.profiler.playback_fi._playback import PlaybackResult as PlaybackResult
from peat_jax.profiler.playback_fi._playback import plan_steps as plan_steps
from peat_jax.profiler.playback_fi._playback import campaign_records as campaign_records
from peat_jax.profiler.playback_fi._playback import playback as playback
from peat_jax.profiler.playback_fi._playback import playback_many as playback_many
from peat_jax.profiler.playback_fi._playback import playback_plan as playback_plan
from peat_jax.profiler.playback_fi._playback import playback_result as playback_result
from peat_jax.profiler.playback_fi._playback import step_line as step_line
