"""Runtime FI: training continued with the KUT called at a frequency.

Errors persist and propagate; the runs are compared with the golden
trajectory. Private modules: ``_runtime`` (``runtime``: frequencies,
divergence, the golden envelope), ``_weights`` (weight distances to the
golden trajectory, the bf16-proxy step), ``_significance`` (those distances
in units of the seed and bf16 yardsticks) and ``_monitor`` (``Monitor``:
a KUT inside a user's own training loop, with taps every n-th step).
"""

from peat_jax.profiler.runtime_fi._weights import distances as distances
from peat_jax.profiler.runtime_fi._weights import probe as probe
from peat_jax.profiler.runtime_fi._runtime import REFERENCE_RUNS as REFERENCE_RUNS
from peat_jax.profiler.runtime_fi._runtime import RuntimeResult as RuntimeResult
from peat_jax.profiler.runtime_fi._runtime import divergence as divergence
from peat_jax.profiler.runtime_fi._runtime import envelope as envelope
from peat_jax.profiler.runtime_fi._runtime import parse_frequency as parse_frequency
from peat_jax.profiler.runtime_fi._runtime import run_frequencies as run_frequencies
from peat_jax.profiler.runtime_fi._runtime import runtime as runtime
from peat_jax.profiler.runtime_fi._runtime import runtime_result as runtime_result
from peat_jax.profiler.runtime_fi._monitor import Monitor as Monitor
