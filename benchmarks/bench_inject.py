"""Campaign throughput: N injections in one vmapped call vs a Python loop.

The peers (PyTorchFI, TensorFI2, GoldenEye, ...) run one injection per Python
loop iteration. This measures, in the same run and on the same data, N
injections as one jitted ``vmap`` over keys (``peat.campaign``) against a
Python loop of N calls of a single jitted injection, each followed by the
same summary statistic and a ``block_until_ready`` (what a per-iteration
loop must do to read the result). Compile time is excluded from both and
reported apart.

Usage:
  .venv/bin/python benchmarks/bench_inject.py [--n 1024] [--sizes 16 128]
"""

import argparse
import functools
import time

import jax
from jax import lax
import jax.numpy as jnp
import peat_jax as peat

MODELS = (
    ("bitflip", {"count": 1}),
    ("bitflip", {"count": 16, "bits_per_element": 2}),
    ("stuck_at", {"bit": 22, "share": 0.01}),
    ("precision:bf16", {}),
    ("random_value", {"count": 4}),
    ("zero", {"mode": "tiles", "count": 1}),
    ("lane", {"stride": 32, "lane": 7, "effect": "bitflip"}),
)


def _timed(fn, repeat=3):
  best = float("inf")
  for _ in range(repeat):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t)
  return best


def bench_tensor(name, params, x, n, stat):
  t0 = time.perf_counter()
  c = peat.campaign(name, jax.random.key(0), x, n=n, summarize=stat, **params)
  jax.block_until_ready(c.outputs)
  compile_s = time.perf_counter() - t0
  keys = c.keys
  t_vmap = _timed(lambda: peat.campaign(name, jax.random.key(0), x, n=n,
                                       summarize=stat, **params).outputs)
  single = jax.jit(lambda k, x: stat(peat.inject(name, k, x, **params)))
  jax.block_until_ready(single(keys[0], x))
  key_list = [keys[i] for i in range(n)]

  def loop():
    out = []
    for k in key_list:
      out.append(single(k, x).block_until_ready())
    return out

  t_loop = _timed(loop, repeat=1)
  return compile_s, t_vmap, t_loop


def bench_kernel(n, m):
  a = jax.random.normal(jax.random.key(1), (m, m))
  b = jax.random.normal(jax.random.key(2), (m, m))
  matmul = functools.partial(lax.dot_general,
                             dimension_numbers=(((1,), (0,)), ((), ())))
  stat = lambda y: jnp.max(jnp.abs(y))
  run = lambda: peat.kernel_campaign("bitflip", jax.random.key(0), matmul,
                                    (a, b), n=n, summarize=stat).outputs
  t0 = time.perf_counter()
  jax.block_until_ready(run())
  compile_s = time.perf_counter() - t0
  t_vmap = _timed(run)
  kut = peat.injecting_kernel("bitflip", matmul)
  single = jax.jit(lambda k, a, b: stat(kut(a, b, inject_key=k)))
  keys = jax.random.split(jax.random.key(0), n)
  jax.block_until_ready(single(keys[0], a, b))
  key_list = [keys[i] for i in range(n)]

  def loop():
    return [single(k, a, b).block_until_ready() for k in key_list]

  t_loop = _timed(loop, repeat=1)
  return compile_s, t_vmap, t_loop


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=1024, help="injections")
  ap.add_argument("--sizes", type=int, nargs="+", default=(16, 128),
                  help="tensors are size x size")
  ap.add_argument("--kernel-n", type=int, default=256,
                  help="injections through a matmul KUT")
  ap.add_argument("--kernel-size", type=int, default=64, help="matmul m=n=k")
  args = ap.parse_args()
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, "
        f"{jax.local_device_count()} device(s); float32; summary per "
        f"injection: max |injected - golden|; best of 3 (loop: 1 run)")
  print(f"{'model':46s} {'compile s':>9s} {'vmap ms':>9s} {'loop ms':>9s} "
        f"{'inj/s vmap':>11s} {'inj/s loop':>11s} {'ratio':>7s}")

  def show(label, n, res):
    c, tv, tl = res
    print(f"{label[:46]:46s} {c:9.2f} {tv * 1e3:9.1f} {tl * 1e3:9.1f} "
          f"{n / tv:11.0f} {n / tl:11.0f} {tl / tv:7.1f}x", flush=True)

  for size in args.sizes:
    x = jax.random.normal(jax.random.key(3), (size, size))
    stat = lambda y, x=x: jnp.max(jnp.abs(y - x))
    for name, p in MODELS:
      show(f"{size}x{size} N={args.n} {name} {p}", args.n,
           bench_tensor(name, p, x, args.n, stat))
  show(f"matmul KUT {args.kernel_size}^3 N={args.kernel_n} bitflip",
       args.kernel_n, bench_kernel(args.kernel_n, args.kernel_size))


if __name__ == "__main__":
  main()
