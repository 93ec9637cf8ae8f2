"""The port probe's precision hypotheses: the base fitted by synthesis.

Where a site's inputs are at hand, a dense base is fitted by re-running
the kernel's float64 reference under each hypothesis of its arithmetic:

* ``inputs_<fmt>``: its floating inputs rounded to ``fmt`` to nearest
  (ties to even); these and a GEMM's tf32 operands truncated are the
  hypotheses every flagged site tries, on the device in playback
  (:func:`probe_formats`);
* ``inputs_<fmt>_toward_zero``, ``inputs_<fmt>_nearest_away``: the same
  inputs rounded toward zero (what tensor cores do to raw float32
  operands) or to nearest with ties away;
* at a normalization (:data:`ACTIVATION_KINDS`), each of these also with
  only the activation (its first input) rounded and its scale and bias
  kept: a 16-bit normalization kernel that reads float32 parameters
  (same name, its sentence says which);

Outputs rounded to a coarser format are the Analyzer's base, fitted
exactly from the outputs (``signature._base``), not a probe hypothesis.
The other modes and formats are tried, on the host, at the sites of a
kind with variants of its own (``_forms.FORM_KINDS``: the probe runs on
the host there anyway) where the KUT's error level fits them: formats
whose input-rounding level (0.6 u) lies within :data:`LEVEL_OCTAVES` of
the KUT's median relative error, so that the probe's cost stays a few
reference evaluations per flagged site.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.probes._forms import Variant
from peat_jax.injectors import round_to

#: GEMM kinds: their inputs meet in tensor-core products (tf32).
GEMM_KINDS = ("dot_general", "matmul", "conv", "conv2d",
              "conv_general_dilated", "attention")
#: The formats the level may call for, and the rounding modes tried.
LEVEL_FORMATS = ("tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2")
MODES = ("nearest_even", "toward_zero", "nearest_away")
#: Inputs rounded to a format leave a median relative error near 0.6 u in
#: the output (the Detector's input_rounding_level); a format is tried in
#: every mode when the KUT's level lies within this many octaves of it
#: (three: a truncation's level is about twice a rounding's, and the next
#: format of a nested pair, fp8 e5m2 beside e4m3, one octave further).
INPUT_LEVEL = 0.6
LEVEL_OCTAVES = 3.0
#: Kinds whose first input is the activation and the rest its parameters
#: (scale, bias), which a kernel may read in float32 beside a 16-bit
#: activation.
ACTIVATION_KINDS = ("layer_norm", "rms_norm")


def probe_formats(kind: str) -> tuple[str, ...]:
  """The keys of the probe's input-precision hypotheses every flagged site
  of a kind tries (playback on the device too): its hypothesis
  ``inputs_<key>`` is the kernel's float64 reference on its floating
  inputs rounded as the key says (:func:`variant_rounding`: a format, to
  nearest, or ``<fmt>_<mode>``). A GEMM's tensor cores take tf32 operands,
  rounded to nearest or truncated (raw float32 data); other kinds round to
  bf16 or fp16."""
  return (("bf16", "tf32", "tf32_toward_zero") if kind in GEMM_KINDS
          else ("bf16", "fp16"))


def variant_rounding(key: str) -> tuple[str, str]:
  """``(format, mode)`` of a hypothesis key: ``tf32_toward_zero`` ->
  ``("tf32", "toward_zero")``, ``bf16`` -> ``("bf16", "nearest_even")``."""
  for mode in MODES:
    if key.endswith(f"_{mode}"):
      return key[:-len(mode) - 1], mode
  return key, "nearest_even"


def precision_sentence(fmt: str, mode: str = "nearest_even") -> str:
  """What the hypothesis rounding the inputs to ``fmt`` in ``mode`` is."""
  how = "" if mode == "nearest_even" else f" ({mode.replace('_', ' ')})"
  return f"the kernel on its inputs rounded to {fmt}{how}"


def rounded_operand(x, fmt: str, mode: str = "nearest_even"):
  """A floating operand rounded to ``fmt`` in ``mode`` (as float64); a
  scalar constant of the call (an epsilon) or an integer operand as it
  is."""
  if not hasattr(x, "dtype") or not np.ndim(x):
    return x
  a = np.asarray(x)
  if not np.issubdtype(a.dtype, np.floating) and a.dtype.name not in (
      "bfloat16", "float16"):
    return a
  y = round_to(jnp.asarray(a, jnp.float32), _core.FORMATS[fmt], mode)
  return np.asarray(y, np.float64)


def _fitting_formats(level: float | None, wider_than: float,
                     every: bool = False) -> list[str]:
  """The formats whose input-rounding level is within LEVEL_OCTAVES of
  ``level`` (``every``: all of them) and coarser than the output's own
  unit roundoff."""
  if not every and (level is None or not level > 0):
    return []
  out = []
  for fmt in LEVEL_FORMATS:
    u = _core.FORMATS[fmt].unit_roundoff
    if u > wider_than and (every or abs(math.log2(
        level / (INPUT_LEVEL * u))) <= LEVEL_OCTAVES):
      out.append(fmt)
  return out


def precision_hypotheses(kind: str, args: Sequence[Any],
                         reference_fn: Callable[..., Any],
                         given: Mapping[str, Any] | None = None,
                         level: float | None = None,
                         out_u: float = 2.0 ** -24,
                         every: bool = False) -> list[Variant]:
  """The precision hypotheses of a site (module doc).

  Args:
    kind: the site kind.
    args: the floating inputs ``reference_fn`` takes.
    reference_fn: the kernel's float64 reference.
    given: hypotheses computed already (name -> float64 output: playback's
      ``inputs_<fmt>`` on the device).
    level: the KUT's median relative error against the reference (None:
      the keys of :func:`probe_formats` only).
    out_u: the unit roundoff of the output's dtype.
    every: every format coarser than the output, in every mode (a
      primitive whose device formats did not explain it: no level, which
      the device and the host read alike, chooses).

  Returns:
    The :class:`~._forms.Variant` list, the device formats first.
  """
  out = []
  for key in probe_formats(kind):
    name = f"inputs_{key}"
    fmt, mode = variant_rounding(key)
    if given is not None and name in given:
      fn = lambda name=name: given[name]
    else:
      fn = lambda fmt=fmt, mode=mode: reference_fn(
          *[rounded_operand(a, fmt, mode) for a in args])
    out.append(Variant(f"precision:{fmt}", name,
                       precision_sentence(fmt, mode), fn,
                       extra={"where": "inputs", "rounding": mode}))
  done = {v.name for v in out}
  for fmt in _fitting_formats(level, out_u, every):
    for mode in MODES:
      suffix = "" if mode == "nearest_even" else f"_{mode}"
      if f"inputs_{fmt}{suffix}" in done:
        continue
      out.append(Variant(
          f"precision:{fmt}", f"inputs_{fmt}{suffix}",
          precision_sentence(fmt, mode),
          lambda fmt=fmt, mode=mode: reference_fn(
              *[rounded_operand(a, fmt, mode) for a in args]),
          extra={"where": "inputs", "rounding": mode}))
  if kind in ACTIVATION_KINDS and len(args) > 1:
    out += [_activation_only(v, args, reference_fn) for v in list(out)]
  return out


def _activation_only(v: Variant, args: Sequence[Any],
                     reference_fn: Callable[..., Any]) -> Variant:
  """``v`` with only the first input (the activation) rounded, the
  parameters kept at their own precision."""
  fmt, mode = v.model.partition(":")[2], v.extra["rounding"]
  return Variant(
      v.model, v.name, f"{precision_sentence(fmt, mode)} (the activation "
      "only; its scale and bias kept)",
      lambda: reference_fn(rounded_operand(args[0], fmt, mode), *args[1:]),
      extra={"where": "activation", "rounding": mode})
