"""Invariance checks in playback: the KUT probed beyond one call per site.

With ``invariance=True`` (``peat.playback``, ``peat.playback_many``,
``peat.validate``, ``--invariance`` of the tools), a :class:`Player` hands
each step's taps to an :class:`InvarianceChecks`, which for every forward
site and every composite's backward site of the KUT:

* calls the KUT on host copies of the site's inputs
  (``peat_jax.analyzer.invariance_probe``): inputs hashed before and after
  a call, a second call on the same inputs after one on perturbed inputs,
  one input element per row moved, row 0 alone and half the batch as a
  batch;
* compares the rows of the KUT's tapped outputs, bit for bit, with the
  same rows of its other outputs of the same shape: other sites of this
  step and every probed site of the earlier checkpoints (a cached result,
  an accumulator left holding another call's values);

stores the facts in the record (``"invariance"``) and folds the
Detector's invariance models into the record's diagnosis
(``peat_jax.detector.with_invariance``). Transposed primitive backward
sites (``kind == "vjp"``) are not probed: their KUT output needs the
forward operands, which their taps do not hold.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import core as _core
from peat_jax import detector as _detector
from peat_jax import sites as _sites
from peat_jax.profiler.playback_fi._site_records import site_reference

_HASH = np.random.default_rng(2026).integers(
    1, 2**63, size=1 << 16, dtype=np.uint64) | np.uint64(1)


def _row_hashes(x: np.ndarray) -> np.ndarray:
  """One 64-bit hash of each row (last axis) of ``x``'s bit patterns."""
  x = np.ascontiguousarray(np.asarray(x))
  if x.ndim == 0 or not _core.is_floating(x.dtype):
    return np.zeros((0,), np.uint64)
  bits = x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])
  rows = bits.reshape(-1, x.shape[-1]).astype(np.uint64)
  mult = np.resize(_HASH, rows.shape[1])
  with np.errstate(over="ignore"):
    return (rows * mult).sum(axis=1, dtype=np.uint64)


def _rebuild(template, arrays):
  treedef, leaves, is_array = template
  it = iter(arrays)
  return jax.tree.unflatten(treedef, [next(it) if a else v
                                      for v, a in zip(leaves, is_array)])


def site_fn(call, params: dict) -> Callable | None:
  """The KUT at one site as ``fn(*tapped inputs) -> output(s)``, or None.

  Args:
    call: the site's ``SiteCall`` (``peat_jax.profiler.playback_fi._player``).
    params: its recorded call parameters (``kernels.kut.recording``).

  Returns:
    A function of the site's tapped inputs returning what the tap's
    ``kut`` holds; None for the golden kernel and for transposed
    primitive backward sites.
  """
  kut, site = call.sub.kut, call.site
  if kut is None or kut == _sites.GOLDEN or call.kind == "vjp":
    return None
  if call.kind == "forward" and not site.composite:
    kw = dict(params)
    if site.kernel == "conv_general_dilated" and isinstance(
        kut, functools.partial):
      kw["site"] = site.name
    return lambda *xs: kut(*xs, **kw)
  template = params.get("template")
  if template is None:
    return None
  if call.kind == "forward":
    def forward(*xs):
      args, kwargs = _rebuild(template, xs)
      return kut(*args, **kwargs)
    return forward
  def backward(*xs):
    _, cts, vjp = _analyzer.template_vjp(kut, template, xs)
    return tuple(vjp(cts))
  return backward


def _axes(call, params: dict, inputs: Sequence[np.ndarray],
          outputs: Sequence[np.ndarray]) -> tuple[list, list] | None:
  """Batch axis of each input and output of a site (None: not sliced)."""
  site = call.site
  if call.kind == "forward" and not site.composite:
    if site.kernel == "dot_general":
      (lc, _), (lb, rb) = params["dimension_numbers"]
      if lb:
        return [int(lb[0]), int(rb[0])], [0] * len(outputs)
      free = [d for d in range(np.ndim(inputs[0])) if d not in tuple(lc)]
      return ([free[0], None], [0] * len(outputs)) if free else None
    if site.kernel == "conv_general_dilated":
      dn = params["dimension_numbers"]
      return [int(dn.lhs_spec[0]), None], [int(dn.out_spec[0])] * len(outputs)
    if 0 in tuple(params.get("axes", ())) or np.ndim(inputs[0]) == 0:
      return None
    rows = np.shape(inputs[0])[0]
    ins = [0 if np.ndim(x) == np.ndim(inputs[0]) and np.shape(x)[0] == rows
           else None for x in inputs]
    return ins, [0 if np.ndim(o) and np.shape(o)[0] == rows else None
                 for o in outputs]
  arrays = [x for x in inputs if _core.is_floating(np.asarray(x).dtype)
            and np.ndim(x) >= 2]
  if not arrays:
    return None
  rows = np.shape(arrays[0])[0]
  ins = [0 if np.ndim(x) >= 2 and np.shape(x)[0] == rows else None
         for x in inputs]
  outs = [0 if np.ndim(o) >= 2 and np.shape(o)[0] == rows else None
          for o in outputs]
  return ins, outs


def _leaves(x) -> list[np.ndarray]:
  return [np.asarray(v) for v in (x if isinstance(x, tuple) else (x,))]


class InvarianceChecks:
  """A Player's invariance checks: probe functions and output history.

  Built once per Player; :meth:`annotate` adds each step's facts to its
  records and re-diagnoses them. The pool of the KUT's outputs (row
  hashes per record) covers the checkpoints played by this object, in
  order.
  """

  def __init__(self, calls: Sequence[Any], store: dict):
    """Args: calls: the Player's SiteCalls; store: its recorded params."""
    self._calls = list(calls)
    self._store = store
    self._fns: dict[str, Callable | None] = {}
    self._pool: list = []  # (step, record name, kut row hashes, golden's)

  def _fn(self, call) -> Callable | None:
    name = call.site.name
    if name not in self._fns:
      fn = site_fn(call, self._store.get(name, {}))
      self._fns[name] = None if fn is None else jax.jit(fn)
    return self._fns[name]

  def _pool_facts(self, key: str, step: int, kut: np.ndarray,
                  golden: np.ndarray, now: list) -> dict | None:
    """Rows of ``kut`` bit-equal to the same rows of another KUT output.

    Compared with every earlier step's probed outputs and this step's
    other ones (``now``) of the same shape; zero rows are not counted.
    """
    hk, hg = _row_hashes(kut), _row_hashes(golden)
    zero = _row_hashes(np.zeros_like(kut))
    best = None
    for s, other, pk, pg in self._pool + now:
      if pk.shape != hk.shape or (other == key and s == step):
        continue
      stale = (hk == pk) & (hk != hg) & (hg != pk) & (hk != zero)
      n = int(np.sum(stale))
      if n and (best is None or n > best["stale_rows"]):
        best = {"stale_rows": n, "rows": int(hk.size),
                "source": f"{other} at step {s}"}
    now.append((int(step), key, hk, hg))
    return best

  def facts(self, call, tp: _sites.Tap, step: int, now: list
            ) -> list[dict] | None:
    """Facts of one site at one step: one dict per output, or None.

    Returns:
      ``[{"mutation": [...], "outputs": [facts of output k]}]`` per output
      of the site (composites' backward sites: one per cotangent), or None
      when the site is not probed.
    """
    fn = self._fn(call)
    if fn is None:
      return None
    name = call.site.name
    params = self._store.get(name, {})
    inputs = [np.asarray(x) for x in tp.inputs]
    if len(inputs) != len(call.site.in_shapes) or any(
        np.shape(x) != tuple(s) for x, s in zip(inputs, call.site.in_shapes)):
      return None  # scan-stacked taps: one call per iteration, not probed
    kut, golden = _leaves(tp.kut), _leaves(tp.golden)
    axes = _axes(call, params, inputs, kut)
    probe = _analyzer.invariance_probe(
        fn, inputs, golden=golden,
        reference=lambda *xs: site_reference(call.site, params, xs),
        in_axes=None if axes is None else axes[0],
        out_axes=None if axes is None else axes[1])
    outs = probe["outputs"]
    per = []
    for k, (t, g) in enumerate(zip(kut, golden)):
      out = dict(outs[k]) if k < len(outs) else {}
      key = name if len(kut) == 1 else f"{name}/d{k}"
      hist = self._pool_facts(key, step, t, g, now)
      if hist is not None:
        out["history"] = hist
      per.append({"mutation": probe["mutation"], "outputs": [out],
                  **({"error": probe["error"]} if "error" in probe else {})})
    return per

  def annotate(self, step: int, records: list[dict], taps: dict
               ) -> list[dict]:
    """Adds the facts of every probed site to its records, re-diagnosed.

    Args:
      step: the checkpoint's step.
      records: the step's site records (``site_records``), in order.
      taps: the step's taps (site name -> Tap).

    Returns:
      ``records``, each probed one with ``"invariance"`` and the diagnosis
      :func:`peat_jax.detector.with_invariance` gives.
    """
    facts, now = {}, []
    for call in self._calls:
      got = self.facts(call, taps[call.site.name], step, now)
      if got is not None:
        facts[call.site.name] = got
    self._pool += now
    for rec in records:
      k = int(rec.get("output", 0))
      base = (rec["site"][:-len(f"/d{k}")] if "output" in rec
              else rec["site"])
      per = facts.get(base)
      if per is None or k >= len(per):
        continue
      rec["invariance"] = per[k]
      diag = _detector.with_invariance(_detector.diagnosis_of(rec), per[k])
      rec["diagnosis"] = _detector.diagnosis_record(diag)
    return records
