r"""Detector calibration on site inputs captured from the models' training.

Usage::

  python -m peat_jax.tools.calibrate                  # all kernels, 3 dtypes
  python -m peat_jax.tools.calibrate --dtypes=float32 --injection_seeds=0 \
      --rows=128

Trains each source model for a few golden steps, taps the forward sites of
matmul (Linear), convolution, softmax, layer norm, attention and GELU on the
next batch, and runs :func:`peat_jax.detector.run_calibration` on those
inputs: tensor injectors, computation injectors and native kernel variants.
Prints the confusion matrix, per-model accuracy, false alarms and misses.
``--composed`` plants faults on benign bases; ``--invariance`` calibrates
the invariance models (stale, input_mutation, input_insensitive,
batch_variance) with KUTs of known behaviour on the same inputs.
"""

import functools
import json

from absl import flags

from peat_jax.tools import _cli
from absl import logging
import jax
import jax.numpy as jnp
from jax import lax

FLAGS = flags.FlagValues()  # this tool's own flags (see tools/_cli.py)

import peat_jax as peat
from peat_jax import models
from peat_jax.kernels import checks
from peat_jax.kernels import native
from peat_jax.kernels import EXPECTED_ERROR_MODEL
from peat_jax.models import layers

_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16", "float16"],
                            "Input dtypes of the tensor-injection cases.", flag_values=FLAGS)
_SEEDS = flags.DEFINE_list(
    "injection_seeds", ["0", "1"], "Seeds of the injected errors.",
    flag_values=FLAGS)
_ROWS = flags.DEFINE_integer("rows", 256, "Rows kept of each captured input.", flag_values=FLAGS)
_WARMUP = flags.DEFINE_integer(
    "warmup_steps", 30, "Golden steps before capturing site inputs.", flag_values=FLAGS)
_JSON = flags.DEFINE_string("json", None, "Write all records to this file.", flag_values=FLAGS)
_COMPOSED = flags.DEFINE_bool(
    "composed", False,
    "Composed cases instead: faults planted on benign bases (a real port's "
    "own rounding noise or precision), the bases alone, and port "
    "mismatches (float32); accuracy by family.", flag_values=FLAGS)
_INVARIANCE = flags.DEFINE_bool(
    "invariance", False,
    "Invariance cases instead: KUTs that return an earlier call's values, "
    "ignore their input, change it in place or depend on the batch, probed "
    "as in playback, at each source's own dtype (bf16 on llama and "
    "vit_bf16).", flag_values=FLAGS)
_cli.define_renamed_flags(
    FLAGS, seeds=("injection_seeds", "the seeds of the injected errors; "
                  "--seeds is the golden seeds of runtime FI's "
                  "seed-to-seed spread (peat-runtime)"))

# Source models: small enough to capture in seconds, real data and training.
SOURCES = {
    "vit": dict(batch_size=32),
    "gpt": dict(batch_size=8, context=64),
    "cnn": dict(batch_size=32),
    # A pretrained encoder's sites (all-MiniLM-L6-v2, finetuned on topics).
    "minilm_finetune": dict(batch_size=16),
    # bf16 mixed precision: a Llama-style decoder (RMSNorm, RoPE, SwiGLU,
    # grouped-query attention) and the ViT; their sites' inputs are bf16.
    "llama": dict(batch_size=8, context=64),
    "vit_bf16": dict(batch_size=32),
}
_SOURCES = flags.DEFINE_list(
    "sources", list(SOURCES), "Source models whose site inputs are the "
    f"cases (of {', '.join(SOURCES)}).", flag_values=FLAGS)


def _capture(name: str, overrides: dict, warmup: int, kernels: tuple[str, ...]):
  """Trains ``warmup`` golden steps, then taps forward sites of ``kernels``."""
  task = models.get_task(name, **overrides)
  state = task.init_state(0)
  for pos in range(warmup):
    state, _ = task.train_step(state, task.batch_at(pos))
  batch = task.batch_at(warmup)
  present = {s.kernel for s in peat.discover_sites(task.step_fn, state, batch)
             if s.phase == "fwd"}
  step = jax.jit(peat.tap(task.step_fn, *[
      peat.Substitution(None, kernel=k, phase="fwd") for k in kernels
      if k in present]))
  _, taps = step(state, batch)
  return taps


def _rows(x, rows):
  x = jnp.asarray(x)
  return x.reshape(-1, x.shape[-1])[:rows]


def _edge_tile(n: int) -> int:
  """A tile that does not divide ``n``, so the edge-tile bug can show."""
  for tile in (40, 24, 56, 20, 12, 6):
    if tile < n and n % tile:
      return tile
  return 64


def _native(kernel, n: int, **fixed):
  """``variant -> jitted native KUT``; tiles chosen so each variant shows.

  ``tile_edge_bug`` tiles the output width ``n`` with a tile that does not
  divide it; ``threaded_nondet`` splits the reduction into chunks of 16 so
  several threads take part.
  """
  def make(variant):
    fn = native.KERNELS[kernel]
    extra = {}
    if variant == "tile_edge_bug":
      extra["tile"] = _edge_tile(n)
    elif variant == "threaded_nondet":
      extra["tile"] = 16
    return jax.jit(functools.partial(fn, variant=variant, **fixed, **extra))
  return make


def _conv_golden(x, w):
  return lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _rms_norm_case(source, inputs, rows):
  x, scale = inputs[:2]
  return peat.detector.CalibrationCase(
      "rms_norm", source, checks.rms_norm_golden, (_rows(x, rows), scale),
      reduction=int(x.shape[-1]),
      reference_fn=peat.analyzer.reference_rms_norm)


def _silu_case(source, inputs, rows):
  gate, up = inputs[:2]
  return peat.detector.CalibrationCase(
      "silu", source, layers.swiglu.__wrapped__,
      (_rows(gate, rows), _rows(up, rows)),
      reference_fn=peat.analyzer.reference_silu)


def _rope_case(source, inputs, rows):
  x, positions = inputs[:2]
  del rows
  return peat.detector.CalibrationCase(
      "rope", source, layers.rope.__wrapped__, (x[:4], positions),
      reference_fn=peat.analyzer.reference_rope)


def _gqa_case(source, inputs, rows):
  q, k, v = inputs[:3]
  del rows
  golden = functools.partial(jax.nn.dot_product_attention, is_causal=True)
  return peat.detector.CalibrationCase(
      "attention", source, golden, (q[:4], k[:4], v[:4]),
      reduction=int(k.shape[1]),
      reference_fn=functools.partial(peat.analyzer.reference_attention,
                                     is_causal=True))


#: The llama scenario's kernels (``jax.nn.dot_product_attention`` is its
#: attention: causal, grouped-query); the other scenarios' attention is
#: ``layers.attention``.
_LLAMA_CASES = {"rms_norm": _rms_norm_case, "silu": _silu_case,
                "rope": _rope_case}


def build_cases(rows: int = 256, warmup: int = 30,
                sources=SOURCES) -> list[peat.detector.CalibrationCase]:
  """Calibration cases from site inputs captured in the models' training.

  Args:
    rows: keep at most this many rows of each captured input.
    warmup: golden training steps before capturing.
    sources: ``{scenario: config overrides}``.

  Returns:
    The cases.
  """
  Case = peat.detector.CalibrationCase
  cases = []
  for name, overrides in sources.items():
    if name == "cnn":
      taps = _capture(name, overrides, warmup, ("conv_general_dilated",))
      for site, tp in sorted(taps.items()):
        x, w = tp.inputs
        k = int(w.shape[0] * w.shape[1] * w.shape[2])
        if k < 64:  # the first conv (K = 9) reduces too little to tell
          continue  # accumulation or reordering from one rounding
        cases.append(Case("conv", f"{name} {site}", _conv_golden,
                          (x[:8], w), reduction=k,
                          native=_native("conv2d", int(w.shape[3])),
                          native_variants=EXPECTED_ERROR_MODEL["conv2d"]))
      continue
    taps = _capture(name, overrides, warmup,
                    ("dot_general", "softmax", "layer_norm", "gelu",
                     "attention", "rms_norm", "silu", "rope"))
    picked = {}
    for site, tp in sorted(taps.items()):
      kernel = site.split("/")[-1].split(":")[0]
      if kernel == "dot_general":
        lhs, rhs = tp.inputs
        if rhs.ndim != 2 or lhs.shape[-1] != rhs.shape[0] or "Linear" not in site:
          continue
        if picked.get(kernel, 0) >= 2:
          continue
        picked[kernel] = picked.get(kernel, 0) + 1
        cases.append(Case("matmul", f"{name} {site}", jnp.matmul,
                          (_rows(lhs, rows), rhs), reduction=int(rhs.shape[0]),
                          native=_native("matmul", int(rhs.shape[1])),
                          native_variants=EXPECTED_ERROR_MODEL["matmul"]))
      elif kernel in ("softmax", "layer_norm", "gelu", "attention",
                      "rms_norm", "silu", "rope"):
        if picked.get(kernel):
          continue
        picked[kernel] = 1
        if kernel in _LLAMA_CASES:
          cases.append(_LLAMA_CASES[kernel](f"{name} {site}", tp.inputs,
                                            rows))
        elif kernel == "softmax":
          (x,) = tp.inputs
          cases.append(Case("softmax", f"{name} {site}", jax.nn.softmax,
                            (_rows(x, rows),), reduction=int(x.shape[-1]),
                            native=_native("softmax", int(x.shape[-1])),
                            native_variants=EXPECTED_ERROR_MODEL["softmax"]))
        elif kernel == "layer_norm":
          x, scale, bias = tp.inputs
          golden = functools.partial(layers.layer_norm.__wrapped__, eps=1e-6)
          variants = dict(EXPECTED_ERROR_MODEL["layer_norm"])
          # E[x^2] - E[x]^2 amplifies rounding by about mean^2 / var; below
          # 16x that stays inside the reordering envelope (benign here).
          xr = _rows(x, rows)
          amp = float(jnp.max(jnp.mean(xr, -1) ** 2 / jnp.var(xr, -1)))
          if amp < 16.0:
            variants["naive_var"] = "reordering"
          cases.append(Case(
              "layer_norm", f"{name} {site}", golden,
              (_rows(x, rows), scale, bias), reduction=int(x.shape[-1]),
              native=lambda v: jax.jit(functools.partial(
                  native.layer_norm, eps=1e-6, variant=v)),
              native_variants=variants))
        elif kernel == "gelu":
          (x,) = tp.inputs
          cases.append(Case("gelu", f"{name} {site}",
                            functools.partial(jax.nn.gelu, approximate=False),
                            (_rows(x, rows),)))
        elif name == "llama":
          cases.append(_gqa_case(f"{name} {site}", tp.inputs, rows))
        else:
          q, k, v = tp.inputs[:3]
          mask = tp.inputs[3] if len(tp.inputs) > 3 else None
          if mask is not None and mask.ndim == 4 and mask.shape[0] > 1:
            mask = mask[:4]  # a per-example (padding) mask, as q[:4]
          golden = functools.partial(layers.attention.__wrapped__, mask=mask)
          cases.append(Case("attention", f"{name} {site}", golden,
                            (q[:4], k[:4], v[:4]), reduction=int(k.shape[1])))
  return cases


def main(argv):
  if _cli.stray(argv) is not None:
    return 2
  logging.set_verbosity(logging.WARNING)
  unknown = sorted(set(_SOURCES.value) - set(SOURCES))
  if unknown:
    print(f"unknown --sources {unknown}; known: {', '.join(SOURCES)}")
    return 2
  cases = build_cases(_ROWS.value, _WARMUP.value,
                      {k: SOURCES[k] for k in _SOURCES.value})
  print(f"{len(cases)} captured cases: " + ", ".join(
      sorted({c.kernel for c in cases})))
  seeds = [int(s) for s in _SEEDS.value]
  if _COMPOSED.value:
    result = peat.detector.run_composed_calibration(
        cases, dtypes=_DTYPES.value, seeds=seeds, progress=print)
  elif _INVARIANCE.value:
    result = peat.detector.run_invariance_calibration(cases, progress=print)
  else:
    result = peat.detector.run_calibration(
        cases, dtypes=_DTYPES.value, seeds=seeds, progress=print)
  print()
  for i, label in enumerate(result.labels):
    print(f"{i:>2d} {label}")
  print(result.table())
  print(result.summary())
  if _COMPOSED.value:
    print()
    print("By base and dtype:")
    print(peat.detector.composed_by_base(result.records))
  right = (peat.detector.family_correct if _COMPOSED.value
           else peat.detector.is_correct)
  print()
  print("Reliability (stated confidence vs observed accuracy):")
  print(peat.detector.reliability_table(result.records, right))
  wrong = [r for r in result.records if not right(r)]
  for r in wrong:
    print(f"  {r.expected:>20s} -> {r.predicted:<20s} {r.origin}:{r.error} "
          f"[{r.verdict}{', 2nd ' + r.secondary if r.secondary else ''}] "
          f"{r.kernel} {r.dtype} | {r.evidence[:120]}")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump([r._asdict() for r in result.records], f, indent=0)
  return 0


if __name__ == "__main__":
  _cli.run(main, FLAGS, __doc__)
