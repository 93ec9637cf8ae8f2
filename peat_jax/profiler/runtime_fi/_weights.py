"""Weight distances of runtime FI runs, and the bf16-proxy training step.

Training-level significance (docs/profiler.md): at every saved step of the
runtime FI window, each run's parameters are compared with the golden
trajectory's (the golden run's checkpoint at that step), per layer (one
parameter leaf, named by :func:`peat_jax.injectors.tree_path`) and in total:

* relative L2: ``||w - w_golden|| / ||w_golden||``; the total over every
  parameter at once;
* Wasserstein-1 of the weight values, as in "Is Flash Attention Stable?"
  (Golden et al., arXiv 2405.02803): the distance between the empirical
  distributions of a layer's values in the two runs; for two layers of ``n``
  values it is ``mean(|sort(w) - sort(w_golden)|)``. The total is the mean
  of the layers' distances weighted by their sizes (the transport cost when
  every value stays within its layer).

The distances are computed on the device by one jitted function per
parameter structure; only ``2 x layers`` scalars per saved step come to the
host and into ``runtime.msgpack``.

The precision proxy (:func:`bf16_proxy`) is the same training with the
inputs of every matmul and convolution (forward and backward) rounded one
format below their own: float32 inputs to bfloat16 (the ``precision:bf16``
error model, accumulating in float32 as bf16 training does), bfloat16 and
float16 inputs to float8 e4m3 with one scale per tensor (FP8 training's
forward format and scaling). A model that already computes in bf16 has
bf16 matmul inputs, so rounding them to bf16 again would change nothing and
the yardstick would be the golden run itself; one format below the model's
own precision is what a precision change known to be acceptable does to
its weights. :func:`proxy_formats` names the formats a step's proxy uses.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax import core as _core
from peat_jax import injectors as _injectors
from peat_jax import sites as _sites

#: Record keys of a run's weight distances (``runtime.msgpack``).
METRICS = ("w1", "rel_l2")
#: Bytes of golden parameters :class:`GoldenParams` keeps in memory.
CACHE_BYTES = 1 << 30
_PROXY_KERNELS = ("dot_general", "conv_general_dilated")


def _float_leaves(params) -> tuple[list[str], list[Any]]:
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  keep = [(p, x) for p, x in flat
          if jnp.issubdtype(jnp.result_type(x), jnp.floating)]
  return ([_injectors.tree_path(p) for p, _ in keep], [x for _, x in keep])


@jax.jit
def _stats(run: Sequence[jax.Array], golden: Sequence[jax.Array]
           ) -> jax.Array:
  """float32[3, layers]: squared distance, squared norm, Wasserstein-1."""
  rows = []
  for a, b in zip(run, golden):
    a = a.astype(jnp.float32).ravel()
    b = b.astype(jnp.float32).ravel()
    d = a - b
    rows.append(jnp.stack([jnp.sum(d * d), jnp.sum(b * b),
                           jnp.mean(jnp.abs(jnp.sort(a) - jnp.sort(b)))]))
  return jnp.stack(rows, axis=1)


def _ratio_l2(sq: float, ref: float) -> float:
  if ref > 0:
    return math.sqrt(sq / ref)
  return 0.0 if sq == 0 else math.inf


def distances(run_params, golden_params) -> dict:
  """Per-layer and total distances of two parameter trees of one structure.

  Args:
    run_params: a run's parameters.
    golden_params: the golden parameters at the same step.

  Returns:
    ``{"layers": [path], "w1": [per layer], "rel_l2": [per layer],
    "w1_total": float, "rel_l2_total": float}`` (Python floats).
  """
  names, a = _float_leaves(run_params)
  _, b = _float_leaves(golden_params)
  sq, ref, w1 = np.asarray(jax.device_get(_stats(a, b)), np.float64)
  sizes = np.array([np.size(x) for x in b], np.float64)
  return {"layers": names, "w1": w1.tolist(),
          "rel_l2": [_ratio_l2(s, r) for s, r in zip(sq, ref)],
          "w1_total": float(np.sum(sizes * w1) / max(np.sum(sizes), 1.0)),
          "rel_l2_total": _ratio_l2(float(np.sum(sq)), float(np.sum(ref)))}


class Tracker:
  """Collects one run's distances at chosen steps while it trains.

  Pass :meth:`see` to the training loop; it is called after every step
  with the number of steps done and the new parameters.
  """

  def __init__(self, at: Sequence[int], reference: Callable[[int], Any],
               offset: int = 0):
    """Args:
      at: step counts (steps done in the run) at which to measure.
      reference: ``reference(count)``: the golden parameters there.
      offset: added to a count to give the recorded step number.
    """
    self._at, self._ref, self._offset = set(at), reference, offset
    self._rows: list[tuple[int, dict]] = []

  def see(self, count: int, params) -> None:
    """Measures the run's parameters after ``count`` steps, if chosen."""
    if count in self._at:
      self._rows.append((count + self._offset,
                         distances(params, self._ref(count))))

  def record(self) -> dict | None:
    """The run's ``weights`` record field (None when nothing was measured):
    ``{"steps", "layers", "w1": [[per layer] per step], "rel_l2": [...],
    "w1_total": [per step], "rel_l2_total": [per step]}``."""
    if not self._rows:
      return None
    first = self._rows[0][1]
    out = {"steps": [s for s, _ in self._rows], "layers": first["layers"]}
    for m in METRICS:
      out[m] = [d[m] for _, d in self._rows]
      out[m + "_total"] = [d[m + "_total"] for _, d in self._rows]
    return out


def worst(records: Sequence[dict | None]) -> dict | None:
  """Element-wise maximum of several runs' ``weights`` (the seed spread)."""
  recs = [r for r in records if r]
  if not recs:
    return None
  out = {"steps": recs[0]["steps"], "layers": recs[0]["layers"]}
  for m in METRICS:
    out[m] = np.max([r[m] for r in recs], axis=0).tolist()
    out[m + "_total"] = np.max([r[m + "_total"] for r in recs],
                               axis=0).tolist()
  return out


class GoldenParams:
  """The golden trajectory's parameters at saved steps, from checkpoints.

  Restored on first use and kept while they fit in :data:`CACHE_BYTES`
  (restored again on each use beyond that).
  """

  def __init__(self, restore: Callable[[int], Any]):
    """Args: restore: ``restore(step)``: the golden state at that step."""
    self._restore, self._cache, self._bytes = restore, {}, 0

  def __call__(self, step: int):
    if step in self._cache:
      return self._cache[step]
    params = self._restore(step).params
    size = sum(np.size(x) * jnp.result_type(x).itemsize
               for x in jax.tree.leaves(params))
    if self._bytes + size <= CACHE_BYTES:
      self._cache[step], self._bytes = params, self._bytes + size
    return params


class WeightProbe(NamedTuple):
  """What runtime FI needs to record weight distances (``run_frequencies``).

  Attributes:
    steps: the saved golden steps inside the runtime window, at which every
      run is compared with the golden trajectory.
    golden: ``golden(step)``: the golden parameters at a saved step.
    bf16_step: ``bf16_step()``: the precision-proxy train step (jitted;
      built on first call, so a resumed campaign that has its proxy run
      does not trace it).
    proxy: ``proxy()``: the formats the proxy rounds to
      (:func:`proxy_formats`).
  """

  steps: tuple
  golden: Callable[[int], Any]
  bf16_step: Callable[[], Callable]
  proxy: Callable[[], str] = lambda: "bf16"


def window_steps(saved: Sequence[int], start_step: int, steps: int
                 ) -> tuple[int, ...]:
  """The saved steps ``s`` with ``start_step < s <= start_step + steps``."""
  return tuple(int(s) for s in saved if start_step < s <= start_step + steps)


#: The largest finite float8 e4m3 (``float8_e4m3fn``) value.
_E4M3_MAX = 448.0


def proxy_format(dtype) -> str | None:
  """The format the proxy rounds an input of ``dtype`` to (None: kept).

  Args:
    dtype: an operand's dtype.

  Returns:
    ``"bf16"`` for float32 and float64, ``"fp8_e4m3"`` for bfloat16 and
    float16, None otherwise (integers, float8).
  """
  dt = jnp.dtype(dtype)
  if dt in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
    return "bf16"
  if dt in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return "fp8_e4m3"
  return None


def _fp8_scaled(x: jax.Array) -> jax.Array:
  """``x`` rounded to float8 e4m3 with one scale per tensor (amax / 448)."""
  xf = x.astype(jnp.float32)
  amax = jnp.max(jnp.abs(jnp.where(jnp.isfinite(xf), xf, 0.0)))
  scale = jnp.where(amax > 0, amax / _E4M3_MAX, 1.0)
  # Rounded by operations XLA:GPU keeps (a convert pair it may remove).
  q = _injectors.kept_rounding(xf / scale, _core.get_format("fp8_e4m3"))
  return jnp.where(jnp.isfinite(xf), q * scale, xf).astype(x.dtype)


def _one_below(x: jax.Array) -> jax.Array:
  fmt = proxy_format(x.dtype)
  if fmt == "bf16":
    return _injectors.inject("precision:bf16", jax.random.key(0), x)
  if fmt == "fp8_e4m3":
    return _fp8_scaled(x)
  return x


def _bf16_inputs(*operands, **params):
  """A matmul or convolution with its inputs one format below their own."""
  prim = (lax.conv_general_dilated_p if "window_strides" in params
          else lax.dot_general_p)
  return prim.bind(*[_one_below(x) for x in operands], **params)


def proxy_formats(step_fn: Callable, state, batch, table=None) -> str:
  """The formats :func:`bf16_proxy` rounds a step's matmul inputs to.

  Args:
    step_fn: the un-jitted train step.
    state: a state of the task.
    batch: a batch of the task.
    table: the step's site table when discovered already.

  Returns:
    ``"bf16"``, ``"fp8_e4m3"`` or both joined by ``"+"`` (float32 and
    16-bit matmuls in one model); ``"none"`` without a floating matmul or
    convolution.
  """
  if table is None:
    table = _sites.discover_sites(step_fn, state, batch)
  fmts = {proxy_format(d) for s in table if s.kernel in _PROXY_KERNELS
          for d in s.in_dtypes} - {None}
  return "+".join(f for f in ("bf16", "fp8_e4m3") if f in fmts) or "none"


def bf16_proxy(step_fn: Callable, state, batch, table=None) -> Callable:
  """``step_fn`` with every matmul and convolution one format below its own.

  Every ``dot_general`` and ``conv_general_dilated`` site of the step, in
  the forward and the backward pass, gets its floating inputs rounded one
  format below their dtype (:func:`proxy_format`: float32 to the nearest
  bfloat16, ``precision:bf16``; bfloat16 and float16 to float8 e4m3 with a
  per-tensor scale) and accumulates as the golden kernel does. The name
  stays from when every model trained in float32.

  Args:
    step_fn: the un-jitted train step.
    state: a state of the task (site discovery).
    batch: a batch of the task.
    table: the step's site table when discovered already.

  Returns:
    The substituted (un-jitted) step; ``step_fn`` itself when the step has
    no matmul or convolution.
  """
  if table is None:
    table = _sites.discover_sites(step_fn, state, batch)
  kernels = tuple(k for k in _PROXY_KERNELS
                  if any(s.kernel == k for s in table))
  if not kernels:
    return step_fn
  return _sites.substitute(step_fn, _sites.Substitution(
      _bf16_inputs, kernel=kernels))


def probe(step_fn: Callable, jit: Callable[[Callable], Callable], *,
          saved: Sequence[int], start_step: int, steps: int,
          restore: Callable[[int], Any], state, batch) -> WeightProbe | None:
  """The :class:`WeightProbe` of a runtime FI call (None: no saved step).

  Args:
    step_fn: the un-jitted train step.
    jit: how the call jits a step (``jax.jit``, or onto a mesh).
    saved: the golden run's saved steps.
    start_step: the runtime window's first step.
    steps: the window's length.
    restore: ``restore(step)``: a golden state.
    state: a state of the task (site discovery for the proxy).
    batch: a batch of the task.

  Returns:
    The probe, or None when no saved step lies in the window (then no
    distance is recorded).
  """
  at = window_steps(saved, start_step, steps)
  if not at:
    return None
  built: list[Callable] = []
  tables: list = []

  def table():  # one discovery for the proxy step and its formats
    if not tables:
      tables.append(_sites.discover_sites(step_fn, state, batch))
    return tables[0]

  def bf16_step() -> Callable:
    if not built:
      built.append(jit(bf16_proxy(step_fn, state, batch, table())))
    return built[0]

  return WeightProbe(at, GoldenParams(restore), bf16_step,
                     lambda: proxy_formats(step_fn, state, batch, table()))


__all__ = ["METRICS", "Tracker", "GoldenParams", "WeightProbe", "bf16_proxy",
           "proxy_format", "proxy_formats",
           "distances", "probe", "window_steps", "worst"]
