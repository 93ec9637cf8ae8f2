"""The slip grammar's vocabulary: one perturbation of a golden computation.

A port slip is a small change of the golden kernel's computation that a
kernel engineer makes in one place and fixes in one place: a filter read
backwards, scale and bias exchanged, a loop bound one short, another
epsilon, inputs rounded to a narrower format, a reduction block left out,
an online softmax that forgets to rescale, a fast ``exp``. The Detector
searches slips (``peat_jax.analyzer.slips``, in float64) to explain a
record; the injectors make them at working precision
(``peat_jax.injectors.slipped_kernel``) to test that search. Both read
this one description of a slip, :class:`Slip`, and name it alike.

Categories, their ops and the error model each names:

* ``operand`` (``indexing``): one array argument of the call (``arg``:
  its index among the call's array arguments, in call order) transformed
  before the golden kernel runs:

  - ``reverse`` along ``axes`` (one or two axes: a flipped filter);
  - ``transpose``: the two ``axes``, of equal length, exchanged;
  - ``roll`` by ``shift`` (+1 or -1) along ``axes[0]`` (``np.roll``);
  - ``swap``: the argument and argument ``other`` (same shape and dtype:
    scale and bias, gate and up, q and k) exchanged;
  - ``drop``: the ``where`` (``first`` or ``last``) tile of ``width``
    entries along ``axes[0]`` read as zero (``width`` 1: an element, row
    or column; the last tile of a length ``L`` starts at
    ``width * ((L - 1) // width)``: the partial tile when ``L % width``);
  - ``repeat``: that tile holds its neighbour's entries (the first tile
    reads the next tile, the last tile the tile before it, same offsets);
  - ``mask_shift``: attention's mask one key off: query ``i`` sees what
    query ``i + shift`` may see (the causal diagonal moved by ``shift``;
    a mask argument read at the query ``i + shift``, clamped at the
    edges).

* ``constant`` (``parameter``): the kernel with its constant ``param``
  set to ``value`` (:data:`PARAMETERS` lists each kind's).

* ``precision`` (``precision:<fmt>`` / ``accumulation:<fmt>``):
  ``inputs``: every floating argument rounded to ``fmt`` in ``mode``
  (``nearest_even``, ``toward_zero``, ``nearest_away``) before the kernel;
  ``accumulate``: the kernel's reduction (:data:`REDUCTION_AXES`) summed
  in order in ``fmt``, each term and each partial sum rounded to nearest.

* ``blocked`` (``indexing``; ``norescale``: ``scale``): the kernel's
  reduction computed in blocks of ``width`` along its axis, and
  ``drop``: the ``where`` block's terms left out (the last block: the
  partial one when the length is no multiple of ``width``); ``twice``:
  counted twice; ``norescale``: an online softmax over the blocks, in
  order, that does not multiply what it carries by ``exp(m_old -
  m_new)`` when a block raises the running max (``where``: ``sum``, the
  running sum; ``acc``, attention's running output; ``both``).

* ``approximation`` (``approximation``): a member ``op`` of the library
  of known approximations (:data:`APPROXIMATIONS`) in place of the exact
  function inside the kernel.

A slip may stand on a ``base`` (a ``precision`` slip applied first: a
port on TF32 operands that also drops its last term).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from peat_jax.core._errors import PeatError

#: Each category's ops.
SLIP_OPS = {
    "operand": ("reverse", "transpose", "roll", "swap", "drop", "repeat",
                "mask_shift"),
    "constant": ("set",),
    "precision": ("inputs", "accumulate"),
    "blocked": ("drop", "twice", "norescale"),
    "approximation": (),  # the library's members: APPROXIMATIONS
}

#: Each kind's constants: name -> what it is (the golden value is the
#: call's own, or the default named here).
PARAMETERS = {
    "layer_norm": {"eps": "the epsilon added to the variance (the call's)",
                   "ddof": "the variance divided by n - ddof (0)"},
    "rms_norm": {"eps": "the epsilon added to the mean of squares (the "
                        "call's)",
                 "ddof": "the mean of squares divided by n - ddof (0)",
                 "offset": "the output times offset + scale (0)"},
    "softmax": {"temperature": "the logits divided by it (1)"},
    "log_softmax": {"temperature": "the logits divided by it (1)"},
    "attention": {"scale": "the scores' factor (the call's, or "
                           "1/sqrt(head_dim))",
                  "fill": "the score a masked key gets (the format's "
                          "lowest, as jax fills)"},
    "cross_entropy": {"smoothing": "label smoothing alpha: (1 - alpha) "
                                   "nll + alpha mean_c(-log p_c) (0)",
                      "temperature": "the logits divided by it (1)"},
    "silu": {"beta": "x * sigmoid(beta x) (1)"},
    "rope": {"theta": "the rotary base (the call's)",
             "offset": "the positions plus offset (0, an integer)"},
}

#: Each kind's reduction for ``accumulate`` and ``blocked`` slips: the
#: axis it runs along.
REDUCTION_AXES = {
    "dot_general": "the last contracting dimension",
    "conv_general_dilated": "the input-feature dimension",
    "softmax": "the normalized axis (the sum of exponentials)",
    "log_softmax": "the normalized axis (the sum of exponentials)",
    "cross_entropy": "the class axis (the sum of exponentials)",
    "layer_norm": "the last axis (the mean and the variance)",
    "rms_norm": "the last axis (the mean of squares)",
    "attention": "the key axis (the softmax over keys and the weighted "
                 "sum of values)",
}
#: The kinds whose reduction is a softmax's (``norescale`` applies).
ONLINE_SOFTMAX_KINDS = ("softmax", "log_softmax", "cross_entropy",
                        "attention")

#: The library of known approximations: name -> (the kinds it applies
#: to, what it is). An ``approximation`` slip is one of these; no other
#: dense error is named ``approximation``.
APPROXIMATIONS = {
    "gelu_tanh": (("gelu",), "GELU's tanh form 0.5 x (1 + tanh(sqrt(2/pi) "
                  "(x + 0.044715 x^3))) for the erf form"),
    "gelu_erf": (("gelu",), "GELU's erf form for the tanh form"),
    "gelu_sigmoid": (("gelu",), "GELU as x sigmoid(1.702 x)"),
    "erf_poly": (("gelu",), "erf by Abramowitz-Stegun 7.1.26 (a degree-5 "
                 "polynomial in 1/(1 + 0.3275911 |x|) times exp(-x^2))"),
    "silu_hard": (("silu",), "hard swish x relu6(x + 3) / 6 for x "
                  "sigmoid(x)"),
    "exp_schraudolph": (("softmax", "log_softmax", "attention",
                         "cross_entropy", "silu"),
                        "exp by Schraudolph's bit trick (the float32 bits "
                        "of 2^23 (x / ln 2 + 127 - 0.0579848...) )"),
    "exp_poly3": (("softmax", "log_softmax", "attention", "cross_entropy",
                   "silu"),
                  "exp as 2^n 2^f, n = floor(x / ln 2), 2^f by the cubic "
                  "1 + f (0.6960656 + f (0.2244012 + f 0.0795332))"),
    "exp_table64": (("softmax", "log_softmax", "attention",
                     "cross_entropy", "silu"),
                    "exp as 2^n times 2^(k/64) from a 65-entry table, "
                    "linearly interpolated"),
    "rsqrt_newton1": (("layer_norm", "rms_norm"),
                      "1/sqrt(v) by the bit trick 0x5f3759df - (bits >> 1) "
                      "and one Newton step"),
    "rcp_newton1": (("softmax", "log_softmax", "attention"),
                    "1/s by the bit trick 0x7ef311c7 - bits and one Newton "
                    "step"),
}

#: The library's classes: a member's relatives with other constants, whose
#: error function the Detector fits to the KUT's output (it names them; a
#: slip drawn for a test is a member).
APPROXIMATION_CLASSES = {
    "exp_fitted": (("softmax", "log_softmax"), "exp as 2^n times any "
                   "approximation of 2^f (polynomial, table, bit trick), "
                   "its relative error a function of the fraction f"),
    "rsqrt_fitted": (("layer_norm", "rms_norm"), "1/sqrt by a bit trick or "
                     "table and Newton steps, its relative error a function "
                     "of the argument's significand and exponent parity"),
    "rcp_fitted": (("softmax",), "1/x by a bit trick or table and Newton "
                   "steps, its relative error a function of the argument's "
                   "significand"),
}

#: The rounding modes of ``inputs`` slips.
SLIP_MODES = ("nearest_even", "toward_zero", "nearest_away")
#: Tile widths of ``drop``/``repeat`` tiles and reduction blocks.
TILE_LATTICE = (8, 16, 32, 64, 128)


class Slip(NamedTuple):
  """One slip of the grammar (module doc): what is perturbed and how.

  Attributes:
    category: ``operand``, ``constant``, ``precision``, ``blocked`` or
      ``approximation``.
    op: the category's op (:data:`SLIP_OPS`), or the library member's name.
    arg: ``operand``: the array argument's index (call order).
    axes: ``operand``: the axes (``reverse``: one or two; ``transpose``:
      two; ``roll``, ``drop``, ``repeat``: one).
    where: ``first`` / ``last`` (``drop``, ``repeat``, blocked ``drop``
      and ``twice``); ``sum`` / ``acc`` / ``both`` (``norescale``).
    width: a tile or block width (``drop``, ``repeat``, ``blocked``).
    shift: +1 or -1 (``roll``, ``mask_shift``).
    other: ``swap``: the other argument's index.
    param: ``constant``: the parameter's name (:data:`PARAMETERS`).
    value: ``constant``: its value.
    fmt: ``precision``: the format (``tf32``, ``bf16``, ``fp16``, ...).
    mode: ``precision`` ``inputs``: the rounding mode.
    base: a ``precision`` slip applied first, or None.
  """

  category: str
  op: str
  arg: int = -1
  axes: tuple = ()
  where: str = ""
  width: int = 0
  shift: int = 0
  other: int = -1
  param: str = ""
  value: float = math.nan
  fmt: str = ""
  mode: str = ""
  base: "Slip | None" = None

  @property
  def model(self) -> str:
    """The error model the slip names."""
    if self.category == "operand":
      return "indexing"
    if self.category == "constant":
      return "parameter"
    if self.category == "precision":
      fam = "precision" if self.op == "inputs" else "accumulation"
      return f"{fam}:{self.fmt}"
    if self.category == "blocked":
      return "scale" if self.op == "norescale" else "indexing"
    return "approximation"

  @property
  def name(self) -> str:
    """A stable name: the same slip gets the same name at any shape, so
    a campaign carries a site's answer to its later records (a constant's
    value is refitted there, not named): ``inputs_tf32``,
    ``inputs_tf32_toward_zero``, ``acc_bf16``, ``eps``, ``gelu_tanh``,
    ``blocked:drop:last:w32``, ``operand:reverse:1:0,1``; a slip on a base
    joins the two with ``+``."""
    own = self._own_name()
    return own if self.base is None else f"{self.base.name}+{own}"

  def _own_name(self) -> str:
    c, op = self.category, self.op
    if c == "precision" and op == "inputs":
      mode = "" if self.mode in ("", "nearest_even") else f"_{self.mode}"
      return f"inputs_{self.fmt}{mode}"
    if c == "precision":
      return f"acc_{self.fmt}"
    if c == "constant":
      return self.param
    if c == "approximation":
      return op
    if c == "blocked":
      at = self.where
      return f"blocked:{op}:{at}:w{self.width}"
    axes = ",".join(str(a) for a in self.axes)
    if op == "swap":
      return f"operand:swap:{self.arg},{self.other}"
    if op == "mask_shift":
      return f"operand:mask_shift:{self.shift:+d}"
    if op == "roll":
      return f"operand:roll:{self.arg}:{axes}:{self.shift:+d}"
    if op in ("drop", "repeat"):
      return f"operand:{op}:{self.arg}:{axes}:{self.where}:w{self.width}"
    return f"operand:{op}:{self.arg}:{axes}"


def check_slip(slip: Slip) -> Slip:
  """Validates a slip's category, op and the fields its op needs.

  Args:
    slip: the slip.

  Returns:
    ``slip``.

  Raises:
    PeatError: an unknown category, op, library member or parameter, or a
      field its op needs is missing.
  """
  cat, op = slip.category, slip.op
  if cat not in SLIP_OPS:
    raise PeatError(f"unknown slip category {cat!r}; expected one of "
                    f"{', '.join(SLIP_OPS)}")
  known = (tuple(APPROXIMATIONS) + tuple(APPROXIMATION_CLASSES)
           if cat == "approximation" else SLIP_OPS[cat])
  if op not in known:
    raise PeatError(f"unknown {cat} slip {op!r}; expected one of "
                    f"{', '.join(known)}")
  need = []
  if cat == "operand" and op != "mask_shift" and slip.arg < 0:
    need.append("arg")
  if op in ("reverse", "transpose", "roll", "drop", "repeat") and (
      cat == "operand" and not slip.axes):
    need.append("axes")
  if op == "swap" and slip.other < 0:
    need.append("other")
  if op in ("roll", "mask_shift") and slip.shift not in (-1, 1):
    need.append("shift (+1 or -1)")
  if op in ("drop", "repeat", "twice") and slip.where not in (
      "first", "last"):
    need.append("where (first or last)")
  if (op in ("drop", "repeat") or cat == "blocked") and slip.width < 1:
    need.append("width")
  if op == "norescale" and slip.where not in ("sum", "acc", "both"):
    need.append("where (sum, acc or both)")
  if cat == "constant" and not slip.param:
    need.append("param")
  if cat == "precision" and not slip.fmt:
    need.append("fmt")
  if need:
    raise PeatError(f"slip {slip.category}:{slip.op} needs "
                    f"{', '.join(need)}; got {slip!r}")
  if slip.base is not None and slip.base.category != "precision":
    raise PeatError(f"a slip's base is a precision slip; got "
                    f"{slip.base.category}:{slip.base.op}")
  return slip
