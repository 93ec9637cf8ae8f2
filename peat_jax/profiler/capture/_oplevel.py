"""Op-level playback: a KUT on captured site inputs, with no model.

:func:`playback_ops` reads the records that :func:`peat_jax.profiler.capture._capture.profile`
captured (``<campaign>/captures/``), runs the kernel under test on each
record's inputs, compares it with the golden kernel on the same inputs and
with the float64 reference, and appends one record per (step, site) to
``<campaign>/ops.msgpack`` in the format of playback records
(:func:`peat_jax.profiler.playback_fi._site_records.site_record`, docs/campaign.md), plus:

* ``source``: ``"ops"``;
* ``capture``: the record's file, relative to the captures directory;
* ``golden_from``: ``"rerun"`` for primitive sites (the golden primitive is
  bound again on the captured inputs, so KUT and golden run under the same
  conditions) or ``"captured"`` for composite sites (their golden kernel is
  model code: the captured golden output is used);
* ``golden_rerun_bit_equal``: whether the rerun golden output is bitwise the
  captured one (None for composites); False means the golden kernel itself
  gives other bits outside the training step (fusion, another algorithm).

Which captured sites a KUT runs at: the spec's site kernel
(``native:matmul`` -> ``dot_general``...), forward sites by default
(``phase=`` widens it to backward primitive sites; composite backward sites
are not supported), narrowed by ``select`` (pattern or names) and ``steps``.
Running again skips the (step, site) records already in ``ops.msgpack``
for the same KUT.
"""

from __future__ import annotations

import fnmatch
import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from peat_jax.profiler import files as _files
from peat_jax import detector as _detector
from peat_jax.profiler.capture import _capture
from peat_jax.profiler.capture import _capture_io as io
from peat_jax import sites as _sites
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import playback_fi as _playback_fi

OPS_FILE = _files.OPS_FILE


class OpsResult(NamedTuple):
  """What :func:`playback_ops` recorded.

  Attributes:
    records: the KUT's site records in ``ops.msgpack`` for the selected
      (step, site) pairs, in (step, execution order).
    sites: the selected site names, execution order.
    localization: ``{"site", "step", "noise_ratio"}`` or None (as playback).
    path: ``ops.msgpack``.
  """

  records: list
  sites: list
  localization: dict | None
  path: str


def captures_dir_of(source: str | os.PathLike) -> str:
  """The captures directory of a campaign directory (or itself).

  Raises:
    PeatError: no ``index.json`` in either place.
  """
  source = os.path.abspath(os.fspath(source))
  for d in (source, os.path.join(source, _capture.CAPTURE_DIR)):
    if os.path.exists(os.path.join(d, io.INDEX_FILE)):
      return d
  raise PeatError(f"no captures at {source}: expected {io.INDEX_FILE} there "
                  f"or in {source}/{_capture.CAPTURE_DIR}/. Fix: run "
                  "the golden profile (peat-profile) with a capture selection "
                  "first")


def _phases(phase) -> tuple | None:
  if phase is None:
    return None
  return (phase,) if isinstance(phase, str) else tuple(phase)


def select_entries(index: dict,
                   kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec", *,
                   select: str | Sequence[str] | None = None,
                   phase: str | Sequence[str] | None = "fwd",
                   steps: Sequence[int] | None = None) -> list[dict]:
  """The index entries a KUT plays back (module docstring).

  Raises:
    PeatError: no captured record matches, listing what was captured.
  """
  spec = _kut.checked(kut_spec).spec
  kut_spec = spec.spec
  phases = _phases(phase)
  out = []
  for e in index["records"]:
    if e["kernel"] != spec.site_kernel:
      continue
    if phases is not None and e["phase"] not in phases:
      continue
    if isinstance(select, str) and not fnmatch.fnmatchcase(e["site"],
                                                           select):
      continue
    if select is not None and not isinstance(select, str) and (
        e["site"] not in select):
      continue
    if steps is not None and e["step"] not in steps:
      continue
    if e["composite"] and e["phase"] == "bwd":
      raise PeatError(f"op-level playback of composite backward site "
                      f"{e['site']!r} is not supported; expected forward "
                      "composite sites or primitive sites. Fix: phase='fwd'")
    out.append(e)
  if not out:
    have = sorted({(e["kernel"], e["phase"]) for e in index["records"]})
    raise PeatError(
        f"KUT {kut_spec!r} runs at {spec.site_kernel!r} sites (phase "
        f"{phases}, select={select!r}, steps={steps}) but no such record "
        f"was captured; captured (kernel, phase): {have}. Fix: capture "
        "those sites (peat-profile --capture_kernel) or pick another KUT")
  return out


def _one(xs: Sequence[Any]) -> Any:
  return xs[0] if len(xs) == 1 else tuple(xs)


def _split(arrays: dict, entry: dict) -> tuple[list, list]:
  ins = [arrays[f"in{i}"] for i in range(len(entry["in_shapes"]))]
  n_out = sum(1 for k in arrays if k.startswith("out"))
  return ins, [arrays[f"out{i}"] for i in range(n_out)]


def _call(fn: Callable, site: _sites.Site, params: dict, inputs) -> list:
  """Runs a site-signature function on (possibly scan-stacked) inputs."""
  def once(xs):
    if site.composite:
      treedef, leaves, is_array = params["template"]
      it = iter(xs)
      lv = [next(it) if a else v for v, a in zip(leaves, is_array)]
      args, kwargs = jax.tree.unflatten(treedef, lv)
      return jax.tree.leaves(fn(*args, **kwargs))
    out = fn(*xs, **params)
    return list(out) if isinstance(out, (list, tuple)) else [out]

  xs = [jnp.asarray(x) for x in inputs]
  if "scan" in site.where and xs and xs[0].ndim == len(site.in_shapes[0]) + 1:
    rows = [once([x[i] for x in xs]) for i in range(xs[0].shape[0])]
    return [np.stack([np.asarray(r[j]) for r in rows])
            for j in range(len(rows[0]))]
  return [np.asarray(o) for o in once(xs)]


def _site_shaped(site: _sites.Site, outs: Sequence[np.ndarray]) -> list:
  """Captured outputs in the site's own shapes: captures written before
  ``arrays_bytes`` kept 0-d arrays stored a scalar output (a loss, a mean
  cross-entropy) as one element, ``[1]``; the KUT returns it as the site
  does, ``[]``. Scan-stacked outputs (one more axis) are left as they
  are."""
  out = []
  for o, shape in zip(outs, site.out_shapes):
    shape = tuple(shape)
    o = np.asarray(o)
    out.append(o.reshape(shape) if o.shape != shape and o.size == int(
        np.prod(shape, dtype=np.int64)) and o.ndim <= 1 else o)
  return out


def _primitive(kernel: str):
  p = getattr(lax, f"{kernel}_p", None)
  if p is None:
    raise PeatError(f"no lax primitive named {kernel!r}_p to rerun the golden "
                    "kernel")
  return p


def _run_kut(kut_spec: _kut.KutSpec, site: _sites.Site, params: dict, inputs,
             golden: Sequence[np.ndarray]) -> list:
  kut = _kut.recording(_kut.kut_callable(kut_spec, site.name), site.name,
                       site.kernel, site.composite, {})
  outs = _call(kut, site, params, inputs)
  if len(outs) != len(golden) or any(
      o.shape != g.shape or o.dtype != g.dtype for o, g in zip(outs, golden)):
    got = [f"{o.dtype}{list(o.shape)}" for o in outs]
    want = [f"{g.dtype}{list(g.shape)}" for g in golden]
    raise PeatError(f"KUT {kut_spec.spec!r} at site {site.name!r} returned {got}; "
                    f"expected {want} like the golden kernel")
  return outs


def op_record(entry: dict, arrays: dict,
              kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec") -> dict:
  """One op-level record of a captured (step, site) (module docstring).

  Args:
    entry: the record's index entry.
    arrays: its loaded arrays (:func:`peat_jax.profiler.capture._capture_io.load_record`).
    kut_spec: the KUT spec (a checked one is used as is).

  Returns:
    A msgpack-ready dict in the playback record format plus ``source``,
    ``capture``, ``golden_from`` and ``golden_rerun_bit_equal``.
  """
  site = io.site_of(entry)
  params = io.decode_params(entry["params"])
  inputs, captured = _split(arrays, entry)
  if site.composite:
    golden, frm, same = _site_shaped(site, captured), "captured", None
  else:
    prim = _primitive(site.kernel)
    golden = _call(lambda *a, **p: prim.bind(*a, **p), site, params, inputs)
    frm = "rerun"
    same = all(np.asarray(a).tobytes() == np.asarray(b).tobytes()
               for a, b in zip(golden, captured))
  spec = _kut.checked(kut_spec).spec
  test = _run_kut(spec, site, params, inputs, golden)
  tap = _sites.Tap(tuple(inputs), _one(golden), _one(test))
  rec = _playback_fi.site_record(site, params, tap, spec.spec, entry["step"])
  rec.update(source="ops", capture=entry["file"], golden_from=frm,
             golden_rerun_bit_equal=same)
  return rec


def playback_ops(source: str | os.PathLike, kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec",
                 *,
                 select: str | Sequence[str] | None = None,
                 phase: str | Sequence[str] | None = "fwd",
                 steps: Sequence[int] | None = None,
                 campaign_dir: str | os.PathLike | None = None,
                 progress: Callable[[str], None] | None = None) -> OpsResult:
  """Op-level playback of a KUT on captured site inputs (no model).

  >>> r = playback_ops("runs/c1", "native:conv2d:in_bf16")  # doctest: +SKIP
  >>> r.records[0]["diagnosis"]["model"]                     # doctest: +SKIP
  'precision:bf16'

  Args:
    source: a campaign directory or its ``captures/`` folder.
    kut_spec: a spec of :func:`peat_jax.resolve_kut`.
    select: narrow the sites: an ``fnmatch`` pattern or site names.
    phase: site phase(s) to play back; None for every captured phase.
    steps: capture steps to play back (default: all captured).
    campaign_dir: where ``ops.msgpack`` goes (default: the captures
      directory's parent).
    progress: called with one line per record.

  Returns:
    An :class:`OpsResult`.

  Raises:
    PeatError: no captures, no matching record, a corrupt capture file
      (naming it), an unknown spec, a KUT output of another shape or dtype.
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  say = progress or (lambda s: None)
  cdir = captures_dir_of(source)
  campaign_dir = os.path.abspath(os.fspath(campaign_dir or
                                           os.path.dirname(cdir)))
  os.makedirs(campaign_dir, exist_ok=True)
  path = os.path.join(campaign_dir, OPS_FILE)
  kut = _kut.checked(kut_spec)  # parsed and checked here, once
  kut_spec = kut.name  # the records' key
  entries = select_entries(io.read_index(cdir), kut, select=select,
                           phase=phase, steps=steps)
  done = {(r["step"], r["site"]) for r in _files.read_records(path)
          if r.get("kind") == "site" and r.get("kut") == kut_spec}
  for i, e in enumerate(entries):
    tag = f"op {e['site']} step {e['step']} ({i + 1}/{len(entries)})"
    if (e["step"], e["site"]) in done:
      say(f"{tag}: done before, skipped")
      continue
    t0 = time.perf_counter()
    rec = op_record(e, io.load_record(cdir, e), kut)
    _files.append_records(path, [rec])
    d = rec["diagnosis"]
    say(f"{tag}: {d['model']} ({d['verdict']}), noise ratio "
        f"{rec['signature'].get('noise_ratio', float('nan')):.3g} "
        f"({time.perf_counter() - t0:.2f} s)")
  order: list[str] = []
  for e in sorted(entries, key=lambda e: tuple(e["address"])):
    if e["site"] not in order:
      order.append(e["site"])
  wanted = {(e["step"], e["site"]) for e in entries}
  recs = [r for r in _files.read_records(path)
          if r.get("kind") == "site" and r.get("kut") == kut_spec
          and (r["step"], r["site"]) in wanted]
  recs.sort(key=lambda r: (r["step"], order.index(r["site"])))
  return OpsResult(recs, order, _detector.localize(recs, order), path)
