"""Benchmark: cost of running a torch op at a JAX site through the bridge.

Run: python benchmarks/bench_bridge.py [--sizes 16,64,256] [--repeats 200]

For each op and size, in one process and interleaved (machine load affects
all alike), the median wall time per call of:

* ``jnp``: the same op in JAX (jitted), the golden baseline;
* ``torch``: the torch op called directly on torch tensors (no JAX);
* ``bridge``: ``peat_jax.bridges.torch_op(op)`` jitted: one
  ``buffer_callback``, inputs read in place through DLPack, result copied
  into XLA's output buffer (``matmul out=`` writes it in place);
* ``pure_cb``: the same torch op through ``jax.pure_callback`` (what a
  straightforward bridge does: jaxlib copies the inputs into new NumPy
  arrays, the result is copied back).

It prints the bridge overhead per call (bridge - torch, in microseconds) and
the ratios bridge / jnp and pure_cb / bridge. Speed is reported, never
asserted.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from peat_jax import bridges


def _median_us(fn, repeats: int) -> float:
  fn()  # compile and warm up
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1e6 * statistics.median(times)


def _cases(n: int):
  """(name, jnp fn, torch fn(*tensors), torch fn with out=, input shapes)."""
  sm = lambda t: torch.softmax(t, dim=-1)
  return [
      (f"matmul {n}x{n}", jnp.matmul, torch.matmul, True, [(n, n), (n, n)]),
      (f"softmax {n}x{4 * n}", lambda x: jax.nn.softmax(x, axis=-1), sm,
       False, [(n, 4 * n)]),
  ]


def run(sizes, repeats: int) -> list[dict]:
  """Times every case; returns one dict per (op, size)."""
  rows = []
  for n in sizes:
    for name, jfn, tfn, out_arg, shapes in _cases(n):
      rng = np.random.default_rng(n)
      xs = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]
      ts = [torch.from_numpy(np.asarray(x).copy()) for x in xs]
      gold = jax.jit(jfn)
      bridge = jax.jit(bridges.torch_op(tfn, out_arg=out_arg))
      out = jax.eval_shape(jfn, *xs)

      def host(*arrays, tfn=tfn):
        return tfn(*[torch.from_dlpack(a) for a in arrays]).numpy()

      pure = jax.jit(lambda *a, host=host, out=out: jax.pure_callback(
          host, out, *a))
      t = {}
      # Interleave the four timings, 3 rounds, keep each one's best median.
      for _ in range(3):
        for key, fn in (("jnp", lambda: gold(*xs).block_until_ready()),
                        ("torch", lambda: tfn(*ts)),
                        ("bridge", lambda: bridge(*xs).block_until_ready()),
                        ("pure_cb", lambda: pure(*xs).block_until_ready())):
          t[key] = min(t.get(key, np.inf), _median_us(fn, repeats))
      np.testing.assert_allclose(np.asarray(bridge(*xs)),
                                 np.asarray(gold(*xs)), rtol=1e-4, atol=1e-4)
      rows.append(dict(op=name, **{f"{k}_us": v for k, v in t.items()},
                       overhead_us=t["bridge"] - t["torch"],
                       bridge_vs_jnp=t["bridge"] / t["jnp"],
                       pure_vs_bridge=t["pure_cb"] / t["bridge"]))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="16,64,256")
  parser.add_argument("--repeats", type=int, default=200)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  print(f"jax {jax.__version__} ({jax.default_backend()}), torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), float32, "
        "median us per call")
  print(f"{'op':<18} {'jnp':>9} {'torch':>9} {'bridge':>9} {'pure_cb':>9} "
        f"{'overhead':>9} {'bridge/jnp':>10} {'pure/bridge':>11}")
  for r in run(sizes, args.repeats):
    print(f"{r['op']:<18} {r['jnp_us']:>9.1f} {r['torch_us']:>9.1f} "
          f"{r['bridge_us']:>9.1f} {r['pure_cb_us']:>9.1f} "
          f"{r['overhead_us']:>9.1f} {r['bridge_vs_jnp']:>10.2f} "
          f"{r['pure_vs_bridge']:>11.2f}")


if __name__ == "__main__":
  main()
