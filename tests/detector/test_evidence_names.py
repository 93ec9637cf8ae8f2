"""No name contradicts its evidence.

Every diagnosis's evidence sentence is read against its error model's
definition (shared/DESIGN.md's table): ``approximation`` names a known
approximation and never "another function"; ``unknown`` says nothing
explains it and never that it is a closed form of the same function;
``indexing`` says where values were read; ``parameter`` names a constant;
``scale`` a factor; ``precision:<fmt>`` and ``accumulation:<fmt>`` their
format; every fault its own trace; and wherever the KUT has NaN or Inf
that golden does not, the evidence says so, whatever the name.

The diagnoses come from ports with a slip (the grammar's search, with the
call's inputs), correct ports, output-only injections (no inputs) and
wrong formulas, float32 and bf16.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import peat_jax as peat
from peat_jax.kernels import ports

#: family -> (a pattern the evidence must match, one it must not).
DEFINITIONS = {
    "exact": (r"bitwise|equal", None),
    "reordering": (r"order|rounding|envelope|noise", None),
    "precision": (r"{fmt}", None),
    "accumulation": (r"{fmt}", None),
    "truncation": (r"toward zero|truncat|one-sided|shrink", None),
    "ftz": (r"flush|subnormal|tiny|zero", None),
    "saturation": (r"clip|saturat|max|overflow|inf", None),
    "bitflip": (r"bit|flip", None),
    "stuck_at": (r"stuck|bit", None),
    "random_value": (r"random|replaced|value", None),
    "zero": (r"zero|are 0 |missed write", None),
    "nan": (r"nan|inf", None),
    "lane": (r"lane|stride|tile|period", None),
    "indexing": (r"shift|transpos|permut|moved|exchanged|flipped|backwards|"
                 r"rolled|read as zero|neighbour|tile|mask|group|layout|"
                 r"left out|counted twice|interleaved|place|edge", None),
    "scale": (r"scale|factor|rescale|t = [-+0-9.e]+ r\b", None),
    "parameter": (r"eps|temperature|scale|smoothing|theta|base|offset|"
                  r"divided|variance|fill|constant|beta|mean|1/sqrt", None),
    "approximation": (r"approximation|approximate|tanh|sigmoid|hard swish|"
                      r"bit trick|table|polynomial|cubic|fast",
                      r"another function|wrong formula"),
    "unknown": (r"no (error model|slip)|beyond every known|not explain|"
                r"nothing explains|explains it",
                r"closed form of the same function"),
    "nondeterminism": (r"identical inputs|differ", None),
}


def contradiction(model: str, evidence: str) -> str | None:
  """Why ``evidence`` contradicts ``model``'s definition (None: it does
  not)."""
  fam, _, fmt = model.partition(":")
  must, never = DEFINITIONS[fam]
  text = evidence.lower()
  if not re.search(must.format(fmt=re.escape(fmt)), text):
    return f"{model}: the evidence never says {must.format(fmt=fmt)!r}"
  if never and re.search(never, text):
    return f"{model}: the evidence says {never!r}"
  return None


def _nonfinite_said(diag, sig) -> bool:
  n = int(np.asarray(sig.n_nonfinite_mismatch))
  return n == 0 or bool(re.search(r"nan|inf", diag.evidence.lower()))


def _ln(x, s, b, eps):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) * jax.lax.rsqrt(v + eps) * s + b


def _port_cases(dtype):
  """(name, kind, args, kwargs, golden fn, kut fn) of ports: slips,
  wrong formulas and correct ones."""
  rng = np.random.default_rng(11)
  cast = lambda a: jnp.asarray(a, dtype)
  x = cast(rng.normal(size=(48, 96)) * 1.3)
  s = cast(1 + 0.1 * rng.normal(size=96))
  b = cast(0.1 * rng.normal(size=96))
  a, w = cast(rng.normal(size=(40, 72))), cast(rng.normal(size=(72, 24)))
  dn = (((1,), (0,)), ((), ()))
  dot = functools.partial(jax.lax.dot_general, dimension_numbers=dn,
                          preferred_element_type=jnp.float32)
  dkw = {"dimension_numbers": dn, "precision": None,
         "preferred_element_type": jnp.float32}
  return [
      ("ln swapped", "layer_norm", (x, s, b), {"eps": 1e-6}, _ln,
       lambda x, s, b, eps: _ln(x, b, s, eps)),
      ("ln fast rsqrt", "layer_norm", (x, s, b), {"eps": 1e-6}, _ln,
       lambda x, s, b, eps: ports.layer_norm_fast_rsqrt(x, s, b, eps)),
      ("ln correct", "layer_norm", (x, s, b), {"eps": 1e-6}, _ln,
       lambda x, s, b, eps: _ln(x.astype(jnp.float32), s, b, eps
                                ).astype(x.dtype)),
      ("softmax fast exp", "softmax", (x,), {}, jax.nn.softmax,
       ports.softmax_fast_exp),
      ("softmax as sigmoid", "softmax", (x,), {}, jax.nn.softmax,
       jax.nn.sigmoid),
      ("gelu tanh", "gelu", (x,), {}, lambda v: jax.nn.gelu(v, False),
       ports.gelu_tanh),
      ("gelu for silu", "silu", (x,), {}, jax.nn.silu,
       lambda v: jax.nn.gelu(v, True)),
      ("dot drop last", "dot_general", (a, w), dkw,
       lambda p, q, **k: dot(p, q),
       lambda p, q, **k: dot(p[:, :-1], q[:-1])),
      ("dot correct", "dot_general", (a, w), dkw, lambda p, q, **k: dot(p, q),
       lambda p, q, **k: ports.dot_general_split_k_edge(p, q, **k)),
  ]


@pytest.mark.parametrize("dtype", [
    jnp.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)],
                         ids=["float32", "bfloat16"])
def test_port_diagnoses_never_contradict_their_names(dtype):
  bad = []
  for name, kind, args, kwargs, golden, kut in _port_cases(dtype):
    g, t = golden(*args, **kwargs), kut(*args, **kwargs)
    diag = peat.detector.diagnose_call(kind, args, kwargs, t, g)
    for model, evidence in [(diag.model, diag.evidence)] + (
        [(diag.secondary.model, diag.secondary.evidence)]
        if diag.secondary is not None else []):
      why = contradiction(model, evidence)
      if why:
        bad.append(f"{name}: {why}: {evidence[:200]}")
  assert not bad, "\n".join(bad)


#: Output-only injections (no inputs): (model, params); bits counted
#: down from the sign bit (an exponent bit, a high mantissa bit).
INJECTIONS = [
    ("bitflip", {"count": 3, "bits": (-5,)}),
    ("stuck_at", {"bit": -11, "value": 1, "share": 0.3}),
    ("random_value", {"count": 5}), ("zero", {"mode": "rows", "count": 1}),
    ("nan", {"count": 2}), ("scale", {"factor": 1.5}),
    ("indexing", {"mode": "shift", "shift": 1}),
    ("lane", {"stride": 32, "lane": 3, "axis": -1, "effect": "zero"}),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["float32", "bfloat16"])
def test_output_only_diagnoses_never_contradict_their_names(dtype):
  rng = np.random.default_rng(5)
  a = rng.normal(size=(64, 80))
  w = rng.normal(size=(80, 96))
  r = a @ w
  g = jnp.asarray(r, jnp.float32).astype(dtype)
  bad = []
  width = 8 * jnp.dtype(dtype).itemsize
  for k, (model, params) in enumerate(INJECTIONS):
    if "bits" in params:
      params = {**params, "bits": tuple(width + b for b in params["bits"])}
    if "bit" in params:
      params = {**params, "bit": width + params["bit"]}
    t = peat.inject(model, jax.random.PRNGKey(k), g, **params)
    sig = peat.analyze(t, g, reference=r)
    diag = peat.detect(sig, context={"kernel": "dot_general",
                                     "reduction": 80})
    why = contradiction(diag.model, diag.evidence)
    if why:
      bad.append(f"{model}: {why}: {diag.evidence[:200]}")
    if not _nonfinite_said(diag, sig):
      bad.append(f"{model}: {diag.model} says no word of NaN/Inf: "
                 f"{diag.evidence[:200]}")
  assert not bad, "\n".join(bad)


@pytest.mark.parametrize("model,evidence", [
    ("approximation", "another function (beyond any closed form of this one: "
     "a wrong formula)"),
    ("unknown", "another closed form of the same function"),
    ("indexing", "a dense error beyond rounding"),
    ("precision:tf32", "inputs rounded to bf16")])
def test_the_check_catches_a_contradiction(model, evidence):
  assert contradiction(model, evidence) is not None
