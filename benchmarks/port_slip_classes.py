"""Port slips by class: real ports with one slip each, through the public API.

Usage::

  nice -n 5 python benchmarks/port_slip_classes.py [--only=ln_swap,tf32_faults]
      [--workdir=/tmp/peat_port_slips] [--json=out.json] [--steps=6]
      [--checkpoint_every=3] [--dtypes=f32,bf16]

Each class is what a kernel engineer would call the slip ("engineer's
name"); the column "named ok" compares the family of the Detector's
model (``precision:tf32`` -> ``precision``) with it.

In training (``peat.validate`` on a built-in scenario, playback only:
runtime FI off, ``frequencies=()``), the ``py:`` KUTs of
``benchmarks/port_slips/kuts.py`` (its docstring has the table of what
each does), float32 and, where a bf16 scenario has the kernel, bf16:

| class | KUT | scenarios | engineer's name |
| --- | --- | --- | --- |
| ``conv_flip`` | ``conv_im2col_flipped`` | cnn (no bf16 scenario has a convolution: vit_bf16's patch embedding is a ``dot_general``) | ``indexing`` |
| ``ln_swap`` | ``layer_norm_swapped_affine`` | gpt, vit_bf16 | ``indexing`` |
| ``gemm_drop_k`` | ``gemm_drop_last_k`` | gpt, vit_bf16 | ``indexing`` |
| ``flash_stale_sum`` | ``flash_attention_stale_sum`` | gpt (causal), vit_bf16, llama (bf16, causal, grouped-query) | ``scale`` |
| ``causal_off_by_one`` | ``attention_causal_off_by_one`` | gpt, llama (vit's attention is not causal) | ``indexing`` |
| ``ce_smoothing`` | ``cross_entropy_smoothed`` | gpt, vit_bf16 (its cross-entropy site is float32) | ``parameter`` |
| ``softmax_bwd_no_diag`` | ``softmax_vjp_no_diag`` (``backward="kut"``) | gpt, vit_bf16 | ``unknown`` (a wrong formula) |
| ``control_*`` | the correct twin of each | the same scenarios | ``pass`` |

Output-only (``peat.analyze(t, g, reference=r)`` then ``peat.detect(sig,
context={"kernel": "dot_general", "reduction": K})``, r the float64 NumPy
product), over several shapes (M, K, N; some not multiples of 8) and seeds:

| class | KUT output ``t`` | engineer's name |
| --- | --- | --- |
| ``tf32_faults`` | a matmul on TF32-rounded operands (to nearest and toward zero, float32 accumulation) with 1-3 flipped bits changing their element by more than 64x its TF32 error bound (``bitflip``), 1-3 flipped low bits (float32 mantissa bits 0-4, below a 64th of that bound: "invisible", only no fail-by-bitflip claim expected), a stuck bit (``stuck_at``), random values in a few elements (``random_value``), a zeroed row (``zero``), every 32nd column corrupted (``lane``); expected verdict fail, secondary ``precision:tf32`` | the fault |
| ``ftz`` | rows (or columns) of outputs near 1e-39 (subnormal in float32 and bf16), flushed to zero by the port; golden keeps them (NumPy's float32 BLAS: XLA on CPU flushes subnormals itself) | ``ftz`` |
| ``tile_swap`` | a K-tiled float32 port with two aligned 8x8 output tiles swapped | ``indexing`` |
| ``nan_tail`` | NaN in the last ``N % 8`` columns (the last partial tile) of some rows; the evidence must say NaN | ``nan`` |

Prints Markdown tables (one row per training campaign, one per
output-only case, and a summary per class) and writes every detail as
JSON (``--json``). The KUT module is found from this script's own folder
(``benchmarks/port_slips`` on ``sys.path``), so the script runs against
any peat_jax on ``PYTHONPATH``. Campaign directories are made fresh under
``--workdir`` (a case's old directory is removed first).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import traceback

from absl import app
from absl import flags
from absl import logging

HERE = os.path.dirname(os.path.abspath(__file__))
KUT_DIR = os.path.join(HERE, "port_slips")
sys.path.insert(0, KUT_DIR)

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import ml_dtypes  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

import peat_jax as peat  # pylint: disable=wrong-import-position
from peat_jax import models  # pylint: disable=wrong-import-position

_ONLY = flags.DEFINE_list(
    "only", [], "Run only these classes (names of CLASSES; a control "
    "class is control_<kernel>), or 'training' / 'output' for a part.")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_port_slips",
                               "Campaign directories (made fresh).")
_JSON = flags.DEFINE_string("json", None, "Where the JSON goes.")
_STEPS = flags.DEFINE_integer("steps", 6, "Golden steps of each campaign.")
_EVERY = flags.DEFINE_integer("checkpoint_every", 3,
                              "Checkpoint interval (playback points).")
_DTYPES = flags.DEFINE_list("dtypes", ["f32", "bf16"],
                            "Which model precisions to run: f32, bf16.")

# ---------------------------------------------------------------------------
# The classes
# ---------------------------------------------------------------------------

#: Training classes: name -> (engineer's name, site kernel, KUT function,
#: [(precision, scenario, backward)], what the KUT does). The
#: cross-entropy's forward site is one number (the batch mean): its classes
#: run with ``backward="kut"`` too, where the KUT's VJP gives the logits'
#: gradient.
TRAINING = {
    "conv_flip": (
        "indexing", "conv_general_dilated", "conv_im2col_flipped",
        [("f32", "cnn", "golden")],
        "im2col convolution reading the filter rotated by 180 degrees "
        "(w[KH-1-i, KW-1-j]): a true convolution where the model "
        "cross-correlates"),
    "ln_swap": (
        "indexing", "layer_norm", "layer_norm_swapped_affine",
        [("f32", "gpt", "golden"),
         ("bf16", "vit_bf16", "golden")],
        "two-pass layer norm computing y * bias + scale (scale and bias "
        "swapped)"),
    "gemm_drop_k": (
        "indexing", "dot_general", "gemm_drop_last_k",
        [("f32", "gpt", "golden"),
         ("bf16", "vit_bf16", "golden")],
        "K-tiled GEMM (tiles of 32, float32 accumulator) whose last tile "
        "stops at K - 1: the last product of every dot is left out"),
    "flash_stale_sum": (
        "scale", "attention", "flash_attention_stale_sum",
        [("f32", "gpt", "golden"),
         ("bf16", "vit_bf16", "golden"),
         ("bf16", "llama", "golden")],
        "flash attention over key blocks of 16 (running max, sum, output); "
        "the running sum is not multiplied by exp(m_old - m_new) when the "
        "max grows (the running output is)"),
    "causal_off_by_one": (
        "indexing", "attention", "attention_causal_off_by_one",
        [("f32", "gpt", "golden"),
         ("bf16", "llama", "golden")],
        "softmax attention building its own causal mask as key <= query + 1 "
        "(one future key let through)"),
    "ce_smoothing": (
        "parameter", "cross_entropy", "cross_entropy_smoothed",
        [("f32", "gpt", "golden"),
         ("f32", "gpt", "kut"),
         ("bf16", "vit_bf16", "golden"),
         ("bf16", "vit_bf16", "kut")],
        "cross-entropy with label smoothing 0.1 where the model has none"),
    "softmax_bwd_no_diag": (
        "unknown", "softmax", "softmax_vjp_no_diag",
        [("f32", "gpt", "kut"),
         ("bf16", "vit_bf16", "kut")],
        "softmax with a custom_vjp whose backward is -y * <dy, y> (the "
        "Jacobian's diag(y) dropped); forward correct"),
    "control_conv": (
        "pass", "conv_general_dilated", "conv_im2col",
        [("f32", "cnn", "golden")],
        "im2col convolution (patches times the filter matrix)"),
    "control_layer_norm": (
        "pass", "layer_norm", "layer_norm_two_pass",
        [("f32", "gpt", "golden"),
         ("bf16", "vit_bf16", "golden")],
        "two-pass layer norm (mean, then centred variance)"),
    "control_gemm": (
        "pass", "dot_general", "gemm_tiled",
        [("f32", "gpt", "golden"),
         ("bf16", "vit_bf16", "golden")],
        "K-tiled GEMM, float32 accumulator, one rounding"),
    "control_flash": (
        "pass", "attention", "flash_attention",
        [("f32", "gpt", "golden"),
         ("bf16", "vit_bf16", "golden"),
         ("bf16", "llama", "golden")],
        "flash attention with the running sum and output both rescaled"),
    "control_cross_entropy": (
        "pass", "cross_entropy", "cross_entropy_logsumexp",
        [("f32", "gpt", "golden"),
         ("f32", "gpt", "kut"),
         ("bf16", "vit_bf16", "golden"),
         ("bf16", "vit_bf16", "kut")],
        "cross-entropy as logsumexp(z) - z[label]"),
    "control_softmax_vjp": (
        "pass", "softmax", "softmax_vjp",
        [("f32", "gpt", "kut"),
         ("bf16", "vit_bf16", "kut")],
        "softmax with a custom_vjp backward y * (dy - <dy, y>)"),
}

OUTPUT = {
    "tf32_faults": "the fault (bitflip, stuck_at, random_value, zero, lane)",
    "ftz": "ftz",
    "tile_swap": "indexing",
    "nan_tail": "nan",
}

CLASS_ORDER = list(TRAINING) + list(OUTPUT)


def family(model: str | None) -> str:
  """``precision:tf32`` -> ``precision``."""
  return (model or "").split(":")[0]


def secondary_name(sec) -> str:
  """A diagnosis's secondary cause as a model name ('' when none)."""
  if sec is None:
    return ""
  if isinstance(sec, str):
    return sec
  if isinstance(sec, dict):
    return str(sec.get("model", ""))
  return str(getattr(sec, "model", sec))


def cut(text: str, n: int = 160) -> str:
  """The first n characters of one line of text, for a Markdown cell."""
  t = " ".join(str(text or "").split())
  t = t[:n] + ("..." if len(t) > n else "")
  return t.replace("|", "\\|")


# ---------------------------------------------------------------------------
# Training classes
# ---------------------------------------------------------------------------


def run_training(name: str, precision: str, scenario: str,
                 backward: str) -> dict:
  """One campaign: peat.validate with the class's KUT, playback only."""
  expected, kernel, fn, _, what = TRAINING[name]
  spec = f"py:kuts:{fn}@{kernel}"
  out = os.path.join(_WORKDIR.value, f"{name}_{scenario}_bwd_{backward}")
  shutil.rmtree(out, ignore_errors=True)
  row = {"part": "training", "class": name, "engineer": expected,
         "precision": precision, "scenario": scenario, "kut": spec,
         "kernel": kernel, "backward": backward, "what": what,
         "where": f"{scenario} ({precision} model), {kernel} "
                  f"{'fwd+bwd (backward=kut)' if backward == 'kut' else 'fwd'}",
         "campaign_dir": out}
  try:
    task = models.get_task(scenario)
    paths = peat.validate(task, spec, out, steps=_STEPS.value,
                          checkpoint_every=_EVERY.value, frequencies=(),
                          backward=backward, progress=None)
    res = peat.read_campaign(out)
    raw = peat.profiler.read_records(
        os.path.join(out, peat.profiler.PLAYBACK_FILE))
  except Exception as e:  # pylint: disable=broad-except
    row.update(error=f"{type(e).__name__}: {e}",
               traceback=traceback.format_exc()[-3000:])
    return row
  raw_by = {(r.get("site"), r.get("step")): r for r in raw
            if r.get("kind") == "site"}
  deciding = [tuple(d) for d in res.verdict.deciding]
  recs = []
  for r in res.playback:
    d = raw_by.get((r.site, r.step), {})
    diag = d.get("diagnosis", {}) if isinstance(d, dict) else {}
    recs.append({"site": r.site, "step": r.step, "phase": r.phase,
                 "model": r.model, "verdict": r.verdict,
                 "noise_ratio": r.noise_ratio,
                 "secondary": secondary_name(diag.get("secondary")),
                 "decided_by": d.get("decided_by"),
                 "port": _small(d.get("port")),
                 "deciding": (r.site, r.step) in deciding,
                 "evidence": r.evidence})
  dec = [x for x in recs if x["deciding"]] or recs
  models_c = collections.Counter(x["model"] for x in dec)
  sec_c = collections.Counter(x["secondary"] for x in dec if x["secondary"])
  sites = list(dict.fromkeys(x["site"] for x in dec))
  top = models_c.most_common(1)[0][0] if models_c else ""
  first = next((x for x in dec if x["model"] == top), dec[0] if dec else {})
  row.update(verdict=paths.verdict, summary=res.verdict.summary,
             deciding_sites=sites, models=dict(models_c),
             secondaries=dict(sec_c), model=top,
             secondary=(sec_c.most_common(1)[0][0] if sec_c else ""),
             evidence=first.get("evidence", ""),
             evidence_site=f"{first.get('site')} @ step {first.get('step')}",
             records=recs)
  if expected == "pass":
    row["named_ok"] = ("yes" if paths.verdict == "pass"
                       else f"no (false alarm: {paths.verdict})")
  else:
    hits = sum(c for m, c in models_c.items() if family(m) == expected)
    n = sum(models_c.values())
    row["named_ok"] = ("yes" if n and hits == n else
                       f"partly ({hits}/{n} records)" if hits else "no")
  return row


def _small(port):
  """The port probe's answer without its bulky fields (JSON)."""
  if not isinstance(port, dict):
    return port
  return {k: v for k, v in port.items()
          if isinstance(v, (str, int, float, bool, type(None), list))}


# ---------------------------------------------------------------------------
# Output-only classes
# ---------------------------------------------------------------------------

#: (M, K, N): M, K or N not a multiple of 8 in all but the first; N >= 96
#: so that a lane of 32 repeats at least three times.
SHAPES = ((64, 256, 96), (50, 300, 130), (37, 129, 200), (72, 96, 131))
#: N not a multiple of 8: a last partial tile of N % 8 columns.
NAN_SHAPES = ((50, 300, 130), (72, 96, 131), (37, 129, 203), (64, 256, 100))
TF32_DROP = 13          # float32 has 23 mantissa bits, TF32 10
#: "Invisible" flips: float32 mantissa bits 0-4, at most 16 ulps of float32,
#: below a 64th of the element's TF32 error bound (TF32 drops 13 bits).
INVISIBLE_BIT = 4
BF16 = ml_dtypes.bfloat16


def tf32(x: np.ndarray, rounding: str) -> np.ndarray:
  """float32 -> TF32 values (10 mantissa bits), kept in float32."""
  u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
  mask = np.uint64((1 << TF32_DROP) - 1)
  if rounding == "nearest":      # to nearest, ties to even
    lsb = (u >> np.uint64(TF32_DROP)) & np.uint64(1)
    u = u + (mask >> np.uint64(1)) + lsb
  u = u & ~mask & np.uint64(0xFFFFFFFF)
  return u.astype(np.uint32).view(np.float32)


def k_tiled(a: np.ndarray, b: np.ndarray, tile: int = 32) -> np.ndarray:
  """A port's float32 GEMM: K tiles of ``tile`` added into float32."""
  a = np.asarray(a, np.float32)
  b = np.asarray(b, np.float32)
  acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
  for k0 in range(0, a.shape[1], tile):
    acc = acc + (a[:, k0:k0 + tile] @ b[k0:k0 + tile]).astype(np.float32)
  return acc


def operands(shape, seed, dtype="f32"):
  """a [M, K], b [K, N] with outputs of about unit size, in ``dtype``."""
  m, k, n = shape
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k)).astype(np.float32)
  b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
  if dtype == "bf16":
    a = a.astype(BF16)
    b = b.astype(BF16)
  return a, b


def ref64(a, b) -> np.ndarray:
  return np.asarray(a, np.float64) @ np.asarray(b, np.float64)


def flip(x: np.ndarray, idx, bit: int) -> np.ndarray:
  """x (float32) with one bit of element idx flipped."""
  y = np.array(x, np.float32, copy=True)
  v = y.view(np.uint32)
  v[idx] ^= np.uint32(1 << bit)
  return y


def flip_value(val: np.float32, bit: int) -> np.float32:
  return np.array([val], np.float32).view(np.uint32).__xor__(
      np.uint32(1 << bit)).view(np.float32)[0]


def tf32_cases():
  """The TF32 fault cases: (case id, shape, rounding, fault, params)."""
  cases = []
  for si, shape in enumerate(SHAPES):
    for rounding in ("nearest", "toward_zero"):
      seed = 100 * si + (0 if rounding == "nearest" else 1)
      for nb in (1, 2, 3):
        cases.append((shape, rounding, seed, "bitflip", {"bits": nb}))
      cases.append((shape, rounding, seed, "bitflip_invisible",
                    {"bits": 1 + (si % 3)}))
      cases.append((shape, rounding, seed, "stuck_at",
                    {"bit": (20, 21, 19, 20)[si], "value": (si + 1) % 2}))
      cases.append((shape, rounding, seed, "random_value",
                    {"count": 3 + si}))
      cases.append((shape, rounding, seed, "zero", {"row": 5 + 3 * si}))
      cases.append((shape, rounding, seed, "lane", {"lane": 7 + 5 * si}))
  return cases


def make_tf32_case(shape, rounding, seed, fault, params):
  """(t, g, r, what, expected) of one TF32 fault case."""
  m, k, n = shape
  a, b = operands(shape, seed)
  rng = np.random.default_rng(seed + 7)
  t0 = tf32(a, rounding) @ tf32(b, rounding)        # float32 accumulate
  t0 = t0.astype(np.float32)
  g = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(b)))
  r = ref64(a, b)
  # The TF32 error bound of each element: both operands rounded, 2 u(tf32)
  # per product, summed in magnitude.
  u = 2.0 ** -(10 if rounding == "toward_zero" else 11)
  bound = 2 * u * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
  t = t0.copy()
  expected = fault
  detail = dict(params)
  if fault in ("bitflip", "bitflip_invisible"):
    flat = rng.choice(m * n, size=params["bits"], replace=False)
    done = []
    for f in flat:
      i, j = divmod(int(f), n)
      val = t[i, j]
      deltas = {bit: abs(float(flip_value(val, bit)) - float(val))
                for bit in range(32)}
      ok = [bit for bit, dlt in deltas.items()
            if np.isfinite(flip_value(val, bit))
            and ((fault == "bitflip" and dlt > 64 * bound[i, j])
                 or (fault == "bitflip_invisible" and bit <= INVISIBLE_BIT
                     and dlt < bound[i, j] / 64))]
      bit = int(rng.choice(ok))
      t = flip(t, (i, j), bit)
      done.append({"row": i, "col": j, "bit": bit,
                   "delta_over_tf32_bound": deltas[bit] / bound[i, j]})
    detail["flips"] = done
    expected = "bitflip" if fault == "bitflip" else "no bitflip fail"
  elif fault == "stuck_at":
    v = t.view(np.uint32)
    if params["value"]:
      v |= np.uint32(1 << params["bit"])
    else:
      v &= ~np.uint32(1 << params["bit"])
  elif fault == "random_value":
    flat = rng.choice(m * n, size=params["count"], replace=False)
    ii, jj = np.unravel_index(flat, (m, n))
    t[ii, jj] = (rng.standard_normal(len(flat)) * np.std(g)).astype(
        np.float32)
    detail["at"] = [[int(x), int(y)] for x, y in zip(ii, jj)]
  elif fault == "zero":
    t[params["row"] % m] = 0.0
  elif fault == "lane":
    cols = np.arange(params["lane"] % 32, n, 32)
    t[:, cols] = (t[:, cols] + rng.standard_normal((m, len(cols))) *
                  np.std(g)).astype(np.float32)
    detail["cols"] = cols.tolist()
  what = f"{fault} {json.dumps(detail)}"
  return t, g, r, what, expected


def scaled_operands(shape, seed, dtype, axis):
  """Operands whose products are ~1 except 6 rows (or columns) ~1e-39.

  The inputs stay normal: a row of a is scaled by 2^-66 and b by 2^-63
  (the other rows of a by 2^63), so the tiny outputs (~2^-129, subnormal
  in float32 and bfloat16) come from the arithmetic, not from subnormal
  inputs.
  """
  m, k, n = shape
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k))
  b = rng.standard_normal((k, n)) / np.sqrt(k)
  if axis == "rows":
    tiny = rng.choice(m, size=6, replace=False)
    sa = np.full((m, 1), 2.0 ** 63)
    sa[tiny] = 2.0 ** -66
    a = a * sa
    b = b * 2.0 ** -63
  else:
    tiny = rng.choice(n, size=6, replace=False)
    sb = np.full((1, n), 2.0 ** 63)
    sb[:, tiny] = 2.0 ** -66
    b = b * sb
    a = a * 2.0 ** -63
  a = a.astype(np.float32)
  b = b.astype(np.float32)
  if dtype == "bf16":
    a = a.astype(BF16)
    b = b.astype(BF16)
  return a, b, sorted(int(x) for x in tiny)


def make_ftz_case(shape, seed, dtype, axis):
  a, b, tiny = scaled_operands(shape, seed, dtype, axis)
  r = ref64(a, b)
  # Golden: a BLAS that keeps subnormals (NumPy's float32 GEMM), rounded
  # once to the format.
  g32 = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  port = k_tiled(a, b)
  smallest = np.float32(2.0 ** -126)
  port = np.where(np.abs(port) < smallest, np.copysign(np.float32(0), port),
                  port).astype(np.float32)
  if dtype == "bf16":
    g = g32.astype(BF16)
    t = port.astype(BF16)
    # Rounding to bf16 may make new subnormals: flush those too.
    t = np.where(np.abs(t.astype(np.float32)) < smallest,
                 np.zeros_like(t), t)
  else:
    g = g32.astype(np.float32)
    t = port
  nflush = int(np.sum((np.asarray(t, np.float32) == 0)
                      & (np.asarray(g, np.float32) != 0)))
  what = f"{axis} {tiny} ~1e-39, {nflush} subnormal outputs flushed"
  return t, g, r, what, "ftz"


def golden_and_port(a, b, dtype):
  """XLA's product (golden) and the K-tiled port, in the format."""
  g = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(b)))
  port = k_tiled(a, b)
  if dtype == "bf16":
    port = port.astype(BF16)
  return g, port


def make_tile_swap_case(shape, seed, dtype):
  m, k, n = shape
  a, b = operands(shape, seed, dtype)
  r = ref64(a, b)
  g, t = golden_and_port(a, b, dtype)
  t = np.array(t, copy=True)
  rng = np.random.default_rng(seed + 3)
  tiles = [(i, j) for i in range(0, m - 7, 8) for j in range(0, n - 7, 8)]
  p, q = rng.choice(len(tiles), size=2, replace=False)
  (i0, j0), (i1, j1) = tiles[p], tiles[q]
  blk = t[i0:i0 + 8, j0:j0 + 8].copy()
  t[i0:i0 + 8, j0:j0 + 8] = t[i1:i1 + 8, j1:j1 + 8]
  t[i1:i1 + 8, j1:j1 + 8] = blk
  what = f"8x8 tiles at ({i0},{j0}) and ({i1},{j1}) swapped"
  return t, g, r, what, "indexing"


def make_nan_tail_case(shape, seed, dtype):
  m, k, n = shape
  a, b = operands(shape, seed, dtype)
  r = ref64(a, b)
  g, t = golden_and_port(a, b, dtype)
  t = np.array(t, copy=True)
  rng = np.random.default_rng(seed + 5)
  rem = n % 8
  rows = sorted(int(x) for x in rng.choice(m, size=4, replace=False))
  for i in rows:
    t[i, n - rem:] = np.nan
  what = f"NaN in columns {n - rem}..{n - 1} (last {rem}) of rows {rows}"
  return t, g, r, what, "nan"


def output_cases(name):
  """(case id, dtype, shape, maker thunk) of one output-only class."""
  out = []
  if name == "tf32_faults":
    for shape, rounding, seed, fault, params in tf32_cases():
      out.append((f"{fault}/{rounding}", "f32", shape, seed,
                  lambda s=shape, ro=rounding, se=seed, f=fault, p=params:
                  make_tf32_case(s, ro, se, f, p)))
  elif name == "ftz":
    for dtype in _DTYPES.value:
      for si, shape in enumerate(SHAPES[:2]):
        for axis in ("rows", "columns"):
          out.append((f"ftz/{axis}", dtype, shape, si,
                      lambda s=shape, se=si, d=dtype, ax=axis:
                      make_ftz_case(s, se, d, ax)))
  elif name == "tile_swap":
    for dtype in _DTYPES.value:
      for si, shape in enumerate(SHAPES):
        out.append(("tile_swap", dtype, shape, si,
                    lambda s=shape, se=si, d=dtype:
                    make_tile_swap_case(s, se, d)))
  elif name == "nan_tail":
    for dtype in _DTYPES.value:
      for si, shape in enumerate(NAN_SHAPES):
        out.append(("nan_tail", dtype, shape, si,
                    lambda s=shape, se=si, d=dtype:
                    make_nan_tail_case(s, se, d)))
  return out


def run_output_case(name, case, dtype, shape, seed, make) -> dict:
  m, k, n = shape
  row = {"part": "output", "class": name, "case": case,
         "precision": dtype, "shape": list(shape), "seed": seed,
         "where": f"output-only {dtype} M,K,N={m},{k},{n}"}
  try:
    t, g, r, what, expected = make()
    row.update(what=what, expected=expected)
    sig = peat.analyze(jnp.asarray(t), jnp.asarray(g), reference=r)
    d = peat.detect(sig, context={"kernel": "dot_general", "reduction": k})
  except Exception as e:  # pylint: disable=broad-except
    row.update(error=f"{type(e).__name__}: {e}",
               traceback=traceback.format_exc()[-3000:])
    row.setdefault("expected", OUTPUT[name])
    return row
  sec = secondary_name(d.secondary)
  row.update(model=d.model, verdict=d.verdict, secondary=sec,
             confidence=float(d.confidence), evidence=d.evidence,
             candidates=[c.model for c in d.candidates])
  fam = family(d.model)
  if expected == "no bitflip fail":
    row["named_ok"] = ("no (bitflip fail)" if fam == "bitflip"
                       and d.verdict == "fail" else "yes")
  else:
    row["named_ok"] = "yes" if fam == expected else "no"
  if name == "tf32_faults" and expected != "no bitflip fail":
    row["verdict_ok"] = d.verdict == "fail"
    row["secondary_ok"] = sec == "precision:tf32"
  if name == "nan_tail":
    row["verdict_ok"] = d.verdict == "fail"
    row["evidence_says_nan"] = "nan" in (d.evidence or "").lower()
  if name == "tile_swap":
    row["verdict_ok"] = d.verdict == "fail"
  return row


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------

TRAIN_HEAD = ("| class | engineer's name | where it runs | site(s) that "
              "decided | verdict | error model | secondary | named ok | "
              "evidence (first ~160 characters) |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def train_line(row) -> str:
  if "error" in row:
    return (f"| {row['class']} | `{row['engineer']}` | {row['where']} | - | "
            f"error | - | - | no | {cut(row['error'])} |")
  sites = row["deciding_sites"]
  shown = sites[0] + (f" (+{len(sites) - 1} more)" if len(sites) > 1 else "")
  models_txt = ", ".join(f"{m} x{c}" for m, c in sorted(
      row["models"].items(), key=lambda kv: -kv[1]))
  secs = ", ".join(f"{m} x{c}" for m, c in sorted(
      row["secondaries"].items(), key=lambda kv: -kv[1])) or "-"
  return (f"| {row['class']} | `{row['engineer']}` | {row['where']} | "
          f"{shown} | {row['verdict']} | {models_txt} | {secs} | "
          f"{row['named_ok']} | {cut(row['evidence'])} |")


OUT_HEAD = ("| class | case | engineer's name | where it runs | fault | "
            "verdict | error model | secondary | named ok | checks | "
            "evidence (first ~160 characters) |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | "
            "--- |")


def out_line(row) -> str:
  if "error" in row:
    return (f"| {row['class']} | {row['case']} | `{row.get('expected')}` | "
            f"{row['where']} | {cut(row.get('what', ''), 80)} | error | - | "
            f"- | no | - | {cut(row['error'])} |")
  checks = []
  if "verdict_ok" in row:
    checks.append(f"fail {'ok' if row['verdict_ok'] else 'NO'}")
  if "secondary_ok" in row:
    checks.append(f"tf32 2nd {'ok' if row['secondary_ok'] else 'NO'}")
  if "evidence_says_nan" in row:
    checks.append(f"says NaN {'yes' if row['evidence_says_nan'] else 'NO'}")
  return (f"| {row['class']} | {row['case']} | `{row['expected']}` | "
          f"{row['where']} | {cut(row['what'], 90)} | {row['verdict']} | "
          f"{row['model']} | {row['secondary'] or '-'} | {row['named_ok']} | "
          f"{', '.join(checks) or '-'} | {cut(row['evidence'])} |")


def summary_lines(rows) -> list[str]:
  lines = ["| class | engineer's name | runs | named ok | other checks |",
           "| --- | --- | --- | --- | --- |"]
  by = collections.defaultdict(list)
  for r in rows:
    by[r["class"]].append(r)
  for name in CLASS_ORDER:
    rs = by.get(name)
    if not rs:
      continue
    ok = sum(1 for r in rs if r.get("named_ok") == "yes")
    extra = []
    for key, label in (("verdict_ok", "verdict fail"),
                       ("secondary_ok", "secondary precision:tf32"),
                       ("evidence_says_nan", "evidence says NaN")):
      vals = [r[key] for r in rs if key in r]
      if vals:
        extra.append(f"{label} {sum(vals)}/{len(vals)}")
    errs = sum(1 for r in rs if "error" in r)
    if errs:
      extra.append(f"{errs} errors")
    eng = TRAINING[name][0] if name in TRAINING else OUTPUT[name]
    lines.append(f"| {name} | `{eng}` | {len(rs)} | {ok}/{len(rs)} | "
                 f"{'; '.join(extra) or '-'} |")
  return lines


# ---------------------------------------------------------------------------


def source_state() -> dict:
  """Which peat_jax ran: its folder, the git commit and uncommitted files."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(peat.__file__)))

  def git(*args):
    try:
      return subprocess.run(["git", "-C", root, *args], capture_output=True,
                            text=True, check=False, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
      return ""

  diff = git("diff", "HEAD", "--", "peat_jax")
  return {"root": root, "head": git("rev-parse", "--short", "HEAD").strip(),
          "uncommitted": git("status", "--porcelain", "--", "peat_jax")
                         .splitlines(),
          "diff_sha256": hashlib.sha256(diff.encode()).hexdigest()[:16]
                         if diff else ""}


def selected() -> list[str]:
  only = [s.strip() for s in _ONLY.value if s.strip()]
  if not only:
    return CLASS_ORDER
  names = []
  for s in only:
    if s == "training":
      names += list(TRAINING)
    elif s == "output":
      names += list(OUTPUT)
    elif s in TRAINING or s in OUTPUT:
      names.append(s)
    else:
      raise SystemExit(f"error: unknown class {s!r}; known: "
                       f"{', '.join(CLASS_ORDER)}, training, output")
  return [n for n in CLASS_ORDER if n in names]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  names = selected()
  os.makedirs(_WORKDIR.value, exist_ok=True)
  state = source_state()
  print(f"command: {' '.join(sys.argv)}\n"
        f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}\n"
        f"peat_jax from {state['root']} at {state['head']}"
        + (f" with uncommitted changes in {len(state['uncommitted'])} files "
           f"(diff sha256 {state['diff_sha256']})"
           if state["uncommitted"] else " (clean)")
        + f"; scenarios from {os.path.dirname(models.__file__)}; KUTs from "
        f"{KUT_DIR}; jax {jax.__version__}", flush=True)
  rows = []
  for name in names:
    if name in TRAINING:
      for precision, scenario, backward in TRAINING[name][3]:
        if precision not in _DTYPES.value:
          continue
        print(f"... {name} on {scenario} ({precision}, backward={backward})",
              file=sys.stderr, flush=True)
        row = run_training(name, precision, scenario, backward)
        rows.append(row)
        print(train_line(row), file=sys.stderr, flush=True)
    else:
      for case, dtype, shape, seed, make in output_cases(name):
        row = run_output_case(name, case, dtype, shape, seed, make)
        rows.append(row)
        print(out_line(row), file=sys.stderr, flush=True)
      try:
        peat.core.release_compiled()
      except Exception:  # pylint: disable=broad-except
        pass
  train = [r for r in rows if r["part"] == "training"]
  out = [r for r in rows if r["part"] == "output"]
  if train:
    print("\n## In training (peat.validate, playback; "
          f"steps={_STEPS.value}, checkpoint_every={_EVERY.value}, "
          "runtime FI off)\n")
    print(TRAIN_HEAD)
    for r in train:
      print(train_line(r))
  if out:
    print("\n## Output-only (peat.analyze + peat.detect, context "
          "dot_general with its K)\n")
    print(OUT_HEAD)
    for r in out:
      print(out_line(r))
  print("\n## Per class\n")
  print("\n".join(summary_lines(rows)))
  errors = [r for r in rows if "error" in r]
  for r in errors:
    print(f"\nerror in {r['class']} {r.get('case', r.get('scenario'))}: "
          f"{r['error']}")
  if _JSON.value:
    os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
    with open(_JSON.value, "w", encoding="utf-8") as f:
      json.dump({"peat_jax": state, "argv": sys.argv,
                 "steps": _STEPS.value,
                 "checkpoint_every": _EVERY.value, "rows": rows}, f,
                indent=1, default=str)
  return 0


if __name__ == "__main__":
  app.run(main)
