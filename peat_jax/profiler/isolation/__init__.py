"""Isolation: playback and runtime FI in worker processes.

A KUT that crashes, hangs or exhausts memory becomes a finding, not the end
of the campaign (docs/reliability.md). Private modules: ``_isolate`` (the
worker protocol, limits, ``TaskFactory``), ``_isolate_worker`` (the worker
process's entry point) and ``_isolated`` (isolated playback and runtime,
``check_kut``, findings).
"""

from peat_jax.profiler.isolation._isolate import MEMORY_LIMIT_MB as MEMORY_LIMIT_MB
from peat_jax.profiler.isolation._isolate import STARTUP_S as STARTUP_S
from peat_jax.profiler.isolation._isolate import TIMEOUT_S as TIMEOUT_S
from peat_jax.profiler.isolation._isolate import TaskFactory as TaskFactory
from peat_jax.profiler.isolation._isolated import check_kut as check_kut
from peat_jax.profiler.isolation._isolated import isolated_playback as isolated_playback
from peat_jax.profiler.isolation._isolated import isolated_runtime as isolated_runtime
from peat_jax.profiler.isolation._isolated import read_findings as read_findings
