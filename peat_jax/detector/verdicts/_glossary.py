"""The error models a record can be named, for the person who reads it.

One entry per name the Detector gives (``peat.detect``, playback, fuzz,
invariance): what it means, the verdict it gives and the threshold that
decides it (read from the families and the :class:`DetectorConfig` the
verdicts use, so page and code cannot disagree), and where in a kernel to
look. docs/error_models.md is generated from :func:`glossary_table` and
:func:`verdict_rule` (``scripts/generated_docs.py``); the HTML report
carries the entries of the models it names.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from peat_jax.detector.facts import (
    BENIGN_MODELS, CONFIG, FAULT_MODELS, PORT_MODELS, PRECISION_MODELS,
    DetectorConfig, family)
from peat_jax.detector.verdicts._invariance import (
    INVARIANCE_FAULTS, INVARIANCE_MODELS)
from peat_jax.detector.verdicts._training import (
    BENIGN_TRAINING_LIMIT, BF16_PROXY_LIMIT)
from peat_jax.detector.verdicts._verdict import LOCALIZE_NOISE_RATIO


class Entry(NamedTuple):
  """One error model of the glossary.

  Attributes:
    name: the model's name as records give it (``precision`` stands for
      every ``precision:<fmt>``).
    meaning: what it means.
    look_at: where in a kernel to look first.
  """

  name: str
  meaning: str
  look_at: str


_FMT = "`<fmt>` one of `bf16`, `fp16`, `tf32`, `fp8_e4m3`, `fp8_e5m2`"

ENTRIES: tuple[Entry, ...] = (
    Entry("exact", "bitwise identical to the golden kernel", "nothing"),
    Entry("reordering",
          "rounding noise of another summation order or fused operation at "
          "working precision", "nothing: another order of the same "
          "arithmetic (a blocked or split-K sum, an FMA, a tree reduction)"),
    Entry("precision",
          f"`precision:<fmt>`: inputs or outputs rounded to a narrower "
          f"format, {_FMT}; the evidence gives the rounding mode",
          "where operands or results are converted: casts, TF32 modes "
          "(`allow_tf32`, cuBLAS/cuDNN math modes, XLA's DEFAULT precision "
          "on GPUs), the MMA's input type"),
    Entry("accumulation",
          "`accumulation:<fmt>`: a reduction accumulated in a narrower "
          "format; the error grows with the reduction's length",
          "the accumulator's type: the MMA accumulator, a running sum's "
          "register, a split-K partial's storage"),
    Entry("truncation",
          "round toward zero instead of to nearest: a biased error",
          "conversions that chop: round-toward-zero intrinsics, a float to "
          "bf16 conversion by shifting bits"),
    Entry("ftz", "subnormals flushed to zero",
          "flush-to-zero and denormals-are-zero modes: `-ftz=true`, "
          "`--use_fast_math`, MXCSR FTZ/DAZ"),
    Entry("saturation",
          "values clipped at a format's maximum, or overflowed to Inf",
          "saturating conversions (`satfinite`), a narrow intermediate "
          "that overflows, a clamp"),
    Entry("bitflip", "sparse transient flips of one or a few bits",
          "hardware or memory (ECC), a race on partial words; rerun the "
          "same inputs"),
    Entry("stuck_at",
          "one bit position forced to 0 or 1 across many elements",
          "a mask or shift in packing or unpacking code, a faulty lane of "
          "hardware"),
    Entry("random_value", "sparse elements replaced by unrelated values",
          "uninitialized memory, out-of-bounds reads, races between "
          "writers"),
    Entry("zero", "elements, rows or tiles left zero (missed writes)",
          "stores that never happen: a grid that does not cover the output, "
          "an early return, a store mask"),
    Entry("nan", "NaN or Inf where golden is finite",
          "an unguarded division, log or exp; a max over an empty or fully "
          "masked row; uninitialized memory"),
    Entry("lane",
          "corruption confined to periodic positions (a lane of 32, a tile)",
          "one thread's or SIMD lane's index arithmetic or predicate"),
    Entry("indexing",
          "golden values in the wrong places: shift, transpose, "
          "permutation; with the call's inputs, the operand or block read "
          "in the wrong place (a flipped filter, scale and bias exchanged, "
          "a contraction one term short, a mask one key off)",
          "index arithmetic: offsets, strides, layouts (row vs column "
          "major, OIHW vs HWIO), loop bounds one off, which operand goes "
          "where"),
    Entry("scale", "the output equals golden times a constant, or each row "
          "its own factor (an online softmax that does not rescale its "
          "running sum)", "a normalization: a missing or doubled 1/sqrt(d) or "
          "1/n, a softmax denominator (a running sum not rescaled)"),
    Entry("nondeterminism",
          "different outputs for identical inputs",
          "atomics or split-K reductions whose order changes between calls"),
    Entry("parameter",
          "a constant of the computation differs (eps, a 1/sqrt(d), biased "
          "vs unbiased variance, a mask fill value, a temperature, RoPE's "
          "theta, label smoothing): the evidence gives the fitted value",
          "the constants a port copies from the other framework's defaults"),
    Entry("approximation",
          "a known approximation in place of the exact function (GELU tanh "
          "vs erf, a fast exp, a bit-trick rsqrt, an approximate "
          "reciprocal): the approximation library's members only",
          "the function's formula and its intrinsics (`__expf`, `rsqrt`, "
          "fast-math reciprocals)"),
    Entry("stale",
          "the output, or a region of it, holds an earlier call's values",
          "a cache keyed on something other than the input, an output "
          "buffer never written"),
    Entry("input_mutation", "the KUT changed its inputs",
          "in-place writes into an input buffer (aliasing, donated "
          "buffers)"),
    Entry("batch_variance",
          "a row's result depends on the rest of the batch",
          "a reduction split chosen from the batch size, a tiling that "
          "changes with it"),
    Entry("input_insensitive", "the output does not follow the input",
          "a constant, cached or fallback result; a dispatch that never "
          "reaches the kernel"),
    Entry("unknown",
          "real error that no rule explains; with the call's inputs, a "
          "dense error no slip of the grammar reproduces (a wrong formula); "
          "the evidence says what was seen and what was tried",
          "the algorithm itself against golden's: a wrong formula beyond "
          "any known approximation (another function), a missing term"),
)

GLOSSARY: dict[str, Entry] = {e.name: e for e in ENTRIES}


def _x(v: float) -> str:
  return f"{v:g}x"


def verdict_of(name: str, cfg: DetectorConfig = CONFIG) -> str:
  """The verdict one error model gives a record, with its threshold.

  The families and thresholds are those ``model_verdict`` reads.

  Args:
    name: a model name (``precision:tf32`` or its family).
    cfg: the Detector's config.

  Returns:
    A sentence such as ``"warn within formula_fail_level = 0.00390625 ..."``.
  """
  fam = family(name)
  if fam == "exact":
    return "pass"
  if fam == "reordering":
    return (f"pass within `benign_noise_ratio` = "
            f"{_x(cfg.benign_noise_ratio)} the golden noise floor (or a "
            "long sum's working-sum level), warn beyond")
  if fam in PRECISION_MODELS:
    return "warn (whether training minds it is runtime FI's question)"
  if fam in PORT_MODELS:
    return (f"warn while its RMS relative error stays within "
            f"`formula_fail_level` = 2^{_log2(cfg.formula_fail_level)} "
            "(u(bf16), what bf16 training tolerates) of the output's scale; "
            "fail beyond")
  if fam == "unknown":
    return (f"fail; warn when every element is inside the rounding envelope "
            f"and the error within `reordering_envelope` = "
            f"{_x(cfg.reordering_envelope)} the golden noise floor")
  if fam == "batch_variance":
    return (f"warn within `reordering_envelope` = "
            f"{_x(cfg.reordering_envelope)} the golden noise floor, fail "
            "beyond")
  if fam in FAULT_MODELS or fam in INVARIANCE_FAULTS:
    return "fail"
  raise KeyError(f"no verdict rule for error model {name!r}; expected one "
                 f"of {', '.join(GLOSSARY)}")


def _log2(v: float) -> str:
  e = math.log2(v)
  return f"{int(e)}" if e == int(e) else f"{e:.3g}"


def entry(name: str) -> Entry:
  """The glossary entry of a model name (``precision:tf32`` -> ``precision``).

  Raises:
    KeyError: a name the Detector never gives.
  """
  fam = family(name)
  if fam not in GLOSSARY:
    raise KeyError(f"unknown error model {name!r}; expected one of "
                   f"{', '.join(GLOSSARY)}")
  return GLOSSARY[fam]


def glossary_table(cfg: DetectorConfig = CONFIG) -> str:
  """The glossary as a markdown table (docs/error_models.md)."""
  rows = ["| error model | what it means | verdict | where to look |",
          "| --- | --- | --- | --- |"]
  for e in ENTRIES:
    rows.append(f'| <a id="{e.name}"></a>`{e.name}` | {e.meaning} | '
                f"{verdict_of(e.name, cfg)} | {e.look_at} |")
  return "\n".join(rows)


def _names(models) -> str:
  return ", ".join(f"`{m}`" for m in models)


def verdict_rule(cfg: DetectorConfig = CONFIG) -> str:
  """How pass, warn and fail are decided, in one paragraph with the names
  and values of its thresholds."""
  faults = [m for m in FAULT_MODELS + INVARIANCE_FAULTS if m != "unknown"]
  return (
      "Each record (one site at one step) gets the verdict of the error "
      "model that explains it: `exact` passes; `reordering` passes within "
      f"`benign_noise_ratio` = {_x(cfg.benign_noise_ratio)} the golden "
      "noise floor (the *noise ratio*: the KUT's RMS error against the "
      "float64 reference over the golden kernel's) and warns beyond; a "
      f"narrower format or another rounding ({_names(PRECISION_MODELS)}) "
      "warns; a port's other constant or closed form "
      f"({_names(PORT_MODELS)}) is judged on its own size, not on the "
      "noise ratio: it warns while its RMS relative error stays within "
      f"`formula_fail_level` = 2^{_log2(cfg.formula_fail_level)} of the "
      "output's scale (u(bf16), what bf16 training tolerates) and fails "
      "beyond (the record's `params.level`): the noise ratio compares "
      "with the golden kernel's own error, this rule with the output's "
      "size, so another GELU far above a float32 noise floor can warn "
      "while a small noise ratio over a bf16 floor fails; a fault "
      f"({_names(faults)}) fails; `batch_variance` warns within "
      "`reordering_envelope` noise floors and fails beyond; `unknown` fails unless every element is "
      "inside the rounding envelope and its noise ratio within "
      f"`reordering_envelope` = {_x(cfg.reordering_envelope)}. The KUT's "
      "verdict is its worst record's. Runtime FI then weighs training: a "
      "pass becomes warn when a run moves the weights more than "
      f"`BF16_PROXY_LIMIT` = {_x(BF16_PROXY_LIMIT)} as much as training "
      "one format below does, and a warn that only `reordering` records "
      "decided becomes pass when every run stays within "
      f"`BENIGN_TRAINING_LIMIT` = {_x(BENIGN_TRAINING_LIMIT)} of it. "
      "`--fail_on` (default `fail`) turns the verdict into the exit status. "
      "A site localizes a failure when its noise ratio exceeds "
      f"`LOCALIZE_NOISE_RATIO` = {_x(LOCALIZE_NOISE_RATIO)} or it fails.")


def names() -> tuple[str, ...]:
  """Every family name the Detector gives, for the consistency test."""
  return tuple(dict.fromkeys(BENIGN_MODELS + PRECISION_MODELS + PORT_MODELS
                             + FAULT_MODELS + INVARIANCE_MODELS))
