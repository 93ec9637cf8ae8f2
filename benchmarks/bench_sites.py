"""Cost of tapping N sites of a train step, as a ratio to the plain step.

For one scenario of ``peat_jax.models`` this compiles, in the same run and on
the same state and batch:

* the plain jitted train step (the baseline);
* ``substitute`` with the golden kernel at every site (the interpreter's
  overhead in the compiled step: expected 1.0);
* ``tap`` of N sites, N = 1, 10 and all, with the golden kernel as KUT (each
  tapped site runs its kernel twice and returns its inputs and both outputs),
  and, for all sites, capture only (``kut=None``).

Tapped sites are spread evenly over the step's site list (forward, backward
and update). Reported: median step time over repeats (compilation excluded)
and its ratio to the baseline; compile time is reported apart.

Usage:
  .venv/bin/python benchmarks/bench_sites.py [--scenario=gpt] [--repeat=20]
"""

import json
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from peat_jax import models
import peat_jax as peat

_SCENARIO = flags.DEFINE_string("scenario", "gpt", "Scenario from peat_jax.models.")
_OVERRIDES = flags.DEFINE_string(
    "overrides", '{"batch_size": 8, "context": 64, "model_kwargs": {"dim": 64, "depth": 2}}',
    "Config overrides as JSON (the default keeps a GPT step near 10 ms on 2 cores).")
_REPEAT = flags.DEFINE_integer("repeat", 20, "Timed calls per variant (median reported).")


def _fresh_state(task):
  shapes = jax.eval_shape(lambda: task.init_state(0))
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      x = rng.standard_normal(leaf.shape).astype(leaf.dtype)
      if "params" in str(path[0]):
        return jnp.asarray(x / np.sqrt(leaf.shape[-2]) if leaf.ndim >= 2 else 0.1 * x)
      return jnp.asarray(np.abs(x) * 1e-3)
    return jnp.zeros(leaf.shape, leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def _compile(fn, state, batch):
  t0 = time.perf_counter()
  jax.block_until_ready(fn(state, batch))
  compile_s = time.perf_counter() - t0
  jax.block_until_ready(fn(state, batch))
  return compile_s


def _time_interleaved(fns, state, batch, repeat):
  """Median seconds per call; variants alternate so that load drifts hit all."""
  times = [[] for _ in fns]
  for _ in range(repeat):
    for i, fn in enumerate(fns):
      t = time.perf_counter()
      jax.block_until_ready(fn(state, batch))
      times[i].append(time.perf_counter() - t)
  return [statistics.median(t) for t in times]


def _spread(names, n):
  if n >= len(names):
    return tuple(names)
  idx = np.linspace(0, len(names) - 1, n).round().astype(int)
  return tuple(names[i] for i in sorted(set(idx)))


def main(argv):
  del argv
  task = models.get_task(_SCENARIO.value, **json.loads(_OVERRIDES.value))
  state, batch = _fresh_state(task), task.batch_at(0)
  sites = peat.discover_sites(task.step_fn, state, batch)
  names = sites.names()
  print(f"{task.name}: {len(names)} sites; config {json.dumps(task.config['model_kwargs'])}, "
        f"batch {task.config['batch_size']}; {jax.device_count()} {jax.default_backend()} device")
  variants = [("plain step", jax.jit(task.step_fn)),
              ("substitute golden, all sites",
               jax.jit(peat.substitute(task.step_fn, peat.Substitution(
                   peat.GOLDEN, phase=("fwd", "bwd", "upd")))))]
  for n in (1, 10, len(names)):
    label = "all" if n == len(names) else str(n)
    variants.append((f"tap {label} sites (golden as KUT)", jax.jit(peat.tap(
        task.step_fn, peat.Substitution(peat.GOLDEN, sites=_spread(names, n))))))
  variants.append(("tap all sites (capture only)", jax.jit(peat.tap(
      task.step_fn, peat.Substitution(None, sites=tuple(names))))))
  compile_s = [_compile(fn, state, batch) for _, fn in variants]
  medians = _time_interleaved([fn for _, fn in variants], state, batch, _REPEAT.value)
  base = medians[0]
  rows = [(label, t, c) for (label, _), t, c in zip(variants, medians, compile_s)]
  width = max(len(r[0]) for r in rows)
  print(f"{'variant'.ljust(width)}  {'ms/step':>9}  {'ratio':>6}  {'compile s':>9}")
  for label, t, c in rows:
    print(f"{label.ljust(width)}  {t * 1e3:9.2f}  {t / base:6.2f}  {c:9.1f}")
  print(f"median of {_REPEAT.value} interleaved calls per variant; compilation excluded")


if __name__ == "__main__":
  app.run(main)
