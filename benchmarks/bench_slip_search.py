"""What the slip search costs: per flagged record, and in a whole validate.

Usage::

  python benchmarks/bench_slip_search.py [--part=records,validate]
      [--before=/tmp/before] [--json=out.json]

``records``: the port probe (``peat.analyzer.port_probe``: the grammar's
search, the input precisions, the kind's own forms) on one flagged record
of each kind at the shapes of the built-in scenarios' sites and at larger
ones, each with a slip of the grammar in the KUT's output (written here
as JAX code, not with the grammar): the seconds of its first call in the
process (NumPy and the float64 references' first dispatches included)
and of a second call on the same shapes, the slips searched, and what it
named. No compilation of the Analyzer is counted: the probe alone is
timed.

``validate``: ``peat-validate`` on GPT with a KUT whose every
``dot_general`` drops the last term of its contraction (every one of
the 13 sites flagged at every checkpoint), in fresh processes one after
the other, on this tree and on the tree at ``--before`` (a checkout of
the commit before the grammar, run with ``PYTHONPATH``), each into its
own empty compilation cache, then again with that cache warm: the wall
times, their ratio, and the records' names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

import peat_jax as peat

_PART = flags.DEFINE_list("part", ["records", "validate"],
                          "records, validate.")
_BEFORE = flags.DEFINE_string("before", "/tmp/before",
                              "A checkout of the commit before the grammar "
                              "(empty: skip that side).")
_JSON = flags.DEFINE_string("json", "", "Also write the figures here.")

HERE = os.path.dirname(os.path.abspath(__file__))
KUT_DIR = os.path.join(HERE, "slips")


def _f32(rng, shape, scale=1.0):
  return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def _ln(x, s, b, eps=1e-6):
  m = x.mean(-1, keepdims=True)
  v = ((x - m) ** 2).mean(-1, keepdims=True)
  return (x - m) * lax.rsqrt(v + eps) * s + b


def _online_softmax(x, block=32):
  """A softmax over blocks that does not rescale its running sum."""
  m = jnp.full(x.shape[:-1], -jnp.inf)
  s = jnp.zeros(x.shape[:-1])
  for lo in range(0, x.shape[-1], block):
    blk = x[..., lo:lo + block]
    new = jnp.maximum(m, blk.max(-1))
    s = s + jnp.exp(blk - new[..., None]).sum(-1)
    m = new
  return jnp.exp(x - m[..., None]) / s[..., None]


def _cases(rng):
  """(label, kind, args, kwargs, golden fn, kut fn)."""
  out = []
  for rows, d in ((16 * 64, 128), (8 * 256, 512)):
    x, s, b = _f32(rng, (rows, d)), 1 + 0.1 * _f32(rng, (d,)), 0.1 * _f32(
        rng, (d,))
    out.append((f"layer_norm [{rows},{d}] scale/bias swapped", "layer_norm",
                (x, s, b), {"eps": 1e-6}, _ln,
                lambda x, s, b, eps: _ln(x, b, s, eps)))
  for m, k, n in ((1024, 128, 512), (2048, 512, 2048)):
    a, w = _f32(rng, (m, k)), _f32(rng, (k, n))
    dn = (((1,), (0,)), ((), ()))
    kw = {"dimension_numbers": dn, "precision": None,
          "preferred_element_type": jnp.float32}
    out.append((f"dot_general [{m},{k}]x[{k},{n}] last term dropped",
                "dot_general", (a, w), kw,
                lambda a, w, dn=dn, **_: lax.dot_general(a, w, dn),
                lambda a, w, dn=dn, **_: lax.dot_general(a[:, :-1], w[:-1],
                                                         dn)))
  for b, t, h, d in ((16, 64, 4, 32), (8, 256, 8, 64)):
    q, k, v = (_f32(rng, (b, t, h, d)) for _ in range(3))
    mask = jnp.tril(jnp.ones((t, t), bool), 1)[None, None]
    out.append((f"attention [{b},{t},{h},{d}] causal mask one key off",
                "attention", (q, k, v), {"is_causal": True},
                lambda q, k, v, is_causal: jax.nn.dot_product_attention(
                    q, k, v, is_causal=True),
                lambda q, k, v, is_causal, mask=mask:
                jax.nn.dot_product_attention(q, k, v, mask=mask)))
  for rows, d in ((16 * 4 * 64, 64), (8 * 8 * 256, 256)):
    x = _f32(rng, (rows, d), 2.0)
    out.append((f"softmax [{rows},{d}] online, not rescaled", "softmax",
                (x,), {}, jax.nn.softmax, _online_softmax))
  x = _f32(rng, (64, 12, 12, 16))
  w = _f32(rng, (3, 3, 16, 32))
  cdn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
  ckw = {"window_strides": (1, 1), "padding": ((1, 1), (1, 1)),
         "lhs_dilation": (1, 1), "rhs_dilation": (1, 1),
         "dimension_numbers": cdn, "feature_group_count": 1,
         "batch_group_count": 1, "precision": None,
         "preferred_element_type": None}
  conv = lambda x, w, **_: lax.conv_general_dilated(
      x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=cdn)
  out.append(("conv [64,12,12,16]*[3,3,16,32] filter flipped",
              "conv_general_dilated", (x, w), ckw, conv,
              lambda x, w, **_: conv(x, w[::-1, ::-1])))
  return out


def _reference(kind, kwargs):
  if kind == "dot_general":
    return lambda a, b: peat.reference_dot_general(
        a, b, kwargs["dimension_numbers"])
  if kind == "conv_general_dilated":
    return lambda x, w: peat.reference_conv(
        x, w, kwargs["window_strides"], kwargs["padding"],
        dimension_numbers=kwargs["dimension_numbers"])
  fn = peat.analyzer.TRACED_REFERENCES[kind]
  return lambda *a: peat.reference(lambda *b: fn(*b, **kwargs), *a)


def records() -> list[dict]:
  """The probe's seconds on one flagged record per case."""
  rng = np.random.default_rng(0)
  out = []
  for label, kind, args, kwargs, golden, kut in _cases(rng):
    g, t = golden(*args, **kwargs), kut(*args, **kwargs)
    ref = _reference(kind, kwargs)
    r = ref(*args)
    secs = []
    for _ in range(2):
      t0 = time.perf_counter()
      found = peat.analyzer.port_probe(kind, args, kwargs, t, g, r,
                                       reference_fn=ref, signature=False)
      secs.append(time.perf_counter() - t0)
    row = {"case": label, "kind": kind, "outputs": int(np.size(g)),
           "first_s": secs[0], "again_s": secs[1],
           "searched": sum(found.get("searched", {}).values()) + len(
               found.get("tried", [])),
           "named": f"{found['model']} ({found['name']})",
           "explains": bool(found["explains"])}
    print(f"  {label}: {secs[0]:.2f} s first, {secs[1]:.2f} s again, "
          f"{row['searched']} hypotheses, {row['named']}", flush=True)
    out.append(row)
  return out


def _validate(tree: str | None, cache: str, camp: str) -> dict:
  env = dict(os.environ)
  env["PEAT_JAX_COMPILATION_CACHE"] = cache
  env["PYTHONPATH"] = os.pathsep.join(
      ([tree] if tree else []) + [KUT_DIR])
  cmd = [sys.executable, "-m", "peat_jax.tools.validate", "--scenario=gpt",
         "--kut=py:slip_kuts:dot_drop_last", "--kernel=dot_general",
         "--steps=20", "--checkpoint_every=10", "--frequencies=every",
         f"--campaign_dir={camp}"]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                        check=False, cwd=tree or os.path.dirname(HERE))
  wall = time.perf_counter() - t0
  if proc.returncode not in (0, 1):
    raise RuntimeError(f"validate failed ({proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")
  res = peat.read_campaign(camp)
  names = sorted({f"{r.model}" for r in res.playback})
  return {"wall_s": wall, "verdict": res.verdict.verdict
          if hasattr(res.verdict, "verdict") else str(res.verdict),
          "models": names}


def validate() -> dict:
  """A whole validate on this tree and on ``--before``'s, cold and warm."""
  out = {}
  sides = [("after", None)] + ([("before", _BEFORE.value)]
                               if _BEFORE.value else [])
  root = tempfile.mkdtemp(prefix="peat_slipcost_")
  try:
    for name, tree in sides:
      cache = os.path.join(root, f"cache_{name}")
      for phase in ("cold", "warm"):
        camp = os.path.join(root, f"camp_{name}_{phase}")
        got = _validate(tree, cache, camp)
        out[f"{name} {phase}"] = got
        print(f"  validate {name} {phase}: {got['wall_s']:.1f} s, "
              f"{got['models']}", flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  for phase in ("cold", "warm"):
    if f"before {phase}" in out:
      out[f"ratio {phase}"] = (out[f"after {phase}"]["wall_s"]
                               / out[f"before {phase}"]["wall_s"])
  return out


def main(argv):
  del argv
  figures = {"commit": subprocess.run(
      ["git", "rev-parse", "HEAD"], capture_output=True, text=True,
      cwd=os.path.dirname(HERE), check=False).stdout.strip()}
  if "records" in _PART.value:
    print("per flagged record (peat.analyzer.port_probe):")
    figures["records"] = records()
  if "validate" in _PART.value:
    print("a whole validate (gpt, 20 steps, checkpoints 0 and 10, runtime "
          "FI every call):")
    figures["validate"] = validate()
  if _JSON.value:
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump(figures, f, indent=1, default=str)


if __name__ == "__main__":
  app.run(main)
