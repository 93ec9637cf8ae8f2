"""(step, site) records of playback: float64 references, signatures and
diagnoses of many tapped sites of one step.

The float64 references of primitive sites run in one x64 executable that
splits them into float32 halves on the device, and all their signatures in
one more (:class:`DeviceReferences`, ``analyze_split_many``); composite
sites are referenced on host copies."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax.analyzer import probes as _probes_api
from peat_jax.analyzer.signature import split_reference as _split_reference
from peat_jax import detector as _detector
from peat_jax import sites as _sites
from peat_jax.core import PeatError
from peat_jax.profiler.files import signature_record
from peat_jax.profiler.playback_fi._carried_probe import CarriedProbes
from peat_jax.profiler.playback_fi._probe_refs import ProbeReferences
from peat_jax.profiler.playback_fi._timing import NO_LAPS
from peat_jax.profiler.files import tag_backward
from peat_jax.kernels import kut as _kut


def reduction_length(site: _sites.Site, params: dict) -> int:
  """The reduction length K of a site's call (the Detector's context)."""
  shapes = site.in_shapes
  if site.kernel == "dot_general":
    return _kut.dot_general_reduction(shapes, params["dimension_numbers"])
  if site.kernel == "conv_general_dilated":
    rhs = shapes[1]
    out_dim = params["dimension_numbers"].rhs_spec[0]
    return int(np.prod(rhs) // rhs[out_dim])
  return int(shapes[0][-1]) if shapes and shapes[0] else 1


def site_reference(site: _sites.Site, params: dict, inputs) -> Any:
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
  inputs nor any float64 array come to the host (the float64 reference
  stays on the device for the port probe's tries, :class:`CarriedProbes`).
  Composite sites (no traceable golden kernel) keep the host path
  (``site_reference``).
  """

  def __init__(self, sites: Sequence[tuple[_sites.Site, dict]]):
    """Args: sites: ``(site, params)`` per site, as in ``site_records``."""
    self.fns = [_analyzer.reference_traced(site.kernel, params)
                for site, params in sites]
    self.probe_refs = ProbeReferences(self.fns)
    self.carried = CarriedProbes()

    def refs(which, inputs):
      out = []
      for i, xs in zip(which, inputs):
        r = self.fns[i](*[x.astype(jnp.float64) for x in xs])
        out.append((*_analyzer.split_on_device(r), r))
      return out
    self._jit = jax.jit(refs, static_argnums=0)

  def hypotheses(self, keys: Sequence[tuple[int, str]],
                 inputs: list) -> list:
    """The port probe's float64 hypotheses ``inputs_<fmt>`` of the
    ``(site index, format)`` keys, device arrays
    (``ProbeReferences.device``)."""
    return self.probe_refs.device(keys, inputs)

  def usable(self, i: int, site: _sites.Site, tp: _sites.Tap) -> bool:
    """Site ``i``'s tap is one plain call (not scan-stacked, one output)."""
    return (self.fns[i] is not None and not isinstance(tp.golden, tuple)
            and len(tp.inputs) == len(site.in_shapes) and all(
                np.shape(x) == tuple(s)
                for x, s in zip(tp.inputs, site.in_shapes)))

  def __call__(self, which: tuple[int, ...], inputs: list) -> list:
    """``[(hi, lo, reference)]`` of the sites ``which`` from their input
    tuples: the float64 reference's float32 halves and itself (the port
    probe reads it), device arrays."""
    with jax.enable_x64(True):
      return self._jit(which, inputs)


class _Pending(NamedTuple):
  """One record on its way: the pair, its reference, its screen."""

  i: int  # site index
  k: int | None  # output index of a site with several, or None
  test: Any
  gold: Any
  ref: Any  # host float64 reference, or None (device halves instead)
  hilo: tuple | None  # device (hi, lo) of the reference
  ref64: Any  # ... and the float64 reference itself (device), or None
  sig: Any  # the Signature (screened; completed once flagged)
  screen: Any  # its analyzer.Screen


def _device_screens(sites, refs: DeviceReferences) -> list[_Pending]:
  """Screens of the sites ``refs`` can serve: two dispatches in all (the
  float64 references, then every screen), NumPy fields."""
  which = tuple(i for i, (site, _, tp) in enumerate(sites)
                if refs.usable(i, site, tp))
  if not which:
    return []
  hilo = refs(which, [tuple(sites[i][2].inputs) for i in which])
  ok = [(i, hl) for i, hl in zip(which, hilo)
        if np.shape(hl[0]) == np.shape(sites[i][2].golden)]
  got = _analyzer.screen_split_many(
      [sites[i][2].kut for i, _ in ok], [sites[i][2].golden for i, _ in ok],
      [hl[0] for _, hl in ok], [hl[1] for _, hl in ok], to_host=True)
  return [_Pending(i, None, sites[i][2].kut, sites[i][2].golden, None,
                   hl[:2], hl[2], sig, scr)
          for (i, hl), (sig, scr) in zip(ok, got)]


def _host_screens(i: int, site: _sites.Site, params: dict,
                  tp: _sites.Tap, one_off: bool = False) -> list[_Pending]:
  """Screens (dispatched, not fetched) of a site referenced on host
  copies: a forward site (one record: its first output), or a composite's
  backward site (one record per cotangent); ``one_off``: in the record's
  size bucket (:func:`site_records`)."""
  ref = site_reference(site, params, tp.inputs)
  many = isinstance(tp.golden, tuple)
  if params.get("vjp"):
    tests = tp.kut if many else (tp.kut,)
    golds = tp.golden if many else (tp.golden,)
    refs = ref if isinstance(ref, list) else [None] * len(golds)
    keys = list(range(len(golds))) if many else [None]
  else:
    tests, golds = ((tp.kut[0],), (tp.golden[0],)) if many else (
        (tp.kut,), (tp.golden,))
    refs = [ref[0] if many and isinstance(ref, (tuple, list)) else ref]
    keys = [None]
  out = []
  for k, t, g, r in zip(keys, tests, golds, refs):
    if r is not None and np.shape(r) != np.shape(g):
      r = None
    if one_off:  # its size bucket's executable, shared by its shapes
      sig, scr = _analyzer.screen(t, g, r)
      out.append(_Pending(i, k, t, g, r, None, None, sig, scr))
      continue
    # At the record's own shape, as the device-referenced screens: the
    # same record either way (not `analyzer.screen`'s size bucket).
    hi, lo = _host_halves(r, g)
    (sig, scr), = _analyzer.screen_split_many([t], [g], [hi], [lo])
    out.append(_Pending(i, k, t, g, r, None, None, sig, scr))
  return out


def _host_halves(ref, golden) -> tuple:
  """The (hi, lo) float32 halves of a host float64 reference (None, None
  without one)."""
  if ref is None:
    return None, None
  return _split_reference(ref, np.shape(golden), batched=False)


def _decompose(flagged: Sequence[_Pending], one_off: bool = False
               ) -> list[_Pending]:
  """The flagged records completed by their decomposition (each at its
  own shape, with its device halves or its host reference's; one
  transfer for all; ``one_off``: each in its size bucket, from its host
  reference)."""
  if one_off:
    return [p._replace(sig=_analyzer.with_decomposition(
        p.sig, jax.device_get(_analyzer.decomposition(p.test, p.gold,
                                                      p.ref))))
            for p in flagged]
  halves = [p.hilo if p.hilo is not None else _host_halves(p.ref, p.gold)
            for p in flagged]
  decs = _analyzer.decompose_split_many(
      [p.test for p in flagged], [p.gold for p in flagged],
      [h for h, _ in halves], [lo for _, lo in halves], to_host=True)
  return [p._replace(sig=_analyzer.with_decomposition(p.sig, d))
          for p, d in zip(flagged, decs)]


def _port_probe(site, params, tp, sig, ref=None, pre=None,
                only: str | None = None,
                screened: bool = False) -> dict | None:
  """The port probe of a site whose signature calls for it
  (peat.analyzer.needs_probe: a dense error beyond the golden kernel's
  noise; ``screened``: the signature is the screen's), or None: the
  composite's known constants and forms, and the kernel on its inputs
  rounded to narrower formats (``only``: that hypothesis alone)."""
  if not _analyzer.needs_probe(sig, screened=screened) or isinstance(
      tp.golden, tuple):
    return None
  if len(tp.inputs) != len(site.in_shapes) or any(
      np.shape(x) != tuple(s) for x, s in zip(tp.inputs, site.in_shapes)):
    return None  # scan-stacked taps: one probe per iteration is not kept
  inputs = [np.asarray(x) for x in tp.inputs]
  hyps = None
  if pre is not None:  # the device's (_probe_inputs)
    ref, hyps = pre
  if ref is None:
    ref = site_reference(site, params, inputs)
  if ref is None:
    return None
  # A primitive's parameters (dimension_numbers, ...) tell the grammar
  # its contraction and layouts.
  args, kwargs = inputs, ({} if site.composite else {
      k: v for k, v in params.items() if k != "vjp"})
  kind = site.kernel
  if params.get("vjp"):
    # A composite's backward site: its inputs are the forward call's
    # arrays and the cotangents, its reference the VJP; the grammar reads
    # them as one call of that VJP (no forward family applies).
    kind = f"{site.kernel}:vjp"
  elif site.composite and "template" in params:
    treedef, leaves, is_array = params["template"]
    it = iter(inputs)
    try:
      args, kwargs = jax.tree.unflatten(treedef, [
          next(it) if a else v for v, a in zip(leaves, is_array)])
    except (TypeError, ValueError, StopIteration):
      return None
  try:
    return _analyzer.port_probe(
        kind, args, kwargs, np.asarray(tp.kut), np.asarray(tp.golden),
        ref, reference_fn=lambda *xs: site_reference(site, params, xs),
        reference_args=inputs, hypotheses=hyps, signature="defer",
        only=only)
  except (TypeError, ValueError, PeatError):
    return None


def probe_class(sig) -> str:
  """A record's screened class, as the probe cache keys it: what the
  probe would be asked (a dense error, with or without NaN/Inf that
  golden does not have). ``sig``: a Signature or a record's
  ``"signature"`` dict."""
  n = sig["n_nonfinite_mismatch"] if isinstance(sig, dict) else (
      sig.n_nonfinite_mismatch)
  return "dense, non-finite" if int(np.asarray(n)) > 0 else "dense"


class ProbeCache:
  """A campaign's port probes, one per site (and screened class).

  The first record of a site that needs the probe runs it whole; the
  site's later records carry its answer (:meth:`carried`): the hypothesis
  it found best is tried alone on the new record, which gets its own
  ratio, distances, fitted constant and (where it explains) re-based
  signature. Where that hypothesis no longer answers as it did (explains
  where it did not, or the other way), the record runs the probe whole
  again and its answer is carried from then on. A probe that found no
  hypothesis to try is carried as it is.
  """

  def __init__(self):
    self._found: dict[tuple[str, str], tuple[int, dict | None]] = {}

  @classmethod
  def from_records(cls, records: Sequence[dict]) -> "ProbeCache":
    """The cache a campaign held after playing ``records`` (its complete
    steps, in step order): a resumed playback, or a worker that takes
    over after a crash, carries the probes an uninterrupted run would
    (its records are then those of the uninterrupted run).

    Args:
      records: one campaign's records (one KUT and backward setting);
        site records the probe decided whole (``decided_by: probe``) count.

    Returns:
      The cache.
    """
    cache = cls()
    whole = [r for r in records if r.get("kind") == "site"
             and r.get("decided_by") == "probe"]
    for r in sorted(whole, key=lambda r: r["step"]):
      cache.keep(r["site"], probe_class(r["signature"]), int(r["step"]),
                 r.get("port"))
    return cache

  def carried(self, name: str, cls: str, step: int
              ) -> tuple[int, dict | None] | None:
    """``(step, probe)`` found at another step for the record name and
    class, or None (a step played again probes whole again: its records
    are those of its first play)."""
    got = self._found.get((name, cls))
    return None if got is None or got[0] == step else got

  def keep(self, name: str, cls: str, step: int, probe: dict | None) -> None:
    """Keeps a whole probe's answer (without its arrays)."""
    self._found[(name, cls)] = (step, None if probe is None else {
        k: v for k, v in probe.items()
        if k not in ("hypothesis", "hypothesis_split", "signature")})


#: Carried probes whose answer needs no decomposition of the record: the
#: kernel on rounded inputs (the Detector reads its faults against the
#: probe's synthesized base: detector.hypotheses._detect._rebased).
_ROUNDED_INPUTS = ("precision", "accumulation")


class _Try(NamedTuple):
  """A flagged record's port probe tried on the device."""

  p: _Pending
  carried: tuple | None  # (step, probe) carried from (ProbeCache), or None
  names: tuple[str, ...]  # the hypotheses tried (inputs_<fmt>), in order


class _Plan(NamedTuple):
  """How the port probe treats one flagged record (:func:`_plan`)."""

  p: _Pending  # the record, screened
  name: str  # its record name
  want: bool  # its screened signature calls for the probe
  carried: tuple | None  # (step, probe) its site carries, or None
  only: str | None  # the carried probe's hypothesis, tried alone
  light: bool  # ... which explained by rounded inputs: tried on the screen
  whole: bool  # probed whole before any decomposition (rounded inputs only)
  on_device: bool  # tried on the device (CarriedProbes)


#: ``answers.get(j, UNTRIED)``: the record was not probed whole before
#: its decomposition (None is an answer: nothing beyond golden's noise).
_UNTRIED = "untried"


def _plan(sites, p: _Pending, cache: ProbeCache | None, step: int,
          device_refs) -> _Plan:
  """What the probe does with flagged record ``p``: carried or whole,
  before or after its decomposition, on the device or the host."""
  site = sites[p.i][0]
  name = _record_name(site.name, p.k)
  want = p.k is None and _analyzer.needs_probe(p.sig, screened=True)
  carried = (cache.carried(name, probe_class(p.sig), step)
             if cache and want else None)
  found = None if carried is None else carried[1]
  only = None if found is None else found["name"]
  light = only is not None and bool(found.get("explains")) and str(
      found.get("model", "")).split(":")[0] in _ROUNDED_INPUTS
  whole = (want and carried is None and not site.composite
           and _probes_api.precision_only(site.kernel))
  device = bool(device_refs) and p.hilo is not None
  on_device = device and (whole or (light and only.startswith("inputs_")))
  return _Plan(p, name, want, carried, only, light, whole, on_device)


def _device_probes(sites, tries: Sequence[_Try], device_refs) -> dict:
  """Port probes of primitive sites tried on the device
  (:class:`CarriedProbes`): a carried input-precision hypothesis alone, or
  every input-precision hypothesis of a site probed whole (a kind whose
  probe tries nothing else: ``peat.analyzer.precision_only``), all in one
  executable on the screen's float64 references and the hypotheses'
  own executables (``ProbeReferences``).

  Returns:
    ``{index of the try: probe or None}``: the answers, each as
    ``port_probe`` gives it on the same hypotheses (None: within the
    golden kernel's noise), a carried one with ``carried_from``; an
    explaining one with the hypothesis's device halves
    (``hypothesis_split``) for its re-based Signature. A carried try that
    no longer explains has no entry.
  """
  if not tries:
    return {}
  flat = [(n, t, name) for n, t in enumerate(tries) for name in t.names]
  keys = tuple((t.p.i, name[len("inputs_"):]) for _, t, name in flat)
  hyps = device_refs.hypotheses(
      keys, [tuple(sites[t.p.i][2].inputs) for _, t, _ in flat])
  got = device_refs.carried(
      keys, [t.p.test for _, t, _ in flat], [t.p.gold for _, t, _ in flat],
      [t.p.ref64 for _, t, _ in flat], hyps)
  by_try: dict[int, list] = {}
  for (n, _, name), g in zip(flat, got):
    by_try.setdefault(n, []).append((name, g))
  out = {}
  for n, t in enumerate(tries):
    found = _device_answer(t, by_try[n])
    if found is not None or t.carried is None:
      out[n] = found
  return out


def _device_answer(t: _Try, tried: list) -> dict | None:
  """One device try's answer (None: nothing beyond golden's noise, or a
  carried hypothesis that no longer explains)."""
  d_ref, d_gold = tried[0][1].d_ref, tried[0][1].d_gold
  if not d_ref > _probes_api.BEYOND_GOLDEN * d_gold:
    return None
  name, g = min(tried, key=lambda ng: ng[1].ratio)  # the first on a tie
  fmt, mode = _analyzer.variant_rounding(name[len("inputs_"):])
  found = _probes_api.probe_answer(
      f"precision:{fmt}", name, _probes_api.precision_sentence(fmt, mode),
      list(t.names), g.ratio, g.distance, d_ref, d_gold,
      extra={"where": "inputs", "rounding": mode})
  if found["explains"]:
    found["hypothesis_split"] = g.split
  if t.carried is None:
    return found
  return {**found, "carried_from": t.carried[0]} if found["explains"] else None


def _device_answers(sites, plans: Sequence[_Plan], device_refs) -> dict:
  """``{plan index: probe or None}`` of the plans tried on the device."""
  on_device = [j for j, pl in enumerate(plans) if pl.on_device]
  tries = [_Try(plans[j].p, plans[j].carried,
                (plans[j].only,) if plans[j].carried is not None else tuple(
                    f"inputs_{f}" for f in _analyzer.probe_formats(
                        sites[plans[j].p.i][0].kernel)))
           for j in on_device]
  got = _device_probes(sites, tries, device_refs)
  return {on_device[n]: found for n, found in got.items()}


def _probe_inputs(sites, pending: Sequence[_Pending], device_refs) -> dict:
  """Site index -> (float64 reference, {hypothesis name: float64 output})
  on the host, for the probe whole on the host of device-referenced
  records (the screen's reference, the hypotheses' executables: the values
  the device tries read)."""
  if not pending:
    return {}
  keys = [(p.i, fmt) for p in pending
          for fmt in _analyzer.probe_formats(sites[p.i][0].kernel)]
  hyps = device_refs.hypotheses(
      keys, [tuple(sites[i][2].inputs) for i, _ in keys])
  refs, hyps = jax.device_get(([p.ref64 for p in pending], hyps))
  out = {p.i: (np.asarray(r), {}) for p, r in zip(pending, refs)}
  for (i, fmt), h in zip(keys, hyps):
    out[i][1][f"inputs_{fmt}"] = np.asarray(h)
  return out


def _host_inputs(sites, plans: Sequence[_Plan], answers: dict,
                 device_refs) -> dict:
  """:func:`_probe_inputs` of the device-referenced records probed on the
  host: another kind, a carried hypothesis of another kind, a device try
  that no longer explains."""
  def on_host(j: int, pl: _Plan) -> bool:
    if pl.on_device:
      return j not in answers
    return pl.carried is None or pl.only is not None
  return _probe_inputs(sites, [
      pl.p for j, pl in enumerate(plans)
      if pl.want and pl.p.hilo is not None and on_host(j, pl)], device_refs)


def _before_decomposition(sites, plans: Sequence[_Plan], answers: dict,
                          pre: dict) -> dict:
  """``{plan index: probe}`` of the records a probe explains by rounded
  inputs on their screened signature (no decomposition of their own):
  those probed whole on the device, the others of such kinds probed whole
  on the host (their answers join ``answers``), and the carried rounded
  inputs tried alone on the host."""
  for j, pl in enumerate(plans):
    if pl.whole and not pl.on_device:
      answers[j] = _port_probe(*sites[pl.p.i], pl.p.sig, pl.p.ref,
                               pre.get(pl.p.i), screened=True)
  kept = {j: v for j, v in answers.items()
          if v is not None and v["explains"]}
  for j, pl in enumerate(plans):
    if pl.light and not pl.on_device:
      found = _port_probe(*sites[pl.p.i], pl.p.sig, pl.p.ref,
                          pre.get(pl.p.i), only=pl.only, screened=True)
      if found is not None and found.get("explains"):
        kept[j] = {**found, "carried_from": pl.carried[0]}
  return kept


def _after_decomposition(sites, pl: _Plan, p: _Pending, tried,
                         pre: dict) -> tuple[dict | None, str]:
  """The probe and path of a decomposed record ``p``: none, its site's
  carried hypothesis where it answers as it did, else the probe whole (run
  before the decomposition already where ``tried`` is not
  :data:`_UNTRIED`: kept where the decomposed signature calls for it)."""
  if not pl.want:
    return None, "decomposition"
  if pl.carried is not None and pl.only is None:  # nothing applied: as found
    return None, "carried probe"
  args = (*sites[p.i], p.sig, p.ref, pre.get(p.i))
  if pl.only is not None and not pl.light:
    found = _port_probe(*args, only=pl.only)
    if found is not None and bool(found.get("explains")) == bool(
        pl.carried[1].get("explains")):
      return {**found, "carried_from": pl.carried[0]}, "carried probe"
  if tried is not _UNTRIED:
    if not _analyzer.needs_probe(p.sig):
      return None, "probe"
    if tried is not None and tried.get("explains"):
      return tried, "probe"
    # No input precision explains it: the grammar's other slips, on the
    # host (the precisions tried already come with ``pre``).
  return _port_probe(*args), "probe"


def _probes(sites, flagged: Sequence[_Pending], device_refs,
            cache: ProbeCache | None, step: int, one_off: bool = False
            ) -> tuple[list[_Pending], list, list[str]]:
  """The port probe of each flagged record and the path that decided it.

  A record whose site carries a probe that explained it by rounded inputs
  tries that hypothesis first, on its screened signature: where it still
  explains, the record is diagnosed without a decomposition of its own.
  So is a record of a primitive site (a kind whose probe tries the
  input-precision hypotheses alone) probed whole on the device, where
  one of them explains it. Every other flagged record is decomposed, then
  probed where its signature calls for it: whole, or carrying its site's
  hypothesis (:class:`ProbeCache`).

  Returns:
    ``(records, probes, paths)``: the flagged records (decomposed, or
    screened where a probe explains them by rounded inputs), each one's probe
    (None where none runs) and path: ``decomposition`` (no probe),
    ``probe`` (run whole) or ``carried probe``.
  """
  plans = [_plan(sites, p, cache, step, device_refs) for p in flagged]
  answers = _device_answers(sites, plans, device_refs)
  pre = _host_inputs(sites, plans, answers, device_refs)
  kept = _before_decomposition(sites, plans, answers, pre)
  heavy = [j for j in range(len(plans)) if j not in kept]
  decomposed = dict(zip(heavy, _decompose([plans[j].p for j in heavy],
                                          one_off)))
  records, probes, paths = [], [], []
  for j, pl in enumerate(plans):
    if j in kept:  # explained by rounded inputs, on its screen
      p, probe = pl.p, kept[j]
      path = "carried probe" if pl.carried is not None else "probe"
    else:
      p = decomposed[j]
      probe, path = _after_decomposition(sites, pl, p,
                                         answers.get(j, _UNTRIED), pre)
    if path == "probe" and cache is not None:
      cache.keep(pl.name, probe_class(p.sig), step, probe)
    records.append(p)
    probes.append(probe)
    paths.append(path)
  if cache is not None and device_refs and "probe" in paths:
    _prepare_carried(sites, records, probes, paths, device_refs)
  return records, probes, paths


def _prepare_carried(sites, records, probes, paths, device_refs) -> None:
  """Compiles now the device tries the next checkpoint will run: those of
  this step's device-referenced records whose hypothesis (found whole
  here, or carried) explains by rounded inputs, in the order
  :func:`_device_probes` takes them."""
  tried = [(p, pr["name"][len("inputs_"):])
           for p, pr, path in zip(records, probes, paths)
           if path in ("probe", "carried probe") and p.hilo is not None
           and pr is not None and pr.get("explains")
           and str(pr.get("name", "")).startswith("inputs_")]
  if tried:
    device_refs.carried.prepare(
        tuple((p.i, f) for p, f in tried), [p.test for p, _ in tried],
        [p.gold for p, _ in tried])


def site_records(sites: Sequence[tuple[_sites.Site, dict, _sites.Tap]],
                 kut_spec: str, step: int,
                 device_refs: DeviceReferences | None = None, *,
                 backward: str = "golden", laps=NO_LAPS,
                 probe_cache: ProbeCache | None = None,
                 one_off: bool = False) -> list[dict]:
  """(step, site) records of many sites of one step: triage, then diagnose.

  Every record is screened (``peat.analyzer.screen_split_many``: the
  statistics pass and the golden envelope's facts, every screen dispatched
  before any is read, then one transfer); the screen decides the records
  inside the golden kernel's envelope (``peat.detector.triage``). The
  others get the noise-aware decomposition, the port probe where their
  signature calls for it (once per site with ``probe_cache``) and
  ``peat.detect``. Each record says which path decided it
  (``"decided_by"``: ``screen``, ``decomposition``, ``probe`` or
  ``carried probe``).

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
    probe_cache: the campaign's :class:`ProbeCache` (None: every record
      that calls for the probe runs it whole).
    one_off: the records' shapes come once (a fuzz's variants): each is
      screened and decomposed in its size bucket (``peat.analyzer.screen``,
      ``decomposition``: the executables every shape of the bucket
      shares), not at its own shape (an executable per shape, which a
      campaign's next checkpoint reuses). The same counts and diagnosis;
      float sums to their order. Host references only.

  Returns:
    One msgpack-ready dict (``kind == "site"``) per site (or output), in
    order.
  """
  laps.start()
  sites = [(site, params, as_trained(params, tp)) for site, params, tp in sites]
  pending = _device_screens(sites, device_refs) if device_refs else []
  served = {p.i for p in pending}
  for i, (site, params, tp) in enumerate(sites):
    if i not in served:
      pending += _host_screens(i, site, params, tp, one_off)
  pending.sort(key=lambda p: (p.i, -1 if p.k is None else p.k))
  fetched = jax.device_get([(p.sig, p.screen) for p in pending])
  pending = [p._replace(sig=sig, screen=scr)
             for p, (sig, scr) in zip(pending, fetched)]
  laps.lap("references and screens")
  triaged = [_detector.triage(p.sig, p.screen) for p in pending]
  flagged, probes, paths = _probes(
      sites, [p for p, d in zip(pending, triaged) if d is None],
      device_refs, probe_cache, step, one_off)
  laps.lap("decomposition and port probe of flagged records")
  _analyzer.probe_signatures(
      probes, [p.test for p in flagged],
      cleared=lambda sig, scr: _detector.triage(sig, scr) is not None)
  laps.lap("re-based signatures of the probes")
  done = iter(zip(flagged, probes, paths))
  out = []
  for p, diag in zip(pending, triaged):
    site, params, tp = sites[p.i]
    red = reduction_length(site, params)
    probe, path = None, "screen"
    if diag is None:
      p, probe, path = next(done)
      context = {"kernel": site.kernel, "reduction": red}
      if probe is not None:
        context["port"] = probe
      diag = _detector.detect(p.sig, context=context)
    laps.lap("detector")
    rec = {
        "kind": "site", "kut": kut_spec, "step": step,
        "site": _record_name(site.name, p.k),
        "kernel": site.kernel, "phase": site.phase, "reduction": red,
        "signature": signature_record(p.sig),
        "diagnosis": _detector.diagnosis_record(diag),
        "decided_by": path}
    if probe is not None:
      rec["port"] = {key: v for key, v in probe.items()
                     if key not in ("evidence", "signature")}
    if p.k is not None:
      rec["output"] = p.k
    if params.get("cotangent_dtype"):
      rec["compared_in"] = params["cotangent_dtype"]
    out.append(tag_backward(rec, backward))
    laps.lap("records")
  return out


def _record_name(site: str, output: int | None) -> str:
  return site if output is None else output_name(site, output)


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
                kut_spec: str, step: int,
                probe_cache: ProbeCache | None = None,
                one_off: bool = False) -> dict:
  """One (step, site) record: signature vs golden and float64, diagnosis.

  Args:
    site: the tapped site.
    params: its call parameters, as recorded by ``kut.recording``.
    tp: the site's tap (inputs, golden and KUT outputs of one step).
    kut_spec: the KUT's spec, stored with the record.
    step: the step the tap comes from.
    probe_cache: as :func:`site_records`.
    one_off: as :func:`site_records`.

  Returns:
    A msgpack-ready dict (``kind == "site"``); see :func:`site_records`
    for many sites of one step.
  """
  return site_records([(site, params, tp)], kut_spec, step,
                      probe_cache=probe_cache, one_off=one_off)[0]


class _SharedReferences:
  """A Player's device references, shared with the other KUTs of a group.

  A site's float64 reference depends only on its golden inputs, which are
  the same for every KUT played back from the same state: the first KUT
  to ask for a site computes its ``(hi, lo, reference)`` (or a probe
  hypothesis), the others reuse it. The cache lives for one checkpoint.
  """

  def __init__(self, inner: DeviceReferences, names: Sequence[str],
               cache: dict):
    self._inner, self._names, self._cache = inner, list(names), cache

  def usable(self, i: int, site: _sites.Site, tp: _sites.Tap) -> bool:
    return self._inner.usable(i, site, tp)

  @property
  def carried(self) -> CarriedProbes:
    """The carried probe's tries (CarriedProbes): not shared (they read
    the KUT's output)."""
    return self._inner.carried

  def hypotheses(self, keys: Sequence[tuple[int, str]],
                 inputs: list) -> list:
    """As ``DeviceReferences.hypotheses``, shared the same way (device
    arrays, per site and format)."""
    key = lambda k: ("hypothesis", self._names[k[0]], k[1])
    missing = [(k, xs) for k, xs in zip(keys, inputs)
               if key(k) not in self._cache]
    if missing:
      got = self._inner.hypotheses([k for k, _ in missing],
                                   [xs for _, xs in missing])
      self._cache.update((key(k), h) for (k, _), h in zip(missing, got))
    return [self._cache[key(k)] for k in keys]

  def __call__(self, which: tuple[int, ...], inputs: list) -> list:
    missing = tuple(i for i in which if self._names[i] not in self._cache)
    if missing:
      given = dict(zip(which, inputs))
      got = self._inner(missing, [given[i] for i in missing])
      self._cache.update(
          (self._names[i], hl) for i, hl in zip(missing, got))
    return [self._cache[self._names[i]] for i in which]
