"""Compilation per new record shape: analyze + detect vs triage.

Usage::

  python benchmarks/bench_compile.py [--shapes=96] [--mode=both]

Draws ``--shapes`` distinct 2-D record shapes (seeded; rows 16-300,
columns 16-700) and on each a real float32 or bf16 matmul's golden output
(XLA's dot) with its float64 reference, and one of two KUT outputs: a
correct kernel of another summation order (K split in four chunks) or
that kernel with three bits flipped (``peat.inject("bitflip")``). Every
case is a shape the process has not seen. On CPU the Analyzer runs each
record padded to its size bucket (the next power of two of its element
count, at least 4,096; docs/signature.md), so a shape compiles only when
its bucket and dtype are new. Each mode runs in its own process (no
compilation shared between them) and times, per case, the first call
(compilation included, where the call compiled) and a second, warm call:

* ``full``: ``peat.analyze(t, g, r)`` (statistics pass, finalization and
  the noise-aware decomposition in one executable per shape) and
  ``peat.detect``;
* ``triage``: playback's path: ``peat.analyzer.screen`` and
  ``peat.detector.triage``, and for a record the screen flags the
  decomposition (``peat.analyzer.decomposition``) and ``peat.detect``.

Prints, per mode and KUT kind, the mean first-call and warm seconds and
their difference (the compilation per new shape), and the whole set's wall
time. (Each shape's signature maps ~600 compiled kernels: the Analyzer's
entry points release compiled code once half of vm.max_map_count is used,
else ~100 shapes in one process abort it.)
"""

import json
import subprocess
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

_SHAPES = flags.DEFINE_integer("shapes", 24, "Distinct record shapes.")
_MODE = flags.DEFINE_enum("mode", "both", ["both", "full", "triage"],
                          "Which path (both: each in its own process).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the shapes and values.")


def _cases(n: int, seed: int):
  rng = np.random.default_rng(seed)
  seen = set()
  while len(seen) < n:
    seen.add((int(rng.integers(16, 301)), int(rng.integers(16, 701))))
  for i, (m, cols) in enumerate(sorted(seen)):
    dtype = np.float32 if i % 2 == 0 else ml_dtypes.bfloat16
    k = 128
    a = rng.standard_normal((m, k)).astype(dtype)
    b = (rng.standard_normal((k, cols)) / np.sqrt(k)).astype(dtype)
    g = np.asarray(jnp.dot(a, b, preferred_element_type=jnp.float32)
                   .astype(dtype))
    chunks = sum(np.asarray(jnp.dot(a[:, j:j + 32], b[j:j + 32],
                                    preferred_element_type=jnp.float32))
                 for j in range(0, k, 32)).astype(dtype)
    r = a.astype(np.float64) @ b.astype(np.float64)
    kind = "benign" if i % 4 < 2 else "bitflip"
    t = chunks
    if kind == "bitflip":
      import peat_jax as peat  # pylint: disable=g-import-not-at-top
      t = np.asarray(peat.inject("bitflip", jax.random.key(i),
                                 jnp.asarray(chunks), count=3))
    yield kind, (m, cols), np.dtype(dtype).name, t, g, r


def _run(mode: str) -> dict:
  import peat_jax as peat  # pylint: disable=g-import-not-at-top

  def full(t, g, r):
    return peat.detect(peat.analyze(t, g, r)), ["analyze"]

  def triage(t, g, r):
    sig, screen = jax.device_get(peat.analyzer.screen(t, g, r))
    diag = peat.detector.triage(sig, screen)
    if diag is not None:
      return diag, ["screen"]
    sig = peat.analyzer.with_decomposition(
        sig, jax.device_get(peat.analyzer.decomposition(t, g, r)))
    return peat.detect(sig), ["screen", "decompose"]

  fn = {"full": full, "triage": triage}[mode]
  cases = list(_cases(_SHAPES.value, _SEED.value))
  rows = []
  t_all = time.perf_counter()
  seen = set()  # (path, size bucket, dtype) met before
  for kind, shape, dtype, t, g, r in cases:
    t0 = time.perf_counter()
    d, paths = fn(t, g, r)
    first = time.perf_counter() - t0
    # Whether the call met a new executable: a (size bucket, dtype) not
    # met before by its path (the screen, and the decomposition where the
    # screen flagged the record; or the whole signature).
    b = peat.analyzer.size_bucket(shape)
    keys = {(p, b, dtype) for p in paths}
    compiled = not keys <= seen
    seen |= keys
    t0 = time.perf_counter()
    fn(t, g, r)
    warm = time.perf_counter() - t0
    rows.append({"kind": kind, "shape": shape, "dtype": dtype,
                 "first": first, "warm": warm, "compiled": compiled,
                 "model": d.model,
                 "verdict": d.verdict})
  return {"mode": mode, "rows": rows, "wall": time.perf_counter() - t_all}


def main(argv):
  del argv
  if _MODE.value != "both":
    print(json.dumps(_run(_MODE.value)))
    return 0
  out = {}
  for mode in ("full", "triage"):
    proc = subprocess.run(
        [sys.executable, __file__, f"--mode={mode}",
         f"--shapes={_SHAPES.value}", f"--seed={_SEED.value}"],
        capture_output=True, text=True, check=True)
    out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
  print(f"{_SHAPES.value} distinct shapes (float32 and bf16, benign and "
        "bit-flipped), each mode in its own process")
  print("| mode | KUT | first call (s, mean) | warm call (s, mean) | "
        "compilation per new shape (s) | calls that compiled | their "
        "first call (s, mean) | the others' first call (s, mean) | models |")
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  mean = lambda xs: float(np.mean(xs)) if xs else float("nan")
  for mode, res in out.items():
    for kind in ("benign", "bitflip"):
      rs = [r for r in res["rows"] if r["kind"] == kind]
      first = mean([r["first"] for r in rs])
      warm = mean([r["warm"] for r in rs])
      new = [r["first"] for r in rs if r.get("compiled")]
      seen = [r["first"] for r in rs if not r.get("compiled")]
      models = sorted({f"{r['model']} {r['verdict']}" for r in rs})
      print(f"| {mode} | {kind} | {first:.3f} | {warm:.4f} | "
            f"{first - warm:.3f} | {len(new)} of {len(rs)} | "
            f"{mean(new):.3f} | {mean(seen):.4f} | {', '.join(models)} |")
  for mode, res in out.items():
    print(f"{mode}: the set of {len(res['rows'])} analyze+detect calls on "
          f"distinct shapes in {res['wall']:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
