"""Benchmark: the default native CPU matmul KUT vs jnp.matmul (XLA/Eigen).

Run: python benchmarks/bench_native_matmul.py [--sizes 64,128,256,512]
    [--batched 64x64x32x64,64x64x64x32]
Prints, per square size n (and per batched shape B x M x K x N: B products
of M x K times K x N, the attention products of the small GPT by default),
the median time of each (jitted, inputs on device, result blocked on) and
the ratio native / jnp. The baseline runs in
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


def run(shapes, variant: str = "default", repeats: int = 0) -> list[dict]:
  """Times native.matmul(variant) and jnp.matmul on each shape.

  Args:
    shapes: (batch, m, k, n) tuples (batch 1: one m x k times k x n
      product, no batch axis), float32.
    variant: the native variant to time.
    repeats: timed calls per shape (0: scaled to the work).

  Returns:
    One dict per shape: shape, native_ms, jnp_ms, ratio, gflops_native,
    gflops_jnp.
  """
  rows = []
  kut = jax.jit(lambda a, b: native.matmul(a, b, variant=variant))
  gold = jax.jit(jnp.matmul)
  for batch, m, k, n in shapes:
    rng = np.random.default_rng((batch, m, k, n))
    lead = (batch,) if batch > 1 else ()
    a = jnp.asarray(rng.standard_normal(lead + (m, k), dtype=np.float32))
    b = jnp.asarray(rng.standard_normal(lead + (k, n), dtype=np.float32))
    flops = 2 * batch * m * k * n
    reps = repeats or max(3, int(2e9 / flops))
    reps = min(reps, 200)
    t_k = _median_seconds(kut, a, b, repeats=reps)
    t_g = _median_seconds(gold, a, b, repeats=reps)
    rows.append(dict(shape=(batch, m, k, n), native_ms=1e3 * t_k,
                     jnp_ms=1e3 * t_g, ratio=t_k / t_g,
                     gflops_native=flops / t_k / 1e9,
                     gflops_jnp=flops / t_g / 1e9))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="64,128,256,512")
  parser.add_argument("--batched", default="64x64x32x64,64x64x64x32",
                      help="BxMxKxN shapes, comma-separated ('' for none)")
  parser.add_argument("--variant", default="default")
  parser.add_argument("--repeats", type=int, default=0)
  args = parser.parse_args()
  shapes = [(1, int(s), int(s), int(s)) for s in args.sizes.split(",") if s]
  shapes += [tuple(int(d) for d in s.split("x"))
             for s in args.batched.split(",") if s]
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"{jax.device_count()} device(s); native variant {args.variant!r}")
  print(f"{'BxMxKxN':>16} {'native ms':>10} {'jnp ms':>9} {'ratio':>7} "
        f"{'native GF/s':>12} {'jnp GF/s':>9}")
  for r in run(shapes, args.variant, args.repeats):
    print(f"{'x'.join(map(str, r['shape'])):>16} {r['native_ms']:>10.3f} "
          f"{r['jnp_ms']:>9.3f} {r['ratio']:>7.2f} "
          f"{r['gflops_native']:>12.2f} {r['gflops_jnp']:>9.2f}")


if __name__ == "__main__":
  main()
