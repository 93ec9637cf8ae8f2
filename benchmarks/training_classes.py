"""The Detector's classes in training: ports a user writes, validated in
playback on a real model.

Each class is a whole ``peat-validate`` campaign (golden run, playback,
runtime FI, verdict) of a user's own kernel at its site kind:

* ``rope_bf16_tables`` (llama, bf16): a rotary embedding whose inverse
  frequencies, angles, cos and sin are computed in bf16 (HF's float32
  tables are the model's): a precision loss, named with its format;
* ``swiglu_gelu`` (llama): SwiGLU with GELU where the model uses SiLU: a
  wrong formula far beyond the noise floor, which fails;
* ``torch_layer_norm`` (gpt, float32): torch's own ``F.layer_norm``
  forward and, with ``--backward=kut``, its VJP: correct, which passes.

Prints one line per class (its verdict and the models of its records)
and, with ``--json``, the records' diagnoses.

  PYTHONPATH=benchmarks .venv/bin/python benchmarks/training_classes.py
  PYTHONPATH=benchmarks .venv/bin/python benchmarks/training_classes.py \\
      --classes=swiglu_gelu --steps=10 --json=/tmp/classes.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rope_bf16_tables(x: jax.Array, positions: jax.Array,
                     theta: float = 10000.0) -> jax.Array:
  """RoPE (the two halves rotated) with its tables computed in bf16: the
  inverse frequencies, the angles, cos and sin each rounded to bf16."""
  d = x.shape[-1]
  h = d // 2
  bf = jnp.bfloat16
  inv = (jnp.asarray(theta, jnp.float32) ** (
      -jnp.arange(h, dtype=jnp.float32) * (2.0 / d))).astype(bf)
  ang = jnp.asarray(positions).astype(bf)[:, None] * inv[None, :]
  cos = jnp.cos(ang).astype(bf).astype(jnp.float32)[None, :, None]
  sin = jnp.sin(ang).astype(bf).astype(jnp.float32)[None, :, None]
  xf = x.astype(jnp.float32)
  x1, x2 = xf[..., :h], xf[..., h:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return out.astype(x.dtype)


def swiglu_gelu(x: jax.Array, up: jax.Array | None = None) -> jax.Array:
  """SwiGLU's gate with GELU (tanh form) where the model uses SiLU."""
  g = jax.nn.gelu(x.astype(jnp.float32), approximate=True)
  if up is not None:
    g = g * up.astype(jnp.float32)
  return g.astype(x.dtype)


#: class -> (scenario, KUT spec, site kernel, extra flags).
CLASSES = {
    "rope_bf16_tables": ("llama", "py:training_classes:rope_bf16_tables",
                         "rope", []),
    "swiglu_gelu": ("llama", "py:training_classes:swiglu_gelu", "silu", []),
    "torch_layer_norm": ("gpt", "torch:layer_norm", None,
                         ["--backward=kut"]),
}


def run_class(name: str, steps: int, workdir: str) -> dict:
  """One class's campaign, and its verdict and record models."""
  scenario, spec, kernel, extra = CLASSES[name]
  out = os.path.join(workdir, name)
  cmd = [sys.executable, "-m", "peat_jax.tools.validate",
         f"--scenario={scenario}", f"--kut={spec}", f"--steps={steps}",
         f"--checkpoint_every={steps}", "--frequencies=every",
         f"--campaign_dir={out}", "--fail_on=never", "--isolate=off", *extra]
  if kernel:
    cmd.append(f"--kernel={kernel}")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [os.path.join(ROOT, "benchmarks"), os.environ.get("PYTHONPATH", "")])}
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                        text=True, check=False)
  seconds = time.perf_counter() - start
  if proc.returncode not in (0, 1):
    return {"class": name, "error": proc.stderr[-2000:], "seconds": seconds}
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  res = peat.read_campaign(out)
  models = collections.Counter(
      f"{r.model}/{r.verdict}" for r in res.playback)
  return {"class": name, "scenario": scenario, "kut": spec,
          "verdict": res.verdict.verdict, "models": dict(models),
          "records": [{"site": r.site, "step": r.step,
                       "model": r.model,
                       "verdict": r.verdict,
                       "evidence": r.evidence[:300]}
                      for r in res.playback],
          "seconds": round(seconds, 1)}


def main(argv=None) -> int:
  """Runs the classes and prints a line each."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--classes", default=",".join(CLASSES))
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in [c for c in args.classes.split(",") if c]:
      row = run_class(name, args.steps, tmp)
      rows.append(row)
      if "error" in row:
        print(f"{name}: error\n{row['error']}")
        continue
      listed = ", ".join(f"{m} x{c}" for m, c in sorted(
          row["models"].items(), key=lambda kv: -kv[1]))
      print(f"{name} ({row['scenario']}, {row['kut']}): verdict "
            f"{row['verdict']}; records: {listed} ({row['seconds']} s)",
            flush=True)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
