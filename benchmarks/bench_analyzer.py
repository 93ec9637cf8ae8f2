"""Benchmark of the Analyzer: peat_jax vs NumPy vs the memory-copy ceiling.

All three are measured in the same run, on the same 4096 x 4096 float32
pair (a KUT with relative noise ~1e-6 against its golden), best of
`--repeats` timings (the NumPy implementation: best of 2):

* ceiling: a large array copy (NumPy `copyto` into a preallocated buffer and
  a jitted JAX copy; the faster one), counted as bytes read + written;
* peat_jax: `peat_jax.analyzer._signature.analyze(t, g)` (all fields), counted as the
  bytes of the two inputs; on CPU its statistics pass is the native kernel
  (csrc/signature.cc). Also shown: that pass alone, and `analyze` on a pair
  whose values are beyond the native fast path (|x| >= 448: every block
  takes the general path);
* NumPy: a straightforward vectorized NumPy implementation of the same
  statistics (`numpy_signature` below), counted the same way;

then the batched form on 1,000 small records (records per second), and the
same records analyzed one call at a time for comparison; then the playback
form: `analyze_split_many(..., to_host=True)` of the 13 records one GPT
checkpoint's playback analyzes (the forward matmul outputs of
`models.get_task("gpt")`, 3.4 M elements, test, golden and a float32
hi/lo reference: 16 bytes per element), in GB/s and against the copy
ceiling above. The load average
is printed before and after: the ratios are only meaningful on a quiet
machine (the copy is memory-bound, the analyzer compute-bound).

Run: .venv/bin/python benchmarks/bench_analyzer.py [--n 4096] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import peat_jax as peat


def _times(fn, repeats: int) -> list[float]:
  fn()  # warm-up (compilation, page faults)
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return times


def _best(fn, repeats: int) -> float:
  return min(_times(fn, repeats))


def numpy_signature(t: np.ndarray, g: np.ndarray) -> dict:
  """The Signature's statistics, written plainly in vectorized NumPy."""
  out = {}
  ut, ug = t.view(np.uint32), g.view(np.uint32)
  fin = np.isfinite(t) & np.isfinite(g)
  d = np.where(fin, t - g, 0).astype(np.float32)
  ad = np.abs(d)
  ag = np.abs(g)
  rel = np.where(fin, ad / np.maximum(ag, np.finfo(np.float32).tiny), 0)
  nfp = max(int(fin.sum()), 1)
  out["counts"] = [int((ut == ug).sum()), int((t == g).sum()),
                   int(np.isnan(t).sum()), int(np.isnan(g).sum()),
                   int(np.isinf(t).sum()), int(np.isinf(g).sum()),
                   int((np.isfinite(g) & ~np.isfinite(t)).sum()),
                   int(((t == 0) & (g != 0)).sum()),
                   int(((d > 0)).sum()), int((d < 0).sum()),
                   int((np.abs(t) > ag).sum()), int((np.abs(t) < ag).sum()),
                   int((np.signbit(t) != np.signbit(g)).sum())]
  out["abs"] = (ad.max(), ad.sum(dtype=np.float64) / nfp,
                np.sqrt((ad.astype(np.float64)**2).sum() / nfp))
  out["rel"] = (rel.max(), rel.sum(dtype=np.float64) / nfp,
                np.sqrt((rel.astype(np.float64)**2).sum() / nfp))
  out["pct"] = np.percentile(ad, peat.analyzer.PERCENTILES), np.percentile(
      rel, peat.analyzer.PERCENTILES)
  out["bias"] = d.sum(dtype=np.float64) / nfp
  # ULP distance (log2 buckets) and per-bit XOR / up / down counts.
  def ordered(u):
    i = u.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)
  ulp = np.where(fin, np.abs(ordered(ut) - ordered(ug)), 0)
  out["ulp_hist"] = np.bincount(
      np.where(ulp == 0, 0, np.floor(np.log2(np.maximum(ulp, 1))) + 1)
      .astype(np.int64).ravel(), minlength=33)
  def bitcounts(w):
    b = np.unpackbits(w.reshape(-1, 1).view(np.uint8), axis=1,
                      bitorder="little")
    return b.sum(axis=0, dtype=np.int64)
  out["up"] = bitcounts(ut & ~ug)
  out["down"] = bitcounts(ug & ~ut)
  # Representability (bf16 via the low 16 bits, fp16 via a round trip).
  out["repr"] = [((ut & 0xFFFF) == 0).mean(),
                 (t.astype(np.float16).astype(np.float32) == t).mean()]
  # Spatial structure.
  differ = ut != ug
  out["rows"] = differ.sum(axis=1), ad.max(axis=1), ad.mean(axis=1)
  out["cols"] = differ.sum(axis=0), ad.mean(axis=0)
  r, c = t.shape
  out["tiles"] = differ[:r // 8 * 8, :c // 8 * 8].reshape(
      r // 8, 8, c // 8, 8).sum(axis=(1, 3))
  out["lanes"] = out["cols"][0].reshape(-1, 32).sum(axis=0)
  # Scale and error vs |g|.
  ok = fin & (ag > np.finfo(np.float32).tiny) & (t != 0)
  ratio = t[ok] / g[ok]
  out["scale"] = ratio.min(), ratio.max(), np.mean(
      np.log2(np.abs(t[ok])) - np.log2(ag[ok]))
  lok = fin & (d != 0) & (g != 0)
  x, y = np.log2(ag[lok]), np.log2(ad[lok])
  out["slope"] = np.polyfit(x, y, 1)[0] if x.size > 1 else 0.0
  # Shifts on 64 sampled rows; transpose; permutation (sorted multisets).
  rows = np.linspace(0, r - 1, min(r, 64)).round().astype(int)
  out["shift_col"] = [(ut[rows, max(s, 0):c + min(s, 0)] ==
                       ug[rows, max(-s, 0):c - max(s, 0)]).mean()
                      for s in range(-8, 9)]
  out["shift_row"] = [(ut[rows[(rows - s >= 0) & (rows - s < r)]] ==
                       ug[rows[(rows - s >= 0) & (rows - s < r)] - s]).mean()
                      for s in range(-8, 9)]
  out["transpose"] = (ut[rows] == ug[:, rows].T).mean()
  out["perm"] = np.array_equal(np.sort(ut, axis=None), np.sort(ug, axis=None))
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=4096)
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--sites", type=int, default=1000)
  p.add_argument("--site_shape", type=str, default="32,64")
  args = p.parse_args()

  load0 = os.getloadavg()[0]
  n = args.n
  rng = np.random.default_rng(0)
  g = rng.standard_normal((n, n), dtype=np.float32)
  t = (g * (1 + 1e-6 * rng.standard_normal((n, n), dtype=np.float32))
       ).astype(np.float32)
  nbytes = g.nbytes
  gj, tj = jnp.asarray(g), jnp.asarray(t)
  jax.block_until_ready((gj, tj))

  # Best times of the same number of repeats for the ceiling and for
  # peat_jax (the copy's best time is as noisy on a shared machine).
  dst = np.empty_like(g)
  t_np_copy = _best(lambda: np.copyto(dst, g), args.repeats)
  jcopy = jax.jit(lambda x: x + 0.0)
  t_jax_copy = _best(lambda: jax.block_until_ready(jcopy(gj)), args.repeats)
  ceiling = 2 * nbytes / min(t_np_copy, t_jax_copy)

  one = jax.jit(lambda a, b: jnp.sum(jnp.abs(a - b)))
  t_one = _best(lambda: jax.block_until_ready(one(tj, gj)), args.repeats)
  cnt = jax.jit(lambda a, b: jnp.sum(a == b, dtype=jnp.int32))
  t_cnt = _best(lambda: jax.block_until_ready(cnt(tj, gj)), args.repeats)
  peat_times = _times(lambda: jax.block_until_ready(peat.analyze(tj, gj)),
                      args.repeats)
  t_peat = min(peat_times)
  gbs_peat = 2 * nbytes / t_peat
  native = jax.default_backend() == "cpu"
  if native:
    npass = jax.jit(lambda a, b: peat.kernels.signature_pass(a, b, None, None))
    t_pass = _best(lambda: jax.block_until_ready(npass(tj, gj)),
                   args.repeats)
  wide_g = jnp.asarray(g * np.float32(1000.0))
  wide_t = jnp.asarray(t * np.float32(1000.0))
  t_wide = _best(lambda: jax.block_until_ready(peat.analyze(wide_t, wide_g)),
                 max(1, args.repeats // 4))
  t_numpy = _best(lambda: numpy_signature(t, g), 2)
  gbs_numpy = 2 * nbytes / t_numpy

  print(f"Analyzer benchmark: {n}x{n} float32 pair ({2 * nbytes / 1e6:.0f} "
        f"MB of input), best of {args.repeats}, {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s)")
  print(f"  copy ceiling   : {ceiling / 1e9:7.2f} GB/s  (numpy copyto "
        f"{2 * nbytes / t_np_copy / 1e9:.2f}, jax copy "
        f"{2 * nbytes / t_jax_copy / 1e9:.2f}; read + write)")
  print(f"  peat_jax       : {gbs_peat / 1e9:7.2f} GB/s  ({t_peat * 1e3:8.1f}"
        f" ms; median {statistics.median(peat_times) * 1e3:.1f} ms)")
  if native:
    print(f"    native pass  : {2 * nbytes / t_pass / 1e9:7.2f} GB/s  "
          f"({t_pass * 1e3:8.1f} ms)")
  print(f"    |x| >= 448   : {2 * nbytes / t_wide / 1e9:7.2f} GB/s  "
        f"({t_wide * 1e3:8.1f} ms; general path)")
  print(f"  numpy          : {gbs_numpy / 1e9:7.2f} GB/s  ({t_numpy * 1e3:8.1f}"
        " ms)")
  print(f"  context: one XLA reduction sum|t-g| "
        f"{2 * nbytes / t_one / 1e9:.2f} GB/s, count(t==g) "
        f"{2 * nbytes / t_cnt / 1e9:.2f} GB/s")
  print(f"  peat_jax / numpy   : {t_numpy / t_peat:6.2f}x   (goal >= 5x)")
  print(f"  peat_jax / ceiling : {100 * gbs_peat / ceiling:6.1f}%   "
        "(goal >= 30%)")

  shape = tuple(int(s) for s in args.site_shape.split(","))
  gs = rng.standard_normal((args.sites,) + shape, dtype=np.float32)
  ts = (gs * (1 + 1e-6 * rng.standard_normal(gs.shape, dtype=np.float32))
        ).astype(np.float32)
  gsj, tsj = jnp.asarray(gs), jnp.asarray(ts)
  t_batch = _best(lambda: jax.block_until_ready(peat.analyze_batch(tsj, gsj)),
                  args.repeats)
  few = min(args.sites, 100)
  t_loop = _best(lambda: [jax.block_until_ready(peat.analyze(tsj[i], gsj[i]))
                          for i in range(few)], 1) * args.sites / few
  print(f"Batched form: {args.sites} records of {shape} float32")
  print(f"  analyze_batch  : {args.sites / t_batch:10.0f} records/s "
        f"({t_batch * 1e3:.1f} ms)")
  print(f"  analyze, 1 call per record: {args.sites / t_loop:10.0f} "
        f"records/s (measured on {few})")
  # Playback form: the GPT scenario's 13 forward dot_general outputs.
  sizes = [(16, 64, 384), (16, 4, 64, 64), (16, 4, 32, 64), (16, 64, 128),
           (16, 64, 512), (16, 64, 128)] * 2 + [(16, 64, 256)]
  recs = []
  for shp in sizes:
    gr = rng.standard_normal(shp, dtype=np.float32)
    tr = (gr * (1 + 1e-3 * rng.standard_normal(shp, dtype=np.float32))
          ).astype(np.float32)
    lo = (gr * 1e-9).astype(np.float32)
    recs.append([jnp.asarray(x) for x in (tr, gr, gr, lo)])
  cols = [list(c) for c in zip(*recs)]
  t_many = _best(lambda: peat.analyzer.analyze_split_many(*cols, to_host=True),
                 args.repeats)
  elems = sum(int(np.prod(x)) for x in sizes)
  gbs_many = 16 * elems / t_many
  print(f"Playback form: {len(sizes)} records, {elems / 1e6:.2f} M elements "
        f"(GPT checkpoint), analyze_split_many(to_host=True)")
  print(f"  {t_many * 1e3:.1f} ms, {gbs_many / 1e9:.2f} GB/s of input "
        f"(t, g, ref hi, lo), {100 * gbs_many / ceiling:.1f}% of the copy "
        "ceiling")
  print(f"load average: {load0:.2f} before, {os.getloadavg()[0]:.2f} after "
        f"({os.cpu_count()} cores)")


if __name__ == "__main__":
  main()
