"""Benchmark of the Analyzer: peat_jax vs NumPy vs the memory-copy ceiling.

All three are measured in the same run, on the same 4096 x 4096 float32
pair (a KUT with relative noise ~1e-6 against its golden), best of
`--repeats` timings (the NumPy implementation: best of 2):

* ceiling: a large array copy (NumPy `copyto` into a preallocated buffer and
  a jitted JAX copy; the faster one), counted as bytes read + written;
* peat_jax: `peat_jax.analyzer.signature._signature.analyze(t, g)` (all fields), counted as the
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

On a GPU the ceiling is the device copy alone (a jitted copy of one array
of the same size, bytes read + written): NumPy's copy runs in host memory.

Run: .venv/bin/python benchmarks/bench_analyzer.py [--n 4096] [--repeats 20]

Flags for other machines (scripts/gpu_check.sh uses them): ``--sizes
4096,8192`` measures the single-pair part at each size, ``--parts`` picks
the parts (``core``: ceiling, peat_jax, the native pass, the one-reduction
context; ``wide``; ``numpy``; ``batched``; ``playback``; default all), and
``--json PATH`` writes the figures as JSON as well.
"""

from __future__ import annotations

import argparse
import json
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


PARTS = ("core", "wide", "numpy", "batched", "playback")


def _pair(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
  g = rng.standard_normal((n, n), dtype=np.float32)
  t = (g * (1 + 1e-6 * rng.standard_normal((n, n), dtype=np.float32))
       ).astype(np.float32)
  return t, g


def single_pair(rng, n: int, repeats: int, parts: set) -> dict:
  """The n x n part: copy ceiling, peat_jax, and what ``parts`` asks for.

  Returns:
    The figures: seconds (best) and GB/s of each measured form, and
    ``analyze_to_ceiling`` (peat_jax's GB/s over the ceiling's).
  """
  t, g = _pair(rng, n)
  nbytes = g.nbytes
  gj, tj = jnp.asarray(g), jnp.asarray(t)
  jax.block_until_ready((gj, tj))
  on_cpu = jax.default_backend() == "cpu"
  out = {"n": n, "input_bytes": 2 * nbytes, "repeats": repeats,
         "backend": jax.default_backend(),
         "device": str(jax.devices()[0].device_kind)}

  # Best times of the same number of repeats for the ceiling and for
  # peat_jax (the copy's best time is as noisy on a shared machine).
  jcopy = jax.jit(lambda x: x + 0.0)
  t_jax_copy = _best(lambda: jax.block_until_ready(jcopy(gj)), repeats)
  out["device_copy_s"] = t_jax_copy
  out["device_copy_gbs"] = 2 * nbytes / t_jax_copy / 1e9
  ceiling = 2 * nbytes / t_jax_copy
  if on_cpu:  # host memory is the device's: the faster copy is the ceiling
    dst = np.empty_like(g)
    t_np_copy = _best(lambda: np.copyto(dst, g), repeats)
    out["numpy_copy_gbs"] = 2 * nbytes / t_np_copy / 1e9
    ceiling = 2 * nbytes / min(t_np_copy, t_jax_copy)
  out["ceiling_gbs"] = ceiling / 1e9

  peat_times = _times(lambda: jax.block_until_ready(peat.analyze(tj, gj)),
                      repeats)
  t_peat = min(peat_times)
  gbs_peat = 2 * nbytes / t_peat
  out.update(analyze_s=t_peat, analyze_median_s=statistics.median(peat_times),
             analyze_gbs=gbs_peat / 1e9,
             analyze_to_ceiling=gbs_peat / ceiling)
  one = jax.jit(lambda a, b: jnp.sum(jnp.abs(a - b)))
  t_one = _best(lambda: jax.block_until_ready(one(tj, gj)), repeats)
  cnt = jax.jit(lambda a, b: jnp.sum(a == b, dtype=jnp.int32))
  t_cnt = _best(lambda: jax.block_until_ready(cnt(tj, gj)), repeats)
  out["one_reduction_gbs"] = 2 * nbytes / t_one / 1e9
  out["count_equal_gbs"] = 2 * nbytes / t_cnt / 1e9

  print(f"Analyzer benchmark: {n}x{n} float32 pair ({2 * nbytes / 1e6:.0f} "
        f"MB of input), best of {repeats}, {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s) ({out['device']})")
  copies = f"jax copy {out['device_copy_gbs']:.2f}"
  if on_cpu:
    copies = f"numpy copyto {out['numpy_copy_gbs']:.2f}, " + copies
  else:
    copies = "device copy; " + copies
  print(f"  copy ceiling   : {ceiling / 1e9:7.2f} GB/s  ({copies}; read + "
        "write)")
  print(f"  peat_jax       : {gbs_peat / 1e9:7.2f} GB/s  ({t_peat * 1e3:8.1f}"
        f" ms; median {out['analyze_median_s'] * 1e3:.1f} ms)")
  if on_cpu:
    npass = jax.jit(lambda a, b: peat.kernels.signature_pass(a, b, None, None))
    t_pass = _best(lambda: jax.block_until_ready(npass(tj, gj)), repeats)
    out["native_pass_gbs"] = 2 * nbytes / t_pass / 1e9
    print(f"    native pass  : {out['native_pass_gbs']:7.2f} GB/s  "
          f"({t_pass * 1e3:8.1f} ms)")
  if "wide" in parts:
    wide_g = jnp.asarray(g * np.float32(1000.0))
    wide_t = jnp.asarray(t * np.float32(1000.0))
    t_wide = _best(lambda: jax.block_until_ready(peat.analyze(wide_t,
                                                              wide_g)),
                   max(1, repeats // 4))
    out["wide_gbs"] = 2 * nbytes / t_wide / 1e9
    print(f"    |x| >= 448   : {out['wide_gbs']:7.2f} GB/s  "
          f"({t_wide * 1e3:8.1f} ms; general path)")
  if "numpy" in parts:
    t_numpy = _best(lambda: numpy_signature(t, g), 2)
    out["numpy_gbs"] = 2 * nbytes / t_numpy / 1e9
    out["analyze_to_numpy"] = t_numpy / t_peat
    print(f"  numpy          : {out['numpy_gbs']:7.2f} GB/s  "
          f"({t_numpy * 1e3:8.1f} ms)")
  print(f"  context: one XLA reduction sum|t-g| "
        f"{out['one_reduction_gbs']:.2f} GB/s, count(t==g) "
        f"{out['count_equal_gbs']:.2f} GB/s")
  if "numpy" in parts:
    print(f"  peat_jax / numpy   : {out['analyze_to_numpy']:6.2f}x   "
          "(goal >= 5x)")
  print(f"  peat_jax / ceiling : {100 * gbs_peat / ceiling:6.1f}%   "
        "(goal >= 30%)")
  return out


def batched(rng, sites: int, shape: tuple, repeats: int) -> dict:
  """The batched form on ``sites`` small records, and one call per record."""
  gs = rng.standard_normal((sites,) + shape, dtype=np.float32)
  ts = (gs * (1 + 1e-6 * rng.standard_normal(gs.shape, dtype=np.float32))
        ).astype(np.float32)
  gsj, tsj = jnp.asarray(gs), jnp.asarray(ts)
  t_batch = _best(lambda: jax.block_until_ready(peat.analyze_batch(tsj, gsj)),
                  repeats)
  few = min(sites, 100)
  t_loop = _best(lambda: [jax.block_until_ready(peat.analyze(tsj[i], gsj[i]))
                          for i in range(few)], 1) * sites / few
  print(f"Batched form: {sites} records of {shape} float32")
  print(f"  analyze_batch  : {sites / t_batch:10.0f} records/s "
        f"({t_batch * 1e3:.1f} ms)")
  print(f"  analyze, 1 call per record: {sites / t_loop:10.0f} "
        f"records/s (measured on {few})")
  return {"records": sites, "shape": list(shape),
          "batch_records_per_s": sites / t_batch,
          "loop_records_per_s": sites / t_loop}


def playback_form(rng, repeats: int, ceiling: float | None) -> dict:
  """The GPT scenario's 13 forward dot_general outputs, as playback has them."""
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
                 repeats)
  elems = sum(int(np.prod(x)) for x in sizes)
  gbs_many = 16 * elems / t_many
  print(f"Playback form: {len(sizes)} records, {elems / 1e6:.2f} M elements "
        f"(GPT checkpoint), analyze_split_many(to_host=True)")
  of = (f", {100 * gbs_many / ceiling:.1f}% of the copy ceiling" if ceiling
        else "")
  print(f"  {t_many * 1e3:.1f} ms, {gbs_many / 1e9:.2f} GB/s of input "
        f"(t, g, ref hi, lo){of}")
  return {"records": len(sizes), "elements": elems, "seconds": t_many,
          "gbs": gbs_many / 1e9}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=4096)
  p.add_argument("--sizes", type=str, default=None,
                 help="comma-separated n of the single-pair part (default "
                 "--n)")
  p.add_argument("--parts", type=str, default=",".join(PARTS),
                 help=f"comma-separated subset of {','.join(PARTS)}")
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--sites", type=int, default=1000)
  p.add_argument("--site_shape", type=str, default="32,64")
  p.add_argument("--json", type=str, default=None,
                 help="also write the figures to this JSON file")
  args = p.parse_args()
  parts = set(args.parts.split(",")) - {""}
  if parts - set(PARTS):
    p.error(f"unknown --parts {sorted(parts - set(PARTS))}; expected a "
            f"subset of {','.join(PARTS)}")
  sizes = [int(s) for s in (args.sizes or str(args.n)).split(",")]

  load0 = os.getloadavg()[0]
  rng = np.random.default_rng(0)
  result = {"jax": jax.__version__, "backend": jax.default_backend(),
            "sizes": []}
  if parts & {"core", "wide", "numpy"}:
    for n in sizes:
      result["sizes"].append(single_pair(rng, n, args.repeats, parts))
  if "batched" in parts:
    shape = tuple(int(s) for s in args.site_shape.split(","))
    result["batched"] = batched(rng, args.sites, shape, args.repeats)
  if "playback" in parts:
    ceiling = (result["sizes"][0]["ceiling_gbs"] * 1e9 if result["sizes"]
               else None)
    result["playback"] = playback_form(rng, args.repeats, ceiling)
  result["load_average"] = [load0, os.getloadavg()[0]]
  print(f"load average: {load0:.2f} before, {os.getloadavg()[0]:.2f} after "
        f"({os.cpu_count()} cores)")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
