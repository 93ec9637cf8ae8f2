"""Benchmark: the default native CPU matmul KUT vs jnp.matmul (XLA/Eigen).

Run: python benchmarks/bench_native_matmul.py [--sizes 64,128,256,512]
Prints, per square size n, the median time of each (jitted, inputs on
device, result blocked on) and the ratio native / jnp. The baseline runs in
the same process, interleaved, so machine load affects both alike. Speed is
reported, never asserted.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax.kernels import native


def _median_seconds(fn, *args, repeats: int) -> float:
  fn(*args).block_until_ready()  # compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def run(sizes, variant: str = "default", repeats: int = 0) -> list[dict]:
  """Times native.matmul(variant) and jnp.matmul at each size.

  Args:
    sizes: square sizes n (n x n times n x n, float32).
    variant: the native variant to time.
    repeats: timed calls per size (0: scaled to the size).

  Returns:
    One dict per size: n, native_ms, jnp_ms, ratio, gflops_native, gflops_jnp.
  """
  rows = []
  kut = jax.jit(lambda a, b: native.matmul(a, b, variant=variant))
  gold = jax.jit(jnp.matmul)
  for n in sizes:
    rng = np.random.default_rng(n)
    a = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    b = jnp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    reps = repeats or max(3, int(2e9 / (2 * n**3)))
    reps = min(reps, 200)
    t_k = _median_seconds(kut, a, b, repeats=reps)
    t_g = _median_seconds(gold, a, b, repeats=reps)
    flops = 2 * n**3
    rows.append(dict(n=n, native_ms=1e3 * t_k, jnp_ms=1e3 * t_g,
                     ratio=t_k / t_g, gflops_native=flops / t_k / 1e9,
                     gflops_jnp=flops / t_g / 1e9))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="64,128,256,512")
  parser.add_argument("--variant", default="default")
  parser.add_argument("--repeats", type=int, default=0)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"{jax.device_count()} device(s); native variant {args.variant!r}")
  print(f"{'n':>6} {'native ms':>10} {'jnp ms':>9} {'ratio':>7} "
        f"{'native GF/s':>12} {'jnp GF/s':>9}")
  for r in run(sizes, args.variant, args.repeats):
    print(f"{r['n']:>6} {r['native_ms']:>10.3f} {r['jnp_ms']:>9.3f} "
          f"{r['ratio']:>7.2f} {r['gflops_native']:>12.2f} "
          f"{r['gflops_jnp']:>9.2f}")


if __name__ == "__main__":
  main()
