"""(step, site) records of playback: float64 references, signatures and
diagnoses of many tapped sites of one step.

The float64 references of primitive sites run in one x64 executable that
splits them into float32 halves on the device, and all their signatures in
one more (:class:`DeviceReferences`, ``analyze_split_many``); composite
sites are referenced on host copies."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import detector as _detector
from peat_jax import sites as _sites
from peat_jax.core import PeatError
from peat_jax.profiler.files import signature_record
from peat_jax.profiler.playback_fi._probe_refs import ProbeReferences
from peat_jax.profiler.playback_fi._timing import NO_LAPS
from peat_jax.profiler.files import tag_backward
from peat_jax.kernels import kut as _kut


def _reduction(site: _sites.Site, params: dict) -> int:
  shapes = site.in_shapes
  if site.kernel == "dot_general":
    return _kut.dot_general_reduction(shapes, params["dimension_numbers"])
  if site.kernel == "conv_general_dilated":
    rhs = shapes[1]
    out_dim = params["dimension_numbers"].rhs_spec[0]
    return int(np.prod(rhs) // rhs[out_dim])
  return int(shapes[0][-1]) if shapes and shapes[0] else 1


def _site_reference(site: _sites.Site, params: dict, inputs) -> Any:
  """float64 reference of a site's golden kernel on its tapped inputs.

  Under ``scan`` the taps have a leading iteration axis: the reference is
  computed per iteration. None when no reference applies. A composite's
  backward site (``params["vjp"]``, see ``kernels.kut.recording``) gets
  the VJP of the float64 reference: a list, one cotangent per output.
  """
  try:
    if params.get("vjp"):
      fn = _analyzer.reference_vjp_fn(site.kernel, params)
      if fn is None:
        return None
    else:
      fn = _analyzer.reference_fn(site.kernel, params)
    inputs = [np.asarray(x) for x in inputs]
    if "scan" in site.where and inputs and inputs[0].ndim == len(
        site.in_shapes[0]) + 1:
      outs = [fn(*[x[i] for x in inputs]) for i in range(inputs[0].shape[0])]
      if isinstance(outs[0], list):
        return [np.stack([o[j] for o in outs]) for j in range(len(outs[0]))]
      return np.stack([np.asarray(o) for o in outs])
    return fn(*inputs)
  except (PeatError, TypeError, ValueError):
    return None


class DeviceReferences:
  """float64 references of a Player's primitive sites, on the device.

  One jitted call (traced with x64) computes the references of the sites
  asked for and splits each into float32 (hi, lo) halves: neither the site
  inputs nor any float64 array come to the host. Composite sites (no
  traceable golden kernel) keep the host path (``_site_reference``).
  """

  def __init__(self, sites: Sequence[tuple[_sites.Site, dict]]):
    """Args: sites: ``(site, params)`` per site, as in ``site_records``."""
    self.fns = [_analyzer.reference_traced(site.kernel, params)
                for site, params in sites]
    self.probe_refs = ProbeReferences(self.fns,
                                      [site.kernel for site, _ in sites])

    def refs(which, inputs):
      return [_analyzer.split_on_device(
          self.fns[i](*[x.astype(jnp.float64) for x in xs]))
              for i, xs in zip(which, inputs)]
    self._jit = jax.jit(refs, static_argnums=0)

  def usable(self, i: int, site: _sites.Site, tp: _sites.Tap) -> bool:
    """Site ``i``'s tap is one plain call (not scan-stacked, one output)."""
    return (self.fns[i] is not None and not isinstance(tp.golden, tuple)
            and len(tp.inputs) == len(site.in_shapes) and all(
                np.shape(x) == tuple(s)
                for x, s in zip(tp.inputs, site.in_shapes)))

  def __call__(self, which: tuple[int, ...], inputs: list) -> list:
    """``[(hi, lo)]`` of the sites ``which`` from their input tuples."""
    with jax.enable_x64(True):
      return self._jit(which, inputs)


def _device_signatures(sites, refs: DeviceReferences) -> dict[int, Any]:
  """Signatures of the sites ``refs`` can serve: two dispatches in all."""
  which = tuple(i for i, (site, _, tp) in enumerate(sites)
                if refs.usable(i, site, tp))
  if not which:
    return {}
  hilo = refs(which, [tuple(sites[i][2].inputs) for i in which])
  ok = [(i, hl) for i, hl in zip(which, hilo)
        if np.shape(hl[0]) == np.shape(sites[i][2].golden)]
  sigs = _analyzer.analyze_split_many(
      [sites[i][2].kut for i, _ in ok], [sites[i][2].golden for i, _ in ok],
      [hl[0] for _, hl in ok], [hl[1] for _, hl in ok], to_host=True)
  return {i: sig for (i, _), sig in zip(ok, sigs)}


def _vjp_signatures(site: _sites.Site, params: dict, tp: _sites.Tap) -> list:
  """Signatures of a composite's backward site: one per cotangent.

  Returns:
    ``[(output index or None, signature)]``: one entry (index None) when
    the site has one output, else one per output.
  """
  ref = _site_reference(site, params, tp.inputs)
  many = isinstance(tp.golden, tuple)
  tests = tp.kut if many else (tp.kut,)
  golds = tp.golden if many else (tp.golden,)
  refs = ref if isinstance(ref, list) else [None] * len(golds)
  out = []
  for i, (t, g, r) in enumerate(zip(tests, golds, refs)):
    if r is not None and np.shape(r) != np.shape(g):
      r = None
    out.append((i if many else None, _analyzer.analyze(t, g, r)))
  return out


def _signature(site: _sites.Site, params: dict, tp: _sites.Tap):
  """Dispatches one site's signature (not waited for) and its context."""
  ref = _site_reference(site, params, tp.inputs)
  test, gold = tp.kut, tp.golden
  if isinstance(gold, tuple):
    test, gold = test[0], gold[0]
    ref = ref[0] if isinstance(ref, (tuple, list)) else ref
  if ref is not None and np.shape(ref) != np.shape(gold):
    ref = None
  return (_analyzer.analyze(test, gold, ref), _reduction(site, params), ref)


def _port_probe(site, params, tp, sig, ref=None, pre=None) -> dict | None:
  """The port probe of a site whose signature calls for it
  (peat.analyzer.needs_probe: a dense error beyond the golden kernel's
  noise), or None: the composite's known constants and forms, and the
  kernel on its inputs rounded to narrower formats."""
  if not _analyzer.needs_probe(sig) or isinstance(tp.golden, tuple):
    return None
  if len(tp.inputs) != len(site.in_shapes) or any(
      np.shape(x) != tuple(s) for x, s in zip(tp.inputs, site.in_shapes)):
    return None  # scan-stacked taps: one probe per iteration is not kept
  inputs = [np.asarray(x) for x in tp.inputs]
  hyps = None
  if pre is not None:  # computed on the device (profiler.playback._probe_refs)
    ref, hyps = pre
  if ref is None:
    ref = _site_reference(site, params, inputs)
  if ref is None:
    return None
  args, kwargs = inputs, {}
  if site.composite and "template" in params:
    treedef, leaves, is_array = params["template"]
    it = iter(inputs)
    try:
      args, kwargs = jax.tree.unflatten(treedef, [
          next(it) if a else v for v, a in zip(leaves, is_array)])
    except (TypeError, ValueError, StopIteration):
      return None
  try:
    return _analyzer.port_probe(
        site.kernel, args, kwargs, np.asarray(tp.kut), np.asarray(tp.golden),
        ref, reference_fn=lambda *xs: _site_reference(site, params, xs),
        reference_args=inputs, hypotheses=hyps, signature="defer")
  except (TypeError, ValueError, PeatError):
    return None


def _probe_references(sites, pending, host, device_refs) -> dict:
  """The port probe's float64 references of the device-analyzed sites that
  need a probe, computed on the device at once (site index -> (reference,
  hypotheses))."""
  if not device_refs:
    return {}
  which = tuple(p[0] for p, sig in zip(pending, host)
                if p[5] and _analyzer.needs_probe(sig))
  return device_refs.probe_refs(which, [tuple(sites[i][2].inputs)
                                        for i in which])


def site_records(sites: Sequence[tuple[_sites.Site, dict, _sites.Tap]],
                 kut_spec: str, step: int,
                 device_refs: DeviceReferences | None = None, *,
                 backward: str = "golden", laps=NO_LAPS) -> list[dict]:
  """(step, site) records of many sites of one step.

  Every signature is dispatched before any is read, then all come to the
  host in one transfer; the Detector runs on host copies.

  A composite's backward site with several outputs (the cotangents of
  several arguments) gets one record per output, named
  :func:`output_name` and holding ``"output": i``.

  Args:
    sites: ``(site, params, tap)`` triples: the tapped site, its call
      parameters as recorded by ``kut.recording``, and its tap (inputs,
      golden and KUT outputs of one step).
    kut_spec: the KUT's spec, stored with the records.
    step: the step the taps come from.
    device_refs: the sites' :class:`DeviceReferences` (None: every float64
      reference is computed on host copies); same records either way.
    backward: the campaign's backward setting; ``"kut"`` is stored in the
      records (``"backward": "kut"``), ``"golden"`` is not (records without
      the field are forward-only ones, as before the setting existed).
    laps: a ``profiler.playback._timing.Laps`` to time the phases (benchmarks).

  Returns:
    One msgpack-ready dict (``kind == "site"``) per site (or output), in
    order.
  """
  laps.start()
  sites = [(site, params, as_trained(params, tp)) for site, params, tp in sites]
  done = _device_signatures(sites, device_refs) if device_refs else {}
  # (site index, output index or None, signature, reduction, reference,
  # on host)
  pending = []
  for i, (site, params, tp) in enumerate(sites):
    if i in done:
      pending.append((i, None, done[i], _reduction(site, params), None,
                      True))
    elif params.get("vjp"):
      red = _reduction(site, params)
      pending += [(i, k, sig, red, None, False)
                  for k, sig in _vjp_signatures(site, params, tp)]
    else:
      sig, red, ref = _signature(site, params, tp)
      pending.append((i, None, sig, red, ref, False))
  # Signatures of `done` are on the host already (packed transfer).
  fetched = iter(jax.device_get([p[2] for p in pending if not p[5]]))
  host = [p[2] if p[5] else next(fetched) for p in pending]
  laps.lap("references and signatures")
  pre = _probe_references(sites, pending, host, device_refs)
  probes = [None if k is not None else _port_probe(
      sites[i][0], sites[i][1], sites[i][2], sig, ref, pre.get(i))
            for (i, k, _, _, ref, _), sig in zip(pending, host)]
  _analyzer.probe_signatures(probes, [sites[p[0]][2].kut for p in pending])
  laps.lap("port probe")
  out = []
  for (i, k, _, red, _, _), sig, probe in zip(pending, host, probes):
    site, params, tp = sites[i]
    context = {"kernel": site.kernel, "reduction": red}
    if probe is not None:
      context["port"] = probe
    diag = _detector.detect(sig, context=context)
    laps.lap("detector")
    rec = {
        "kind": "site", "kut": kut_spec, "step": step,
        "site": site.name if k is None else output_name(site.name, k),
        "kernel": site.kernel, "phase": site.phase, "reduction": red,
        "signature": signature_record(sig),
        "diagnosis": _detector.diagnosis_record(diag)}
    if probe is not None:
      rec["port"] = {key: v for key, v in probe.items()
                     if key not in ("evidence", "signature")}
    if k is not None:
      rec["output"] = k
    if params.get("cotangent_dtype"):
      rec["compared_in"] = params["cotangent_dtype"]
    out.append(tag_backward(rec, backward))
    laps.lap("records")
  return out


def as_trained(params: dict, tp: _sites.Tap) -> _sites.Tap:
  """A transposed site's tap in the dtype training reads its result in.

  Where the operand's cotangent is narrower than the site's output
  (``params["cotangent_dtype"]``, see ``sites._pairing``), golden's
  result is rounded to it one equation later and the KUT's VJP returns
  it already rounded (JAX's rule); both are compared in that dtype, so
  the rounding they share is not read as the KUT's precision.

  Args:
    params: the site's record parameters.
    tp: its tap.

  Returns:
    The tap, its golden and KUT outputs cast to the cotangent's dtype
    (unchanged without ``cotangent_dtype`` or a KUT output).
  """
  dtype = params.get("cotangent_dtype")
  if not dtype or tp.kut is None or isinstance(tp.golden, tuple):
    return tp
  return tp._replace(golden=jnp.asarray(tp.golden).astype(dtype),
                     kut=jnp.asarray(tp.kut).astype(dtype))


def output_name(site: str, output: int) -> str:
  """The record name of one output of a site with several: ``<site>/d<i>``."""
  return f"{site}/d{output}"


def site_record(site: _sites.Site, params: dict, tp: _sites.Tap,
                kut_spec: str, step: int) -> dict:
  """One (step, site) record: signature vs golden and float64, diagnosis.

  Args:
    site: the tapped site.
    params: its call parameters, as recorded by ``kut.recording``.
    tp: the site's tap (inputs, golden and KUT outputs of one step).
    kut_spec: the KUT's spec, stored with the record.
    step: the step the tap comes from.

  Returns:
    A msgpack-ready dict (``kind == "site"``); see :func:`site_records`
    for many sites of one step.
  """
  return site_records([(site, params, tp)], kut_spec, step)[0]


class _SharedReferences:
  """A Player's device references, shared with the other KUTs of a group.

  A site's float64 reference depends only on its golden inputs, which are
  the same for every KUT played back from the same state: the first KUT
  to ask for a site computes its ``(hi, lo)``, the others reuse it. The
  cache lives for one checkpoint.
  """

  def __init__(self, inner: DeviceReferences, names: Sequence[str],
               cache: dict):
    self._inner, self._names, self._cache = inner, list(names), cache

  def usable(self, i: int, site: _sites.Site, tp: _sites.Tap) -> bool:
    return self._inner.usable(i, site, tp)

  def probe_refs(self, which: tuple[int, ...], inputs: list) -> dict:
    """The probe's references (ProbeReferences), shared the same way."""
    key = lambda i: ("probe", self._names[i])
    missing = tuple(i for i in which if key(i) not in self._cache)
    if missing:
      given = dict(zip(which, inputs))
      got = self._inner.probe_refs(missing, [given[i] for i in missing])
      self._cache.update((key(i), v) for i, v in got.items())
    return {i: self._cache[key(i)] for i in which}

  def __call__(self, which: tuple[int, ...], inputs: list) -> list:
    missing = tuple(i for i in which if self._names[i] not in self._cache)
    if missing:
      given = dict(zip(which, inputs))
      got = self._inner(missing, [given[i] for i in missing])
      self._cache.update(
          (self._names[i], hl) for i, hl in zip(missing, got))
    return [self._cache[self._names[i]] for i in which]
