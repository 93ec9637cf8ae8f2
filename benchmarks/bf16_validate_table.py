r"""Validate every correct kernel and every port slip on the bf16 scenarios.

Usage::

  python benchmarks/bf16_validate_table.py --scenario=llama \
      [--workdir=/tmp/peat_bf16] [--steps=20] [--checkpoint_every=10] \
      [--kuts=native:rms_norm:hf,...] [--json=out.json]

For each KUT: a whole ``peat.validate`` campaign (the scenario's golden run,
made once and copied into each campaign directory; playback FI at every
checkpoint but the last; runtime FI at every call), then one line: the
verdict, the worst record's error model, its secondary cause, the port
probe's fitted parameter where it fitted one, the noise ratio, and runtime
FI's weight distance in units of the bf16 yardstick. ``CORRECT`` kernels
should pass; ``SLIPS`` should not, with the named family. The table is what
docs/models.md and the closing notes quote; it measures, it asserts nothing.
"""

import json
import os
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging

import peat_jax as peat
import peat_jax.bridges  # noqa: F401  (registers torch: specs)
from peat_jax import models

_SCENARIO = flags.DEFINE_string("scenario", "llama", "llama or vit_bf16.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_bf16",
                               "Campaign directories go here.")
_STEPS = flags.DEFINE_integer("steps", 20, "Golden steps.")
_EVERY = flags.DEFINE_integer("checkpoint_every", 10, "Checkpoint interval.")
_KUTS = flags.DEFINE_list("kuts", None, "Only these KUT specs (default: the "
                          "scenario's whole list).")
_JSON = flags.DEFINE_string("json", None, "Write the rows here as JSON.")

_PORTS = "py:peat_jax.kernels.ports"

#: scenario -> (spec, site kernel or None, what it is) of correct kernels.
CORRECT = {
    "llama": [
        ("native:rms_norm:default", None, "float32 statistics, sequential"),
        ("native:rms_norm:pairwise", None, "float32, pairwise sum"),
        ("native:rms_norm:hf", None, "Hugging Face Llama style"),
        (f"{_PORTS}:rms_norm_hf", "rms_norm", "HF Llama style, JAX"),
        (f"{_PORTS}:rms_norm_l2", "rms_norm", "L2 form, float32"),
        ("torch:rms_norm", None, "torch F.rms_norm"),
        ("native:silu:default", None, "float32 silu"),
        ("native:silu:tanh", None, "float32 tanh form"),
        (f"{_PORTS}:silu_f32", "silu", "float32 silu, JAX"),
        ("torch:silu", None, "torch F.silu"),
        ("native:rope:default", None, "float32 tables"),
        ("native:rope:hf", None, "HF style, tables in bf16"),
        (f"{_PORTS}:rope_f32_tables", "rope", "float32 tables, JAX"),
        ("torch:rope", None, "torch rope"),
        (f"{_PORTS}:gqa_repeat", "attention", "GQA by repeated kv heads"),
        ("torch:attention", None, "torch SDPA, enable_gqa"),
    ],
    "vit_bf16": [
        ("native:layer_norm:default", None, "float32 statistics"),
        ("native:layer_norm:welford", None, "Welford"),
        ("torch:layer_norm", None, "torch F.layer_norm"),
        ("native:softmax:default", None, "float32 softmax"),
        ("torch:softmax", None, "torch.softmax"),
        ("torch:gelu", None, "torch F.gelu (erf)"),
        ("torch:attention", None, "torch SDPA"),
        ("native:matmul:default", None, "float32 accumulation"),
    ],
}
#: scenario -> (spec, site kernel or None, the slip) of port slips.
SLIPS = {
    "llama": [
        ("native:rms_norm:acc_bf16", None, "mean of squares in bf16"),
        (f"{_PORTS}:rms_norm_acc_bf16", "rms_norm", "mean of squares in bf16"),
        ("native:rms_norm:eps", None, "eps 1e-5 for 1e-6"),
        (f"{_PORTS}:rms_norm_eps", "rms_norm", "eps 1e-5 for 1e-6"),
        ("native:rms_norm:layer_norm", None, "LayerNorm as RMSNorm"),
        (f"{_PORTS}:rms_norm_as_layer_norm", "rms_norm", "LayerNorm as "
         "RMSNorm"),
        ("native:silu:bf16", None, "silu in bf16"),
        (f"{_PORTS}:silu_bf16", "silu", "silu in bf16"),
        ("native:silu:swapped", None, "gate and up swapped"),
        (f"{_PORTS}:swiglu_swapped", "silu", "gate and up swapped"),
        ("native:rope:interleaved", None, "GPT-J layout"),
        (f"{_PORTS}:rope_interleaved", "rope", "GPT-J layout"),
        ("native:rope:theta_500k", None, "theta 500,000"),
        (f"{_PORTS}:rope_theta_500k", "rope", "theta 500,000"),
        ("native:rope:offset", None, "positions + 1"),
        (f"{_PORTS}:rope_offset", "rope", "positions + 1"),
        (f"{_PORTS}:gqa_wrong_group", "attention", "kv head j % Hk"),
    ],
    "vit_bf16": [
        ("native:layer_norm:acc_bf16", None, "statistics in bf16"),
        ("native:layer_norm:naive_var", None, "E[x^2] - E[x]^2"),
        (f"{_PORTS}:layer_norm_eps", "layer_norm", "eps 1e-5 for 1e-6"),
        ("torch:gelu_tanh", None, "GELU tanh for erf"),
        ("native:softmax:fast_exp", None, "fast exp"),
        ("native:matmul:acc_bf16", None, "bf16 accumulation"),
    ],
}


def _worst(results):
  order = {"pass": 0, "warn": 1, "fail": 2}
  recs = sorted(results.playback, key=lambda r: (
      -order[r.verdict], -(r.noise_ratio or 0.0)))
  return recs[0] if recs else None


def _row(results, directory, spec, kind, what, seconds):
  worst = _worst(results)
  runs = [r for r in results.runtime if r.frequency]
  vs_bf16 = None
  for r in runs:
    sig = r.extra.get("significance") or {}
    if sig.get("vs_bf16") is not None:
      vs_bf16 = sig["vs_bf16"]
  site = worst.site if worst else "-"
  recs = peat.profiler.read_records(os.path.join(directory,
                                                 "playback.msgpack"))
  rec = next((r for r in recs if r.get("kind") == "site"
              and r.get("site") == site
              and r.get("step") == (worst.step if worst else None)), {})
  port = rec.get("port") or {}
  secondary = ((rec.get("diagnosis") or {}).get("secondary") or {}).get(
      "model", "")
  return {"kut": spec, "kernel": kind, "what": what,
          "verdict": results.verdict.verdict,
          "model": worst.model if worst else "-",
          "secondary": secondary,
          "probe": port.get("name", "") if port.get("explains") else "",
          "estimate": port.get("estimate") if port.get("explains") else None,
          "noise_ratio": worst.noise_ratio if worst else None,
          "vs_bf16": vs_bf16, "site": site, "seconds": round(seconds, 1),
          "summary": results.verdict.summary}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  scen = _SCENARIO.value
  if scen not in CORRECT:
    print(f"unknown scenario {scen!r}; expected one of {sorted(CORRECT)}",
          file=sys.stderr)
    return 2
  todo = [(s, k, w, "correct") for s, k, w in CORRECT[scen]] + [
      (s, k, w, "slip") for s, k, w in SLIPS[scen]]
  if _KUTS.value:
    todo = [t for t in todo if t[0] in _KUTS.value]
  root = os.path.abspath(os.path.join(_WORKDIR.value, scen))
  task = models.get_task(scen)
  golden = os.path.join(root, "golden_once", peat.profiler.GOLDEN_DIR)
  t0 = time.time()
  peat.golden_train(task, golden, steps=_STEPS.value,
                    checkpoint_every=_EVERY.value, evaluate=False)
  print(f"{scen}: golden run of {_STEPS.value} steps ({time.time() - t0:.0f}"
        " s)", flush=True)
  rows = []
  for spec, kind, what, group in todo:
    d = os.path.join(root, spec.replace(":", "_").replace(".", "_"))
    if not os.path.isdir(os.path.join(d, peat.profiler.GOLDEN_DIR)):
      shutil.copytree(golden, os.path.join(d, peat.profiler.GOLDEN_DIR))
    parsed = peat.kernels.parse_kut(spec, kind) if kind else spec
    t0 = time.time()
    try:
      peat.validate(task, parsed, d, steps=_STEPS.value,
                    checkpoint_every=_EVERY.value, frequencies=("every",),
                    isolate=False, scenario=scen, progress=None)
      res = peat.read_campaign(d)
      row = _row(res, d, spec, kind or "", what, time.time() - t0)
    except peat.PeatError as e:
      row = {"kut": spec, "kernel": kind or "", "what": what,
             "verdict": "error", "model": "-", "secondary": "", "probe": "",
             "estimate": None,
             "noise_ratio": None, "vs_bf16": None, "site": "-",
             "seconds": round(time.time() - t0, 1), "summary": str(e)}
    row["group"] = group
    rows.append(row)
    nr = row["noise_ratio"]
    vb = row["vs_bf16"]
    est = row.get("estimate")
    probe = (row["probe"] or "-") + ("" if est is None else f"={est:.3g}")
    print(f"{group:7s} {spec:45s} {row['verdict']:5s} {row['model']:18s} "
          f"{row['secondary'] or '-':16s} {probe:22s} "
          f"noise {'-' if nr is None else f'{nr:.2g}':>7s} "
          f"vs_proxy {'-' if vb is None else f'{vb:.2g}':>6s} "
          f"({row['seconds']:.0f} s) {what}", flush=True)
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  app.run(main)
