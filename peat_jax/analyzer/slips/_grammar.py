"""The grammar of slips: every perturbation of a call's golden computation
the port probe tries, as :class:`~._variant.Variant` hypotheses.

:func:`slip_variants` lists a call's slips by category
(``operand``, ``constant``, ``blocked``, ``accumulate`` and
``approximation``; the input precisions are the probe's own,
``peat_jax.analyzer.probes._precision``), each with the error model it
names (``peat.core.Slip.model``), its stable name, a sentence in the
kernel engineer's words and the float64 output it predicts (evaluated
lazily). With ``base`` (a precision slip) every slip is made on the
call's inputs rounded as the base says: a two-step composition, a
port on TF32 operands that also drops its last term.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from peat_jax import core as _core
from peat_jax.analyzer.slips import _approximations as approx
from peat_jax.analyzer.slips import _constants as const
from peat_jax.analyzer.slips import _families as fam
from peat_jax.analyzer.slips import _operands as ops
from peat_jax.analyzer.slips import _reductions as red
from peat_jax.analyzer.slips._call import Call, make_call
from peat_jax.analyzer.slips._numerics import round_mode
from peat_jax.analyzer.slips._variant import Variant

#: The grammar's categories, in the order they are listed (a tie between
#: two slips goes to the first: a structural slip before a fitted one).
CATEGORIES = ("operand", "blocked", "accumulate", "approximation",
              "constant")

Run = Callable[[Sequence[np.ndarray]], np.ndarray]


def evaluator(call: Call, reference_fn: Callable[..., Any] | None) -> Run:
  """The call's float64 golden computation as a function of its array
  arguments: the kind's family where it has one, else
  ``reference_fn(*arrays)``."""
  if call.kind in fam.FAMILIES:
    def run(arrays):
      args, kwargs = call.structured(arrays)
      return fam.evaluate(call.kind, args, kwargs)
    return run
  if reference_fn is None:
    return None

  def run(arrays):
    out = reference_fn(*arrays)
    if isinstance(out, (list, tuple)) and len(out) == 1:
      out = out[0]  # a VJP's one cotangent
    return np.asarray(out, np.float64)
  return run


def _extra(slip: _core.Slip, category: str) -> dict:
  out = {"category": category, "slip": slip.name}
  if slip.base is not None:
    out["base"] = slip.base.name
  return out


def _variant(slip: _core.Slip, sentence: str, fn: Callable[[], Any],
             category: str, estimate: float | None = None,
             extra: Mapping[str, Any] | None = None) -> Variant:
  if slip.base is not None:
    sentence = f"{sentence}, on inputs rounded to {slip.base.fmt}" + (
        "" if slip.base.mode in ("", "nearest_even") else
        f" ({slip.base.mode.replace('_', ' ')})")
  return Variant(slip.model, slip.name, sentence, fn, estimate,
                 {**_extra(slip, category), **(extra or {})})


def _on(slip: _core.Slip, base: _core.Slip | None) -> _core.Slip:
  return slip if base is None else slip._replace(base=base)


def operand_variants(call: Call, run: Run, arrays, base) -> list[Variant]:
  """Every operand slip."""
  out = []
  for s in ops.operand_slips(call):
    if s.op == "mask_shift":
      fn = lambda s=s: _mask_shift(call, arrays, s.shift)
    else:
      fn = lambda s=s: run(ops.transform(s, arrays))
    out.append(_variant(_on(s, base), ops.sentence(call, s), fn, "operand"))
  return out


def _mask_shift(call: Call, arrays, shift: int) -> np.ndarray:
  args, kwargs = call.structured(arrays)
  return fam.evaluate(call.kind, args, kwargs, fam.Hooks(mask_shift=shift))


def blocked_variants(call: Call, run: Run, arrays, base) -> list[Variant]:
  """Every blocked-reduction slip."""
  return [_variant(_on(s, base), red.block_sentence(call, s),
                   lambda s=s: red.block_output(call, s, run, arrays),
                   "blocked", extra={"width": s.width})
          for s in red.block_slips(call)]


def accumulate_variants(call: Call, run: Run, arrays, base
                        ) -> list[Variant]:
  """Every narrow-accumulator slip."""
  return [_variant(_on(s, base), red.accumulate_sentence(call, s),
                   lambda s=s: red.accumulate_output(call, s, arrays, run),
                   "accumulate", extra={"where": "accumulator",
                                        "rounding": "nearest_even"})
          for s in red.accumulate_slips(call)]


def approximation_variants(call: Call, t, arrays, base) -> list[Variant]:
  """The library's members, and its classes fitted to ``t``."""
  out = [_variant(_on(s, base), f"{sentence} (a known approximation)",
                  lambda fn=fn: fn(arrays), "approximation")
         for s, sentence, fn in approx.member_slips(call)]
  sub = call if base is None else call._replace(arrays=tuple(arrays))
  out += [_variant(_on(s, base), sentence, lambda fn=fn: fn(arrays),
                   "approximation", estimate=worst)
          for s, sentence, fn, worst in approx.fitted_slips(sub, t)]
  return out


def constant_variants(call: Call, t, arrays, base,
                      param: str | None = None) -> list[Variant]:
  """The constants refitted to ``t`` (``param``: that one alone)."""
  sub = call if base is None else call._replace(arrays=tuple(arrays))
  return [_variant(_on(s, base), sentence, fn, "constant",
                   estimate=s.value)
          for s, sentence, fn in const.constant_fits(sub, t, param)]


def rounded(call: Call, base: _core.Slip) -> list:
  """The call's array arguments rounded as a precision base says."""
  return [round_mode(a, base.fmt, base.mode or "nearest_even")
          if call.floating(i) else a for i, a in enumerate(call.arrays)]


def category_of(name: str) -> str | None:
  """The category of a slip's name (``Slip.name``, no base): None for
  names the grammar does not make (the input precisions, a kind's own
  forms)."""
  if name.startswith("operand:"):
    return "operand"
  if name.startswith("blocked:"):
    return "blocked"
  if name.startswith("acc_"):
    return "accumulate"
  if name in _core.APPROXIMATIONS or name in _core.APPROXIMATION_CLASSES:
    return "approximation"
  if any(name in p for p in _core.PARAMETERS.values()):
    return "constant"
  return None


def split_name(name: str) -> tuple[_core.Slip | None, str]:
  """``(base, own name)`` of a slip's name: the base's precision slip
  (``inputs_tf32_toward_zero+...``) or None."""
  head, plus, own = name.partition("+")
  if not plus or not head.startswith("inputs_"):
    return None, name
  key = head[len("inputs_"):]
  for mode in _core.SLIP_MODES:
    if key.endswith(f"_{mode}"):
      return _core.Slip("precision", "inputs", fmt=key[:-len(mode) - 1],
                        mode=mode), own
  return _core.Slip("precision", "inputs", fmt=key, mode="nearest_even"), own


def slip_variants(kind: str, args: Sequence[Any],
                  kwargs: Mapping[str, Any] | None, test,
                  reference_fn: Callable[..., Any] | None = None, *,
                  categories: Sequence[str] = CATEGORIES,
                  base: _core.Slip | None = None,
                  only: str | None = None,
                  _param: str | None = None) -> list[Variant]:
  """Every slip of the grammar for one call, as probe hypotheses.

  Args:
    kind: the site kind.
    args, kwargs: the call's structured arguments (primitives: the
      operands and the primitive's parameters).
    test: the KUT's output (constants and the library's classes are
      fitted to it).
    reference_fn: the kind's float64 reference on the call's array
      arguments (kinds without a family: the primitives).
    categories: the categories to list (:data:`CATEGORIES`).
    base: a precision slip every slip stands on (a composition), or None.
    only: make this slip alone (its name, a base included: a campaign
      carries a site's answer to its later records), fitting no other
      constant.

  Returns:
    The :class:`~._variant.Variant` list, by category; empty where the
    kind has neither a family nor a reference.
  """
  if only is not None:
    base, own = split_name(only)
    cat = category_of(own)
    if cat is None:
      return []
    found = slip_variants(kind, args, kwargs, test, reference_fn,
                          categories=(cat,), base=base, _param=own)
    return [v for v in found if v.name == only]
  call = make_call(kind, args, kwargs)
  run = evaluator(call, reference_fn)
  if run is None:
    return []
  arrays = call.arrays if base is None else rounded(call, base)
  t = np.asarray(test, np.float64)
  make = {
      "operand": lambda: operand_variants(call, run, arrays, base),
      "blocked": lambda: blocked_variants(call, run, arrays, base),
      "accumulate": lambda: accumulate_variants(call, run, arrays, base),
      "approximation": lambda: approximation_variants(call, t, arrays, base),
      "constant": lambda: constant_variants(call, t, arrays, base, _param),
  }
  out = []
  for c in categories:
    out += make[c]()
  return out


_CATEGORY_ROWS = (
    ("operand", "indexing", "one array argument read in the wrong place "
     "before the golden computation: an axis reversed (one or two: a "
     "flipped filter), rolled by one, two axes of one length transposed, "
     "two arguments of one shape exchanged (scale and bias, gate and up, q "
     "and k), the first or last entry or the last partial tile along any "
     "axis read as zero or from its neighbour, attention's mask one key "
     "off", "every kind"),
    ("constant", "parameter", "a constant of the kernel refitted to the "
     "KUT's output on its range", "{constants}"),
    ("precision", "precision:<fmt>", "the inputs rounded to a format in a "
     "rounding mode (bf16, fp16, tf32 to nearest, toward zero, ties away; "
     "more where the error level calls for them)", "every kind"),
    ("accumulate", "accumulation:<fmt>", "the reduction summed in order "
     "in bf16 or fp16 (each term and partial sum rounded)",
     "dot_general, the normalizations, softmax, cross-entropy"),
    ("blocked", "indexing / scale", "the reduction in blocks of 8 to 128: "
     "the first or last (partial) block left out or counted twice "
     "(indexing); an online softmax that does not rescale its running sum "
     "or output when a block raises the max (scale)", "{reductions}"),
    ("approximation", "approximation", "a member of the library of known "
     "approximations in place of the exact function, or a class of them "
     "with its error function fitted", "{approximations}"),
    ("composition", "the slip's", "a slip on inputs rounded to a precision "
     "base (tried when no single slip explains)", "every kind"),
)


def grammar_table() -> str:
  """The Markdown table of the grammar's categories (docs/detector.md
  holds it, generated): what each perturbs, the model it names and the
  kinds it applies to."""
  constants = "; ".join(f"{k}: {', '.join(p)}"
                        for k, p in _core.PARAMETERS.items())
  reductions = ", ".join(_core.REDUCTION_AXES)
  approximations = "; ".join(
      f"`{n}` ({', '.join(kinds)})" for n, (kinds, _) in (
          list(_core.APPROXIMATIONS.items())
          + list(_core.APPROXIMATION_CLASSES.items())))
  fill = {"constants": constants, "reductions": reductions,
          "approximations": approximations}
  rows = ["| category | names | the slip | kinds |",
          "| --- | --- | --- | --- |"]
  for cat, model, what, kinds in _CATEGORY_ROWS:
    rows.append(f"| {cat} | `{model}` | {what} | {kinds.format(**fill)} |")
  return "\n".join(rows)
