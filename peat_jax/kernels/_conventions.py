"""The KUT calling convention of each site kernel, as data.

One table says, for every site kernel a ``py:`` KUT can replace, how a
site calls it: each argument's name, whether it is positional or keyword,
the form its value arrives in, when a site passes it and what a port must
assume when it does not; what the KUT returns; how the golden kernel
computes and against which float64 reference the noise ratio is taken.
Everything a user reads about a KUT's signature comes from here: the page
(docs/kernels.md, ``scripts/generated_docs.py``), the ``--kernel`` flag's
help, and the error a KUT that cannot take a site's arguments raises
(:func:`convention`). tests/kernels/test_conventions.py calls a KUT with
exactly these signatures at a real site of every kernel and checks every
argument's form there.

>>> print(signature("softmax"))
(x, *, axis=-1)
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import numpy as np

#: An argument without a default: every site passes it.
REQUIRED = inspect.Parameter.empty


class Form(NamedTuple):
  """The form an argument's value arrives in.

  Attributes:
    text: what the page says of it.
    check: ``value -> bool``, True when a value has this form (the
      signature test applies it at real sites).
  """

  text: str
  check: Callable[[Any], bool]


def _is_array(v) -> bool:
  return hasattr(v, "shape") and hasattr(v, "dtype")


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _int_tuple(v) -> bool:
  return isinstance(v, tuple) and all(_is_int(i) for i in v)


def _dot_numbers(v) -> bool:
  return (isinstance(v, tuple) and len(v) == 2
          and all(isinstance(p, tuple) and len(p) == 2
                  and all(_int_tuple(a) for a in p) for p in v))


def _conv_numbers(v) -> bool:
  from jax import lax  # pylint: disable=g-import-not-at-top
  return isinstance(v, lax.ConvDimensionNumbers) and all(
      _int_tuple(s) for s in v)


def _precision(v) -> bool:
  from jax import lax  # pylint: disable=g-import-not-at-top
  return v is None or isinstance(v, lax.DotAlgorithmPreset) or (
      isinstance(v, tuple) and len(v) == 2 and all(
          p is None or isinstance(p, lax.Precision) for p in v))


def _dtype_or_none(v) -> bool:
  if v is None:
    return True
  try:
    np.dtype(v)
  except TypeError:
    return False
  return True


def _sharding_or_none(v) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return v is None or isinstance(
      v, (jax.sharding.Sharding, jax.sharding.PartitionSpec))


FORMS: dict[str, Form] = {
    "array": Form("a jax array", _is_array),
    "array_or_none": Form("a jax array, or None",
                          lambda v: v is None or _is_array(v)),
    "float": Form("a Python float", lambda v: isinstance(v, float)),
    "axis": Form("a negative Python int (the axis counted from the end)",
                 lambda v: _is_int(v) and v < 0),
    "int": Form("a Python int", _is_int),
    "int_tuple": Form("a tuple of Python ints, one per spatial axis",
                      _int_tuple),
    "padding": Form(
        "explicit pairs: a tuple of `(low, high)` int tuples, one per "
        "spatial axis (never the string `'SAME'` or `'VALID'`: XLA has "
        "resolved them)",
        lambda v: isinstance(v, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 and _int_tuple(p)
            for p in v)),
    "dot_numbers": Form(
        "`((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))`, "
        "each a tuple of axis numbers", _dot_numbers),
    "conv_numbers": Form(
        "a `lax.ConvDimensionNumbers(lhs_spec, rhs_spec, out_spec)` of axis "
        "numbers: `lhs_spec` (batch, feature, spatial...), `rhs_spec` (out "
        "feature, in feature, spatial...), `out_spec` (batch, feature, "
        "spatial...); NHWC/HWIO reads `(0, 3, 1, 2)`, `(3, 2, 0, 1)`, "
        "`(0, 3, 1, 2)`", _conv_numbers),
    "precision": Form(
        "None (XLA's default for the device), a pair of `lax.Precision` (or "
        "None) for lhs and rhs, or a `lax.DotAlgorithmPreset` naming the "
        "operand and accumulation types (bf16 models: `BF16_BF16_F32`, bf16 "
        "operands summed in float32); pass it on to the `lax` call or "
        "honour what it names", _precision),
    "dtype_or_none": Form(
        "None (the operands' dtype), or the result dtype the call asks for "
        "(float32 from bf16 operands in a bf16 model)", _dtype_or_none),
    "sharding_or_none": Form(
        "None outside sharded code; else the result's sharding "
        "(`jax.sharding.Sharding`): a one-device port ignores it",
        _sharding_or_none),
    "true": Form("`True`", lambda v: v is True),
    "none_string": Form("the string `\"none\"`", lambda v: v == "none"),
    "labels": Form(
        "integer class indices of `logits.shape[:-1]` (optax's "
        "`softmax_cross_entropy` sites: float probabilities of logits' shape)",
        _is_array),
    "positions": Form("an int32 array `[length]`, each token's position",
                      lambda v: _is_array(v) and np.ndim(v) == 1 and np.issubdtype(
                          np.dtype(v.dtype), np.integer)),
}


class Arg(NamedTuple):
  """One argument of a KUT's signature.

  Attributes:
    name: the parameter's name in the documented signature.
    form: a key of :data:`FORMS`.
    keyword: keyword-only (after ``*``); else positional.
    default: :data:`REQUIRED`, or the value a port must assume when a site
      does not pass it.
    passed: when a site passes it; ``""`` for every call.
    meaning: what the argument means, where its name does not say it.
  """

  name: str
  form: str
  keyword: bool = False
  default: Any = REQUIRED
  passed: str = ""
  meaning: str = ""


class Convention(NamedTuple):
  """How every site of one kernel calls a ``py:`` KUT.

  Attributes:
    kernel: the site kernel (``--kernel``).
    args: the arguments, in signature order.
    returns: what the KUT returns.
    golden: how the golden kernel computes (dtypes of its parameters
      included) and the float64 reference the noise ratio is taken
      against.
    sites: which calls are sites of this kernel.
  """

  kernel: str
  args: tuple[Arg, ...]
  returns: str
  golden: str
  sites: str


_DOT_PARAMS = (
    Arg("dimension_numbers", "dot_numbers", keyword=True),
    Arg("precision", "precision", keyword=True),
    Arg("preferred_element_type", "dtype_or_none", keyword=True),
    Arg("out_sharding", "sharding_or_none", keyword=True),
)
_SOFTMAX_AXIS = Arg(
    "axis", "axis", keyword=True, default=-1,
    passed="only when the call normalizes another axis than the last",
    meaning="the normalized axis")
_NORM_SCALE = Arg("scale", "array_or_none", meaning=(
    "the layer's parameter as it is stored (float32 in a bf16 model); None "
    "when the layer has none"))
_REFERENCE = ("The noise ratio is the KUT's RMS error over the golden "
              "kernel's, both against the float64 {what} of the site's own "
              "inputs.")

CONVENTIONS: dict[str, Convention] = {c.kernel: c for c in (
    Convention(
        "dot_general",
        (Arg("lhs", "array"), Arg("rhs", "array")) + _DOT_PARAMS,
        "the primitive's result: `lax.dot_general(lhs, rhs, "
        "dimension_numbers, precision, preferred_element_type)`'s shape, in "
        "`preferred_element_type` (None: the operands' dtype)",
        "XLA's `dot_general` as it compiles for the device (on NVIDIA GPUs a "
        "float32 dot at DEFAULT precision may round its operands to TF32). "
        + _REFERENCE.format(what="contraction"),
        "every `dot_general` equation of the step (`@`, `jnp.einsum`, "
        "`nnx.Linear`...)"),
    Convention(
        "conv_general_dilated",
        (Arg("lhs", "array"), Arg("rhs", "array"),
         Arg("window_strides", "int_tuple", keyword=True),
         Arg("padding", "padding", keyword=True),
         Arg("lhs_dilation", "int_tuple", keyword=True),
         Arg("rhs_dilation", "int_tuple", keyword=True),
         Arg("dimension_numbers", "conv_numbers", keyword=True),
         Arg("feature_group_count", "int", keyword=True),
         Arg("batch_group_count", "int", keyword=True),
         Arg("precision", "precision", keyword=True),
         Arg("preferred_element_type", "dtype_or_none", keyword=True),
         Arg("out_sharding", "sharding_or_none", keyword=True)),
        "the primitive's result, as `lax.conv_general_dilated` with these "
        "arguments returns it",
        "XLA's convolution as it compiles for the device. "
        + _REFERENCE.format(what="convolution"),
        "every `conv_general_dilated` equation (`nnx.Conv`, "
        "`lax.conv_general_dilated`)"),
    Convention(
        "softmax", (Arg("x", "array"), _SOFTMAX_AXIS),
        "x's shape and dtype",
        "the call itself: `jax.nn.softmax` (in x's dtype), or the reference "
        "models' composite (float32 inside for 16-bit x, one rounding). "
        + _REFERENCE.format(what="softmax"),
        "`jax.nn.softmax` over one axis, `@peat.composite(\"softmax\")`"),
    Convention(
        "log_softmax", (Arg("x", "array"), _SOFTMAX_AXIS),
        "x's shape and dtype",
        "the call itself, `jax.nn.log_softmax` in x's dtype. "
        + _REFERENCE.format(what="log-softmax"),
        "`jax.nn.log_softmax` over one axis"),
    Convention(
        "layer_norm",
        (Arg("x", "array"),
         _NORM_SCALE,
         Arg("bias", "array_or_none", meaning="as scale"),
         Arg("eps", "float", meaning="the layer's epsilon, added to the "
             "variance")),
        "x's shape, in the site's output dtype: the layer's `dtype=`; "
        "without one, the promotion of x, scale and bias (float32 for bf16 "
        "x and float32 parameters)",
        "at `nnx.LayerNorm` sites: x, scale and bias first cast to the "
        "layer's `dtype` (bf16 in a bf16 layer: the float32 parameters are "
        "rounded to bf16), mean and variance in float32 as `E[x^2] - "
        "E[x]^2` (flax's `use_fast_variance`), the normalization, scale and "
        "bias applied in float32, one rounding to the output dtype; at the "
        "reference models' `layers.layer_norm`: a two-pass float32 "
        "variance, float32 scale and bias applied as they are, one rounding "
        "to x's dtype. " + _REFERENCE.format(
            what="`(x - mean) / sqrt(var + eps) * scale + bias`")
        + " The reference takes the float32 scale and bias as they arrive, "
        "not rounded to the layer's dtype: a port that applies them "
        "unrounded is closer to it than golden.",
        "`nnx.LayerNorm` over the last axis, `@peat.composite(\"layer_norm\")`"),
    Convention(
        "rms_norm",
        (Arg("x", "array"),
         _NORM_SCALE,
         Arg("eps", "float", meaning="the layer's epsilon, added to the "
             "mean square")),
        "x's shape, in the site's output dtype (the layer's `dtype=`, or "
        "the promotion of x and scale)",
        "at `nnx.RMSNorm` sites: x and scale first cast to the layer's "
        "`dtype` (the float32 scale rounded to bf16 in a bf16 layer), the "
        "mean square in float32, `x * rsqrt(ms + eps) * scale` in float32, "
        "one rounding. " + _REFERENCE.format(
            what="`x / sqrt(mean(x^2) + eps) * scale`")
        + " The reference takes the float32 scale as it arrives.",
        "`nnx.RMSNorm` over the last axis, `@peat.composite(\"rms_norm\")`"),
    Convention(
        "attention",
        (Arg("q", "array", meaning="`[batch, q_len, heads, head_dim]`"),
         Arg("k", "array", meaning="`[batch, kv_len, kv_heads, head_dim]`; "
             "`kv_heads` may divide `heads` (grouped-query attention: query "
             "head `j` reads kv head `j // (heads / kv_heads)`)"),
         Arg("v", "array", meaning="as k"),
         Arg("mask", "array_or_none", default=None,
             passed="positionally, only when the model passes one (the "
             "reference models pass theirs, None included)",
             meaning="boolean, broadcastable to `[batch, heads, q_len, "
             "kv_len]`, True keeps"),
         Arg("bias", "array", keyword=True, default=None,
             passed="only when the model passes one",
             meaning="added to the scores"),
         Arg("scale", "float", keyword=True, default=None,
             passed="only when the model passes one",
             meaning="the scores' factor; absent, the port must use "
             "`1 / sqrt(head_dim)`"),
         Arg("is_causal", "true", keyword=True, default=False,
             passed="only as `True`, at causal calls",
             meaning="query `i` sees keys `<= i`")),
        "q's shape with v's head_dim, in q's dtype",
        "the call itself: `jax.nn.dot_product_attention(implementation="
        "\"xla\")` or the reference models' einsum attention (scores in q's "
        "dtype, softmax float32 inside for 16-bit q). "
        + _REFERENCE.format(what="attention"),
        "`jax.nn.dot_product_attention` (also `nnx.MultiHeadAttention`'s), "
        "`@peat.composite(\"attention\")`"),
    Convention(
        "gelu",
        (Arg("x", "array"),
         Arg("approximate", "true", keyword=True, default=False,
             passed="only as `True`, at sites of the tanh form "
             "(`jax.nn.gelu`'s default); an erf-form site calls `kut(x)`",
             meaning="the tanh form; absent, the erf form `x * Phi(x)`")),
        "x's shape and dtype",
        "the call itself: `jax.nn.gelu` in x's dtype, or the reference "
        "models' erf form (float32 inside, one rounding). "
        + _REFERENCE.format(what="GELU of the same form"),
        "`jax.nn.gelu`, `@peat.composite(\"gelu\")`"),
    Convention(
        "cross_entropy",
        (Arg("logits", "array"), Arg("labels", "labels"),
         Arg("reduction", "none_string", keyword=True, default="mean",
             passed="at optax sites (`optax.softmax_cross_entropy"
             "[_with_integer_labels]`)",
             meaning="`\"none\"`: per-example losses; absent (the reference "
             "models' composite): their mean")),
        "the mean loss (a scalar) without `reduction`; per-example "
        "losses of `logits.shape[:-1]` with `reduction=\"none\"`",
        "the call itself: optax's losses in logits' dtype, or the reference "
        "models' mean of `-log_softmax(logits)[label]`. "
        + _REFERENCE.format(what="loss"),
        "`optax.softmax_cross_entropy[_with_integer_labels]` over the last "
        "axis, `@peat.composite(\"cross_entropy\")`"),
    Convention(
        "silu",
        (Arg("x", "array"),
         Arg("up", "array", default=None,
             passed="positionally, only at SwiGLU sites",
             meaning="the up projection (x is then the gate projection, "
             "same shape and dtype): return `silu(x) * up`")),
        "x's shape and dtype",
        "`jax.nn.silu` in x's dtype; the reference models' SwiGLU in float32 "
        "inside, one rounding. " + _REFERENCE.format(what="`x * sigmoid(x)` "
                                                     "(times up)"),
        "`jax.nn.silu` / `jax.nn.swish`, `@peat.composite(\"silu\")`"),
    Convention(
        "rope",
        (Arg("x", "array", meaning="`[batch, length, heads, head_dim]`, "
             "head_dim even"),
         Arg("positions", "positions"),
         Arg("theta", "float", default=10000.0,
             passed="as the model passes it (the reference llama: "
             "positionally)",
             meaning="the rotary base")),
        "x's shape and dtype",
        "the two halves rotated (GPT-NeoX / Llama-HF layout): `h = D/2`, "
        "`inv_freq[i] = theta**(-2i/D)`, `angle = positions[:, None] * "
        "inv_freq`, `out[..., :h] = x1 cos - x2 sin`, `out[..., h:] = x2 cos "
        "+ x1 sin`, in float32, one rounding to x's dtype. "
        + _REFERENCE.format(what="rotation"),
        "`@peat.composite(\"rope\")` (no standard JAX function to "
        "recognize)"),
)}

#: The site kernels with a calling convention (``--kernel``), in the
#: order the pages list them.
SITE_KERNELS: tuple[str, ...] = tuple(CONVENTIONS)


def signature(kernel: str) -> inspect.Signature:
  """The Python signature a ``py:`` KUT of ``kernel`` is written with.

  Args:
    kernel: a site kernel of :data:`SITE_KERNELS`.

  Returns:
    The signature with the documented names, kinds and defaults.

  Raises:
    KeyError: an unknown kernel.
  """
  kinds = inspect.Parameter
  return inspect.Signature([
      inspect.Parameter(a.name, kinds.KEYWORD_ONLY if a.keyword
                        else kinds.POSITIONAL_OR_KEYWORD, default=a.default)
      for a in CONVENTIONS[kernel].args])


def convention(kernel: str) -> str:
  """The KUT signature of a site kernel, for messages and help.

  Args:
    kernel: any kernel name (one without a convention gets the primitive's
      generic one).

  Returns:
    ``kut(...)`` with what arrives when, in one line.
  """
  c = CONVENTIONS.get(kernel)
  if c is None:
    return (f"kut(*operands, **params) with lax.{kernel}'s operands and "
            "parameters (a composite: the marked function's arguments)")
  optional = [f"{a.name} {a.passed}" for a in c.args if a.passed]
  text = (f"kut{signature(kernel)} -> {c.returns}"
          + (f"; passed: {'; '.join(optional)}" if optional else ""))
  return text.replace("`", "")


def check_call(kernel: str, args: tuple, kwargs: dict) -> list[str]:
  """What in one site's call disagrees with the documented convention.

  Args:
    kernel: the site kernel.
    args: the positional arguments the site passed.
    kwargs: its keyword arguments.

  Returns:
    One line per disagreement (an argument the signature cannot take, one
    passed at every call that is missing, a value of another form); empty
    when the call is as documented.
  """
  c = CONVENTIONS[kernel]
  try:
    bound = signature(kernel).bind(*args, **kwargs)
  except TypeError as err:
    return [f"{kernel}: the call cannot bind to kut{signature(kernel)}: {err}"]
  problems = []
  by_name = {a.name: a for a in c.args}
  for a in c.args:
    if not a.passed and a.default is REQUIRED:
      continue
    if not a.passed and a.name not in bound.arguments:
      problems.append(f"{kernel}: {a.name} is documented as passed at every "
                      "call but was not")
  for name, value in bound.arguments.items():
    form = FORMS[by_name[name].form]
    ok = form.check(value) or (value is None and by_name[name].default is None)
    if not ok:
      problems.append(f"{kernel}: {name} arrived as {value!r} "
                      f"({type(value).__name__}); documented: {form.text}")
  return problems


def _call(kernel: str) -> str:
  return f"`kut{signature(kernel)}`"


def signature_table() -> str:
  """The signature of every site kernel as a markdown table (the pages)."""
  rows = ["| `--kernel` | a `py:` KUT is written as | it returns | its sites |",
          "| --- | --- | --- | --- |"]
  for k, c in CONVENTIONS.items():
    rows.append(f"| `{k}` | {_call(k)} | {c.returns} | {c.sites} |")
  return "\n".join(rows)


def _argument_line(a: Arg) -> str:
  text = f"* `{a.name}`: {FORMS[a.form].text}"
  if a.meaning:
    text += f"; {a.meaning}"
  if a.passed:
    shown = "None" if a.default is None else repr(a.default)
    text += f". Passed {a.passed}; absent: `{a.name}={shown}`"
  else:
    text += ". Passed at every call"
  return text + "."


def arguments_section() -> str:
  """Each site kernel's arguments, their forms, when a site passes them,
  and how the golden kernel computes (docs/kernels.md)."""
  out = []
  for k, c in CONVENTIONS.items():
    out += [f"#### `{k}`", "", _call(k), ""]
    out += [_argument_line(a) for a in c.args]
    out += [f"* Returns {c.returns}.", f"* Golden: {c.golden}", ""]
  return "\n".join(out).rstrip("\n")
