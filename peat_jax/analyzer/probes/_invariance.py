"""Invariance probes: what a kernel under test does beyond one call's values.

A signature compares one KUT output with the golden kernel's on identical
inputs. Some defects are invisible there: a kernel that changes its inputs
(the golden kernel run after it on the same buffers agrees), one that
returns an earlier call's values, one whose output ignores its input, one
whose row ``i`` depends on the rest of the batch. :func:`invariance_probe`
calls the KUT a few more times on host copies of a site's inputs and
returns the facts the Detector's invariance rules read
(``peat_jax.detector``, docs/detector.md):

* ``mutation``: each input hashed before and after a call on a fresh
  device copy of it (``input_mutation``);
* ``reuse``: call A on the inputs, then write perturbed values into the
  same device buffer (a donated update: the address stays) and call D on
  it: elements where D holds A's bits instead of those of P, a call on the
  perturbed inputs in a buffer of its own (``stale``: a result kept for an
  address, as training reuses its buffers for new values every step);
* ``repeat``: P on the perturbed inputs, then C on the inputs again in a
  new buffer: elements where C differs from A, and those of them that hold
  P's bits (``stale``; other differences are ``nondeterminism``);
* ``insensitive``: one element per row of the first floating-point input
  moved by 4x the row's RMS; output elements the float64 reference moves by
  more than 2**-3 of their magnitude (more than two roundings of fp8_e4m3)
  that stay bit-identical in the KUT, and those the KUT moves where the
  reference does not move at all (``input_insensitive`` needs few of the
  latter: a permuted output follows its input, elsewhere);
* ``batch``: row 0 of the batch alone, and the first half of the batch as
  a batch of its own, against the same rows of the full call: differing
  elements, largest distance in units in the last place, RMS difference
  and the golden kernel's noise floor on those rows (``batch_variance``).

Every probe input is a fresh device buffer kept alive until the last
call, so no two probes share an address (a cache keyed on addresses is
not hit by the probes themselves; playback's history check sees it).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import core as _core

#: Seed of the perturbation (reproducible records).
PROBE_SEED = 20
#: The perturbed input element moves by this many times its row's RMS.
PERTURB_RMS = 4.0
#: The reference must move an output element by more than this share of
#: its magnitude (2 u of fp8_e4m3: every rounding to nearest of a format at
#: least that fine moves too), and by more than MOVE_OVER_RMS of the
#: output's RMS, for a KUT that leaves it bit-identical to be insensitive.
MOVE_RELATIVE = 2.0 ** -3
MOVE_OVER_RMS = 2.0 ** -10
#: An output element the float64 reference moves by at most this share of
#: its RMS did not move (the perturbed inputs do not reach it).
UNMOVED = 2.0 ** -40


def _bits(x: np.ndarray) -> np.ndarray:
  """The bit patterns of a float array (NaNs compare by their bits)."""
  x = np.ascontiguousarray(x)
  return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def _ordered(x: np.ndarray) -> np.ndarray:
  """Integers in the order of the floats (ULP distance = difference)."""
  b = _bits(x).astype(np.int64)
  top = np.int64(1) << (8 * x.dtype.itemsize - 1)
  return np.where(b >= top, top - b, b)


def _leaves(out) -> list[np.ndarray]:
  if isinstance(out, (list, tuple)):
    return [np.asarray(o) for o in out]
  return [np.asarray(out)]


def _call(fn: Callable, arrays: Sequence[np.ndarray], keep: list
          ) -> tuple[list[np.ndarray], list]:
  """Calls ``fn`` on fresh device copies; returns outputs and the copies."""
  # Buffers XLA owns (a zero-copy view of host memory is not donated).
  dev = [jnp.array(a, copy=True) for a in arrays]
  out = _leaves(jax.block_until_ready(fn(*dev)))
  keep.extend(dev)
  return out, dev


def _mutation(before: Sequence[np.ndarray], dev: Sequence) -> list[dict]:
  out = []
  for i, (b, d) in enumerate(zip(before, dev)):
    after = np.asarray(d)
    if after.shape != b.shape or after.dtype != b.dtype:
      continue
    changed = _bits(after) != _bits(b) if _core.is_floating(b.dtype) else after != b
    n = int(np.sum(changed))
    if n:
      out.append({"input": i, "changed": n, "size": int(b.size),
                  "zeroed": int(np.sum(changed & (after == 0)))})
  return out


def _perturbed(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """One element per row (last axis) moved by 4x the row's RMS."""
  y = np.array(x, copy=True)
  rows = y.reshape(-1, y.shape[-1]) if y.ndim else y.reshape(1, 1)
  cols = rng.integers(0, rows.shape[1], rows.shape[0])
  r64 = rows.astype(np.float64)
  rms = np.sqrt(np.mean(np.square(r64), axis=1))
  whole = float(np.sqrt(np.mean(np.square(r64)))) or 1.0
  step = (PERTURB_RMS * np.where(rms > 0, rms, whole)
          * rng.choice([-1.0, 1.0], rows.shape[0]))
  idx = np.arange(rows.shape[0])
  big = float(np.finfo(y.dtype).max) / 2
  rows[idx, cols] = np.clip(r64[idx, cols] + step, -big, big).astype(y.dtype)
  return y


def _holds(got: np.ndarray, want: np.ndarray, other: np.ndarray
           ) -> tuple[int, int, int, int]:
  """Elements where ``got`` differs from ``want``, those of them holding
  ``other``'s bits (where ``other`` differs from ``want``), the rows with
  such elements, and the rows."""
  bg, bw, bo = _bits(got), _bits(want), _bits(other)
  differ = bg != bw
  held = differ & (bg == bo) & (bo != bw)
  rows = np.any(held.reshape(-1, got.shape[-1]) if got.ndim else held, axis=-1)
  return (int(np.sum(differ)), int(np.sum(held)), int(np.sum(rows)),
          int(rows.size))


def _repeat(a: np.ndarray, p: np.ndarray, c: np.ndarray) -> dict:
  """C (the inputs again) against A, and how much of C holds P's bits."""
  changed, prev, rows_prev, rows = _holds(c, a, p)
  return {"changed": changed, "from_previous": prev,
          "rows_from_previous": rows_prev, "rows": rows}


def _insensitive(a, p, ref_a, ref_p) -> dict | None:
  if ref_a is None or ref_p is None or np.shape(ref_a) != a.shape:
    return None
  ra, rp = np.asarray(ref_a, np.float64), np.asarray(ref_p, np.float64)
  finite = np.isfinite(ra) & np.isfinite(rp) & np.isfinite(a)
  if not finite.any():
    return None
  rms = float(np.sqrt(np.mean(np.square(ra[finite]))))
  delta = np.abs(rp - ra)
  moved = finite & (delta > MOVE_RELATIVE * np.maximum(np.abs(ra), np.abs(rp)))
  moved &= delta > MOVE_OVER_RMS * rms
  same = _bits(p) == _bits(a)
  still = moved & same
  # The KUT moved where the reference did not move at all: its output
  # follows the input, in other places (a permutation), not ignoring it.
  elsewhere = finite & ~same & (delta <= UNMOVED * max(rms, 1e-300))
  return {"moved": int(np.sum(moved)), "still": int(np.sum(still)),
          "elsewhere": int(np.sum(elsewhere)), "n": int(a.size)}


def _reuse(a: np.ndarray, d: np.ndarray, p: np.ndarray) -> dict:
  """D (new values in A's buffer) against P (them in a buffer of its own)."""
  differ, old, rows_old, rows = _holds(d, p, a)
  return {"differ": differ, "from_earlier": old, "rows_from_earlier": rows_old,
          "rows": rows}


_WRITE = jax.jit(lambda old, new: jax.lax.dynamic_update_slice(
    old, new, (0,) * old.ndim), donate_argnums=0)


def _in_place(dev, values: np.ndarray):
  """``values`` written into ``dev``'s device buffer (same address), or
  None when the backend did not reuse it."""
  try:
    ptr = dev.unsafe_buffer_pointer()
    out = jax.block_until_ready(_WRITE(dev, values))
    return out if out.unsafe_buffer_pointer() == ptr else None
  except Exception:  # pylint: disable=broad-except
    return None


def _rows(x: np.ndarray, axis: int, stop: int, start: int = 0) -> np.ndarray:
  return np.take(x, np.arange(start, stop), axis=axis)


def _batch(fn, arrays, in_axes, out_axes, full, golden, ref, keep
           ) -> dict[int, dict]:
  """Row 0 alone and the first half as a batch, against the full call.

  Returns:
    output index -> ``{"rows", "alone"?, "half"?, "noise_rms"?}`` with
    ``{"rows", "n", "differ", "max_ulps", "rms"}`` per probe.
  """
  sizes = {np.shape(a)[ax] for a, ax in zip(arrays, in_axes)
           if ax is not None}
  if len(sizes) != 1:
    return {}
  rows = sizes.pop()
  facts: dict[int, dict] = {k: {"rows": int(rows)}
                            for k, ax in enumerate(out_axes) if ax is not None
                            and k < len(full)}
  for name, stop in (("alone", 1), ("half", (rows + 1) // 2)):
    if stop >= rows or (name == "half" and stop <= 1):
      continue
    sub = [a if ax is None else _rows(a, ax, stop)
           for a, ax in zip(arrays, in_axes)]
    out, _ = _call(fn, sub, keep)
    for k in facts:
      ax = out_axes[k]
      want = _rows(full[k], ax, stop)
      got = out[k] if k < len(out) else None
      if got is None or got.shape != want.shape:
        continue
      d = _bits(got) != _bits(want)
      ulps, rms = 0, 0.0
      if d.any():
        ulps = int(np.max(np.abs(_ordered(got) - _ordered(want))[d]))
        both = np.isfinite(got) & np.isfinite(want)
        diff = got[both].astype(np.float64) - want[both].astype(np.float64)
        rms = float(np.sqrt(np.sum(np.square(diff)) / want.size))
      facts[k][name] = {"rows": int(stop), "n": int(want.size),
                        "differ": int(np.sum(d)), "max_ulps": ulps,
                        "rms": rms}
  for k in facts:
    if golden is not None and ref is not None and k < len(golden) and (
        k < len(ref) and ref[k] is not None
        and np.shape(ref[k]) == np.shape(golden[k])):
      g = np.asarray(golden[k], np.float64)
      r = np.asarray(ref[k], np.float64)
      ok = np.isfinite(g) & np.isfinite(r)
      if ok.any():
        facts[k]["noise_rms"] = float(np.sqrt(np.mean(np.square(
            g[ok] - r[ok]))))
  return {k: f for k, f in facts.items() if "alone" in f or "half" in f}


def invariance_probe(fn: Callable, inputs: Sequence[np.ndarray], *,
                     reference: Callable | None = None,
                     golden: Sequence[np.ndarray] | None = None,
                     in_axes: Sequence[int | None] | None = None,
                     out_axes: Sequence[int | None] | None = None,
                     perturb: int | None = None) -> dict:
  """The invariance facts of a KUT at one site (module docstring).

  Args:
    fn: the KUT at the site: ``fn(*inputs)`` returns its output array (or
      a tuple of them, e.g. the cotangents of a backward site). It is
      called six times: on the inputs, on perturbed inputs written into
      the same buffer, on them in a buffer of their own, on the inputs
      again, on row 0 alone and on the first half of the batch.
    inputs: the site's inputs (host arrays; not modified).
    reference: ``reference(*inputs)``, the float64 reference (an array, or
      a list per output), for the insensitivity and noise-floor facts;
      None skips them.
    golden: the golden kernel's outputs on ``inputs`` (the noise floor).
    in_axes: the batch axis of each input (None: not sliced); None skips
      the batch probes.
    out_axes: the batch axis of each output (None: not compared).
    perturb: the input to perturb (default: the first floating-point one).

  Returns:
    ``{"outputs": [per output {"repeat", "reuse", "insensitive",
    "batch"}],
    "mutation": [changed inputs]}``: small numbers only (msgpack-ready).
    Empty lists when ``fn`` fails on the probe inputs
    (``"error": <message>``).
  """
  arrays = [np.asarray(x) for x in inputs]
  if perturb is None:
    perturb = next((i for i, a in enumerate(arrays)
                    if _core.is_floating(a.dtype) and a.ndim >= 1), None)
  keep: list = []  # every probe buffer stays alive: no address is reused
  try:
    a_out, a_dev = _call(fn, arrays, keep)
    if perturb is None:
      p_in = arrays
    else:
      rng = np.random.default_rng(PROBE_SEED)
      p_in = list(arrays)
      p_in[perturb] = _perturbed(arrays[perturb], rng)
    d_out = None
    if perturb is not None:
      moved = _in_place(a_dev[perturb], p_in[perturb])
      if moved is not None:
        d_dev = list(a_dev)
        d_dev[perturb] = moved
        d_out = _leaves(jax.block_until_ready(fn(*d_dev)))
        keep.append(moved)
    p_out, _ = _call(fn, p_in, keep)
    c_out, c_dev = _call(fn, arrays, keep)
    mutation = _mutation(arrays, c_dev)
  except Exception as err:  # pylint: disable=broad-except
    return {"outputs": [], "mutation": [], "error": str(err)[:300]}
  ref_a = ref_p = None
  if reference is not None and perturb is not None:
    try:
      ref_a, ref_p = reference(*arrays), reference(*p_in)
    except Exception:  # pylint: disable=broad-except
      ref_a = ref_p = None
  as_list = lambda r: (list(r) if isinstance(r, (list, tuple))
                       else [r] * (r is not None))
  ra, rp = as_list(ref_a), as_list(ref_p)
  outputs = []
  for k, (a, p, c) in enumerate(zip(a_out, p_out, c_out)):
    facts: dict[str, Any] = {}
    if _core.is_floating(a.dtype) and a.size and a.shape == p.shape == c.shape:
      facts["repeat"] = _repeat(a, p, c)
      if d_out is not None and k < len(d_out) and d_out[k].shape == a.shape:
        facts["reuse"] = _reuse(a, d_out[k], p)
      ins = _insensitive(a, p, ra[k] if k < len(ra) else None,
                         rp[k] if k < len(rp) else None)
      if ins is not None:
        facts["insensitive"] = ins
    outputs.append(facts)
  if in_axes is not None and out_axes is not None:
    try:
      batch = _batch(fn, arrays, in_axes, out_axes, a_out,
                     None if golden is None else [np.asarray(g) for g in golden],
                     ra or None, keep)
    except Exception:  # pylint: disable=broad-except
      batch = {}
    for k, f in batch.items():
      if k < len(outputs):
        outputs[k]["batch"] = f
  del keep
  return {"outputs": outputs, "mutation": mutation}
