"""Fuzzing from real inputs: the KUT on variants of captured site inputs.

:func:`fuzz` reads a campaign's captures (``peat.profile``), derives
variants of each selected site's real inputs (``_variants``: other batch
sizes, one row, lengths around multiples of 8..128 and 4096, past 2^14,
2^16 and 2^20, attention's q_len != kv_len, masks, packing, fewer KV heads,
head dims, magnitudes up to the overflow edge, denormals), runs the golden
kernel (``_goldens``) and the KUT on each, and records the pair through the
same Analyzer and Detector as playback (the record format of
``peat_jax.profiler.playback_fi.site_record``, triage included) in
``<campaign>/fuzz.msgpack``, plus:

* ``source``: ``"fuzz"``; ``variant``: its name (``"len=4097"``);
  ``family``: its family; ``seed``; ``capture``: the record it came from
  and ``captures``: its captures directory;
* ``golden_from``: ``primitive``, ``site`` (the task's marked function) or
  ``standard`` (the kind's standard golden; ``standard (the site's own
  refuses it)`` when the task's function refuses the variant);
* ``shapes``: the variant's input shapes;
* ``masked_rows``: only when the KUT wrote zeros in every fully masked
  attention query row (torch's and flash-attention's convention, where
  jax and the golden kernel average v): the sentence saying so; those rows
  are then compared as the golden's.

A KUT that raises, or returns another shape or dtype than the golden
kernel, on a variant the golden kernel runs is a finding (``kind:
"fuzz_error"`` in the same file, a ``fail``); a variant the golden kernel
refuses is not applicable and skipped, and so is one that the site's own
function refuses (the standard golden ran) when the KUT refuses it too. Variants come from the earliest
captured step of each site, interleaved across families and then across
sites so that a budget covers every site and family first. Seeded and
deterministic: a variant is the same arrays in any order and process; a
rerun skips the variants already recorded for the KUT and seed.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax import analyzer as _analyzer
from peat_jax import detector as _detector
from peat_jax import sites as _sites
from peat_jax import core as _core
from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import files as _files
from peat_jax.profiler import golden as _golden
from peat_jax.profiler import playback_fi as _playback_fi
from peat_jax.profiler import capture as io
from peat_jax.profiler.fuzz import _attention
from peat_jax.profiler.fuzz import _coverage
from peat_jax.profiler.fuzz import _goldens
from peat_jax.profiler.fuzz import _shrink
from peat_jax.profiler.fuzz import _variants as V

FUZZ_FILE = _files.FUZZ_FILE
#: How a finding of a KUT that raised begins.
RAISED = "the KUT raised"


class FuzzResult(NamedTuple):
  """What :func:`fuzz` recorded for a KUT (this call and earlier ones).

  Attributes:
    records: the KUT's fuzz site records of the selected sites and seed.
    errors: its ``fuzz_error`` findings (the KUT raised or returned another
      shape or dtype): ``{"site", "variant", "family", "error"}``.
    verdict: the verdict of the variants (:class:`peat_jax.Verdict`; a
      finding fails it), None when nothing ran.
    summary: one sentence: the verdict, the worst variant, and the counts.
    planned: variants planned for the selected sites.
    ran: variants run by this call.
    skipped: ``{"site", "variant", "reason"}``: not applicable (the golden
      kernel refuses the variant) or over the budget.
    seconds: this call's wall time.
    path: ``fuzz.msgpack``.
    shrunk: per site shrunk by this call, ``{"site", "variant" (the
      shrunk one), "shrunk_from", "shapes", "original_shapes", "tries",
      "seconds"}``.
    coverage: per family, what the records covered of the plan
      (``{family: FamilyCoverage}``, module ``_coverage``: residue
      classes, magnitude bands, element-count residues).
  """

  records: list
  errors: list
  verdict: Any
  summary: str
  planned: int
  ran: int
  skipped: list
  seconds: float
  path: str
  shrunk: list = []
  coverage: dict = {}


class Target(NamedTuple):
  """A selected site with its captured call and golden kernel."""

  entry: dict
  site: _sites.Site
  base: V.Call
  golden: _goldens.Golden
  plans: list
  captures: str = ""


def _first_iteration(site: _sites.Site, inputs: list) -> list:
  if "scan" in site.where and inputs and np.ndim(inputs[0]) == len(
      site.in_shapes[0]) + 1:
    return [x[0] for x in inputs]
  return inputs


def base_call(site: _sites.Site, params: dict, inputs: Sequence) -> V.Call:
  """The captured call of a site: inputs and parameters, or the KUT
  convention's ``(args, kwargs)`` of a composite."""
  inputs = [np.asarray(x) for x in _first_iteration(site, list(inputs))]
  if not site.composite:
    return V.Call(tuple(inputs), dict(params))
  treedef, leaves, is_array = params["template"]
  it = iter(inputs)
  args, kwargs = jax.tree.unflatten(
      treedef, [next(it) if a else v for v, a in zip(leaves, is_array)])
  return V.Call(tuple(args), dict(kwargs))


def plans_of(site: _sites.Site, base: V.Call, golden: _goldens.Golden,
             families: Sequence[str] | None = None,
             variants: Sequence[str] | None = None,
             seed: int = 0) -> list[V.Plan]:
  """A site's plans, interleaved over families and axes (``families``
  and ``variants``, names, narrow them; ``seed`` draws the lattice's
  random lengths)."""
  if site.composite and site.kernel == "attention":
    plans = _attention.plans(base, golden.first, seed)
  elif site.composite:
    plans = V.composite_plans(site.kernel, base, golden.first, seed)
  else:
    plans = V.primitive_plans(site.kernel, base, golden.first, seed)
  if families is not None:
    plans = [p for p in plans if p.family in families]
  if variants is not None:
    plans = [p for p in plans if p.name in variants]
  return V.interleave(plans)


def targets(source: str | os.PathLike, kut_spec, *,
            task: _golden.TrainTask | None = None,
            select: str | Sequence[str] | None = None,
            phase: str | Sequence[str] | None = "fwd",
            steps: Sequence[int] | None = None,
            families: Sequence[str] | None = None,
            variants: Sequence[str] | None = None,
            seed: int = 0) -> list[Target]:
  """The selected sites (earliest captured step each) and their plans.

  Raises:
    PeatError: as :func:`fuzz`.
  """
  if families is not None:
    bad = sorted(set(families) - set(V.FAMILIES))
    if bad:
      raise PeatError(f"unknown fuzz families {bad}; expected some of "
                      f"{list(V.FAMILIES)}")
  cdir = io.captures_dir_of(source)
  entries = io.select_entries(io.read_index(cdir), kut_spec,
                                    select=select, phase=phase, steps=steps)
  first: dict[str, dict] = {}
  for e in sorted(entries, key=lambda e: e["step"]):
    first.setdefault(e["site"], e)
  chosen = sorted(first.values(), key=lambda e: tuple(e["address"]))
  own = _goldens.site_goldens(task, chosen) if task is not None else {}
  out = []
  for e in chosen:
    site = io.site_of(e)
    params = io.decode_params(e["params"])
    arrays = io.load_record(cdir, e)
    inputs = [arrays[f"in{i}"] for i in range(len(e["in_shapes"]))]
    golden = _goldens.Golden(site, params, own.get(e["site"]))
    base = base_call(site, params, inputs)
    out.append(Target(e, site, base, golden,
                      plans_of(site, base, golden, families, variants, seed),
                      cdir))
  return out


def build(target: Target, name: str, seed: int) -> V.Call:
  """Rebuilds one variant of a target by name (``peat.export_repro``);
  a shrunk one (``min:<variant>:<cuts>``) from its original.

  Raises:
    PeatError: no such variant for the site (naming those it has).
  """
  if name.startswith(_shrink.PREFIX):
    original, _ = _shrink.parse(name)
    return _shrink.rebuild(target.site.kernel, target.site.composite,
                           target.site.name, build(target, original, seed),
                           name, seed)
  for p in target.plans:
    if p.name == name:
      return p.make(V.rng_of(seed, target.site.name, name))
  raise PeatError(f"site {target.site.name!r} has no fuzz variant {name!r}; "
                  f"expected one of {[p.name for p in target.plans]}")


def _arrays(call: V.Call) -> list:
  leaves = jax.tree.leaves((call.args, call.kwargs))
  return [x for x in leaves if isinstance(x, (np.ndarray, jax.Array))]


def variant_site(site: _sites.Site, call: V.Call, golden: Sequence) -> _sites.Site:
  """The site as the variant calls it (its shapes; one plain call)."""
  ins = _arrays(call) if site.composite else list(call.args)
  return site._replace(
      in_shapes=tuple(tuple(np.shape(x)) for x in ins),
      in_dtypes=tuple(str(np.asarray(x).dtype) for x in ins),
      out_shapes=tuple(tuple(np.shape(g)) for g in golden),
      out_dtypes=tuple(str(np.asarray(g).dtype) for g in golden),
      where=tuple(w for w in site.where if w != "scan"))


def run_kut(spec: _kut.KutSpec, site: _sites.Site, call: V.Call
            ) -> tuple[list, dict]:
  """The KUT's outputs on a variant call and the call's recorded params."""
  store: dict = {}
  kut = _kut.recording(_kut.kut_callable(spec, site.name), site.name,
                       site.kernel, site.composite, store)
  args = [jax.numpy.asarray(a) if isinstance(a, np.ndarray) else a
          for a in call.args]
  out = kut(*args, **call.kwargs)
  return [np.asarray(o) for o in jax.tree.leaves(out)], store[site.name]


def _raised(first: dict) -> bool:
  """Whether a failing variant's finding is the KUT raising."""
  return (first.get("kind") == "fuzz_error"
          and first.get("error", "").startswith(RAISED))


def _kut_raises(spec: _kut.KutSpec, site: _sites.Site, call: V.Call) -> bool:
  """Whether the KUT raises on ``call``: the one question a shrink of a
  raising KUT asks of a smaller call, answered without the golden kernel,
  the analysis or their compilations (a call that raises is then run
  whole, for its finding)."""
  try:
    run_kut(spec, site, call)
  except Exception:  # pylint: disable=broad-except
    return True
  return False


def _one(xs: Sequence) -> Any:
  return xs[0] if len(xs) == 1 else tuple(xs)


def variant_record(target: Target, plan: V.Plan, spec: _kut.KutSpec,
                   seed: int) -> tuple[dict | None, dict | None, str | None]:
  """``(record, finding, not_applicable_reason)`` of one variant."""
  site = target.site
  try:
    call = plan.make(V.rng_of(seed, site.name, plan.name))
    golden, frm = target.golden(call)
  except (PeatError, TypeError, ValueError) as e:
    return None, None, f"not applicable: {str(e).splitlines()[0][:200]}"
  if any(np.size(g) == 0 for g in golden):  # a window past the input
    return None, None, ("not applicable: the golden kernel's output is "
                        f"empty ({[list(np.shape(g)) for g in golden]})")
  tag = {"site": site.name, "variant": plan.name, "family": plan.family,
         "step": target.entry["step"], "seed": seed, "kut": spec.spec,
         "shapes": [list(np.shape(x)) for x in (
             _arrays(call) if site.composite else call.args)]}
  try:
    test, params = run_kut(spec, site, call)
  except Exception as e:  # pylint: disable=broad-except
    if frm.startswith("standard ("):  # outside the site's own contract
      return None, None, ("not applicable: the site's own golden kernel "
                          "and the KUT both refuse it")
    return None, dict(tag, kind="fuzz_error", error=(
        f"{RAISED} {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if str(e) else f"{RAISED} {type(e).__name__}")), None
  if len(test) != len(golden) or any(
      t.shape != g.shape or t.dtype != g.dtype for t, g in zip(test, golden)):
    got = [f"{t.dtype}{list(t.shape)}" for t in test]
    want = [f"{g.dtype}{list(g.shape)}" for g in golden]
    return None, dict(tag, kind="fuzz_error", error=(
        f"the KUT returned {got}; expected {want} like the golden kernel")
                      ), None
  test, convention = _masked_rows_convention(site, call, golden, test)
  vsite = variant_site(site, call, golden)
  ins = _arrays(call) if site.composite else list(call.args)
  tap = _sites.Tap(tuple(ins), _one(golden), _one(test))
  # Each variant's shape comes once: analyzed in its size bucket.
  rec = _playback_fi.site_record(vsite, params, tap, spec.spec,
                                 target.entry["step"], one_off=True)
  rec = _named_by_inputs(rec, vsite, params, call, ins, golden, test)
  rec.update(source="fuzz", variant=plan.name, family=plan.family,
             seed=int(seed), capture=target.entry["file"],
             captures=target.captures, golden_from=frm,
             shapes=[list(s) for s in vsite.in_shapes])
  if convention:
    rec["masked_rows"] = convention
  return rec, None, None


def _named_by_inputs(rec: dict, site: _sites.Site, params: dict,
                     call: V.Call, ins: list, golden: list, test: list
                     ) -> dict:
  """A failing record named by the shape probe on its own inputs
  (``peat.analyzer.shape_probe``, ``peat.detector.named_by_inputs``): a
  dropped or repeated element, a narrow accumulator, a wrong mean. The
  probe's answer is kept in ``shape_probe``."""
  if rec["diagnosis"]["verdict"] == "pass" or len(golden) != 1:
    return rec
  try:
    ref = _playback_fi.site_reference(site, params, ins)
    if isinstance(ref, (list, tuple)):
      ref = ref[0]
    found = None if ref is None else _analyzer.shape_probe(
        site.kernel, call.args, call.kwargs, test[0], golden[0], ref)
  except (TypeError, ValueError, KeyError, IndexError, PeatError):
    return rec
  if found is None:
    return rec
  rec["shape_probe"] = {k: v for k, v in found.items() if k != "evidence"}
  rec["diagnosis"] = _detector.named_by_inputs(rec["diagnosis"], found,
                                               rec.get("port"))
  return rec


def _masked_rows_convention(site, call: V.Call, golden: list, test: list
                            ) -> tuple[list, str | None]:
  """An attention's fully masked query rows: jax and flax (the golden
  kernel) average v there, torch's SDPA and flash-attention write 0. Both
  are conventions, not errors: a KUT that writes exactly 0 in every such
  row (and nowhere else differs for it) is compared on the other rows,
  its zeros replaced by the golden rows; a NaN or any other value there
  is compared as it is."""
  if not (site.composite and site.kernel == "attention"
          and len(call.args) > 3 and isinstance(call.args[3], np.ndarray)):
    return test, None
  q, mask = call.args[0], np.asarray(call.args[3], bool)
  b, t, h = q.shape[:3]
  full = ~np.broadcast_to(mask, np.broadcast_shapes(
      mask.shape, (b, h, t, mask.shape[-1]))).any(-1)  # [B, H, T]
  if not full.any():
    return test, None
  rows = np.transpose(full, (0, 2, 1))  # [B, T, H], the output's layout
  out = np.asarray(test[0])
  if not np.all(out[rows] == 0) or np.all(np.asarray(golden[0])[rows] == 0):
    return test, None
  fixed = out.copy()
  fixed[rows] = np.asarray(golden[0])[rows]
  return [fixed] + list(test[1:]), (
      f"zeros in the {int(rows.sum())} fully masked query rows (torch and "
      "flash-attention's convention; jax's averages v): compared on the "
      "others")


def _round_robin(tgts: Sequence[Target], offset: int
                 ) -> list[tuple[Target, V.Plan]]:
  plans = [V.interleave(t.plans, start=offset + k, turn=offset + k)
           for k, t in enumerate(tgts)]
  out, i = [], 0
  while True:
    row = [(t, p[i]) for t, p in zip(tgts, plans) if i < len(p)]
    if not row:
      return out
    out += row
    i += 1


def _order(tgts: Sequence[Target]) -> list[tuple[Target, V.Plan]]:
  """Round robin over sites, each site's plans interleaved over families
  from its own: the k-th site starts at its k-th family, so one round of
  as many sites as families covers every family (a model of 19 GEMM
  sites sees all six families in its first six variants, not its first
  3 x 19), and each axis at its k-th length (sites of one kernel take
  the lattice's first lengths, the large bands among them, in their
  first round). A site that makes the same call as an earlier one
  (:func:`shape_key`: a second block's, a projection of the same shape)
  runs its variants after every first site's: a shape-gated bug is the
  same at both, and a budget goes to the shapes first."""
  first: dict = {}
  for t in tgts:
    first.setdefault(_coverage.shape_key(t), t)
  lead = list(first.values())
  rest = [t for t in tgts if all(t is not f for f in lead)]
  return _round_robin(lead, 0) + _round_robin(rest, len(lead))


def verdict_of(records: Sequence[dict], errors: Sequence[dict]
               ) -> tuple[Any, str]:
  """The variants' verdict (findings fail it) and its sentence
  (:func:`peat_jax.detector.variants_verdict`)."""
  return _detector.variants_verdict(records, errors)


def fuzz(source: str | os.PathLike, kut_spec, *,
         task: _golden.TrainTask | None = None,
         select: str | Sequence[str] | None = None,
         phase: str | Sequence[str] | None = "fwd",
         steps: Sequence[int] | None = None, seed: int = 0,
         budget_cases: int | None = None,
         budget_seconds: float | None = None,
         families: Sequence[str] | None = None,
         variants: Sequence[str] | None = None,
         campaign_dir: str | os.PathLike | None = None,
         progress: Callable[[str], None] | None = None,
         shrink: bool = True) -> FuzzResult:
  """Runs a KUT on variants of its sites' captured real inputs.

  >>> peat.profile(task, "runs/c1", capture_kernel="softmax",
  ...              capture_phase="fwd", capture_steps=[0],
  ...              budget_bytes=64 << 20)             # doctest: +SKIP
  >>> r = peat.fuzz("runs/c1", "native:softmax:default", task=task,
  ...               budget_cases=40)                  # doctest: +SKIP
  >>> r.verdict.verdict, r.records[0]["variant"]      # doctest: +SKIP
  ('pass', 'batch=1')

  Args:
    source: a campaign directory with captures (or its ``captures/``).
    kut_spec: a KUT spec (string, parsed or checked).
    task: the task the captures come from: its composite sites' own
      marked functions are their golden kernels (None: the standard golden
      of each kind, module ``_goldens``).
    select: narrow the sites: an ``fnmatch`` pattern or site names.
    phase: site phase(s) (default forward).
    steps: capture steps to draw from (default all; the earliest per site
      is used).
    seed: the variants' seed.
    budget_cases: at most this many variants run in this call.
    budget_seconds: no variant starts after this many seconds.
    families: run only these families (``_variants.FAMILIES``).
    variants: run only the variants of these names (``"len=64"``).
    campaign_dir: where ``fuzz.msgpack`` goes (default: the captures'
      campaign).
    progress: called with one line per variant.
    shrink: shrink the worst failing variant of each site (at most
      :data:`SHRINK_SITES` sites, :data:`SHRINK_SECONDS` each) to the
      smallest input that fails the same way (module ``_shrink``); the
      shrunk record joins ``fuzz.msgpack`` with ``shrunk_from``.

  Returns:
    A :class:`FuzzResult`.

  Raises:
    PeatError: no captures, no captured site of the KUT's kernel, an
      unknown family, a bad budget, a task the captures do not come from,
      a composite kind with neither a task nor a standard golden.
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  t0 = time.perf_counter()
  say = progress or (lambda s: None)
  for name, b in (("budget_cases", budget_cases),
                  ("budget_seconds", budget_seconds)):
    if b is not None and (isinstance(b, bool) or not isinstance(
        b, (int, float, np.integer, np.floating)) or b <= 0):
      raise PeatError(f"{name} must be a positive number; got {b!r}")
  kut = _kut.checked(kut_spec)
  spec = kut.spec
  cdir = io.captures_dir_of(source)
  campaign = os.path.abspath(os.fspath(campaign_dir or os.path.dirname(cdir)))
  os.makedirs(campaign, exist_ok=True)
  path = os.path.join(campaign, FUZZ_FILE)
  tgts = targets(cdir, kut, task=task, select=select, phase=phase,
                 steps=steps, families=families, variants=variants,
                 seed=seed)
  order = _order(tgts)
  mine = lambda r: r.get("kut") == kut.name and r.get("seed") == seed  # noqa: E731
  done = {(r["site"], r["variant"]) for r in _files.read_records(path)
          if r.get("kind") in ("site", "fuzz_error") and mine(r)}
  skipped, ran = [], 0
  for i, (t, plan) in enumerate(order):
    key = (t.site.name, plan.name)
    if key in done:
      continue
    over = ((budget_cases is not None and ran >= budget_cases) or (
        budget_seconds is not None
        and time.perf_counter() - t0 >= budget_seconds))
    if over:
      skipped.append({"site": key[0], "variant": key[1],
                      "reason": "over the budget"})
      continue
    t1 = time.perf_counter()
    rec, finding, why = variant_record(t, plan, spec._replace(spec=kut.name),
                                       seed)
    tag = f"fuzz {key[0]} {key[1]} ({i + 1}/{len(order)})"
    if why is not None:
      skipped.append({"site": key[0], "variant": key[1], "reason": why})
      say(f"{tag}: {why}")
      continue
    ran += 1
    _files.append_records(path, [rec or finding])
    if finding is not None:
      say(f"{tag}: fail, {finding['error']} "
          f"({time.perf_counter() - t1:.2f} s)")
    else:
      d = rec["diagnosis"]
      say(f"{tag}: {d['model']} ({d['verdict']}), noise ratio "
          f"{rec['signature'].get('noise_ratio', float('nan')):.3g} "
          f"({time.perf_counter() - t1:.2f} s)")
  names = {t.site.name for t in tgts}
  stored = [r for r in _files.read_records(path)
            if mine(r) and r.get("site") in names]
  shrunk = []
  if shrink:
    shrunk = shrink_failures(tgts, stored, spec._replace(spec=kut.name),
                             seed, path, say)
    if shrunk:
      stored = [r for r in _files.read_records(path)
                if mine(r) and r.get("site") in names]
  records = [r for r in stored if r.get("kind") == "site"]
  errors = [r for r in stored if r.get("kind") == "fuzz_error"]
  v, summary = verdict_of(records, errors)
  return FuzzResult(records, errors, v, summary, len(order), ran, skipped,
                    round(time.perf_counter() - t0, 3), path, shrunk,
                    _coverage.coverage(tgts, records + errors))


#: Sites one :func:`fuzz` call shrinks a failure of, at most.
SHRINK_SITES = 4
#: Seconds one shrink may take (it stops starting runs after them).
SHRINK_SECONDS = 90.0


def _rank(r: dict) -> int:
  """A record's severity (``peat.detector.severity``); a finding ranks
  above a ``fail``."""
  if r.get("kind") == "fuzz_error":
    return _detector.severity("fail") + 1
  return _detector.severity(r["diagnosis"]["verdict"])


def _worst(stored: Sequence[dict], site: str) -> dict | None:
  """A site's worst failing record not shrunk yet (None: none, or one
  is shrunk already)."""
  mine = [r for r in stored if r.get("site") == site]
  if any(r.get("shrunk_from") for r in mine):
    return None
  failing = [r for r in mine if _rank(r) > 0]
  return max(failing, key=_rank) if failing else None


def shrink_failures(tgts: Sequence[Target], stored: Sequence[dict],
                    spec: _kut.KutSpec, seed: int, path: str,
                    say: Callable[[str], None]) -> list[dict]:
  """Shrinks the worst failing variant of each target (module
  ``_shrink``) and appends the shrunk records to ``path``."""
  out = []
  for t in tgts:
    if len(out) >= SHRINK_SITES:
      break
    first = _worst(stored, t.site.name)
    if first is None or first["variant"].startswith(_shrink.PREFIX):
      continue
    plan = next((p for p in t.plans if p.name == first["variant"]), None)
    if plan is None:
      continue
    call = plan.make(V.rng_of(seed, t.site.name, plan.name))

    raised = _raised(first)

    def run(name, c, t=t, plan=plan, raised=raised):
      if raised and not _kut_raises(spec, t.site, c):
        return None  # the KUT ran: not this failure (nothing to compare)
      rec, finding, _ = variant_record(
          t, V.Plan(name, plan.family, lambda rng: c), spec, seed)
      return rec or finding
    got = _shrink.shrink(t.site.kernel, t.site.composite, t.site.name, call,
                         first["variant"], first, run, seed,
                         max_seconds=SHRINK_SECONDS)
    if got.name == first["variant"]:
      say(f"shrink {t.site.name} {first['variant']}: no smaller input fails "
          f"the same way ({got.tries} tries, {got.seconds:.1f} s)")
      continue
    rec = dict(got.outcome, shrunk_from=first["variant"],
               original_shapes=first.get("shapes"), shrink_tries=got.tries)
    _files.append_records(path, [rec])
    out.append({"site": t.site.name, "variant": got.name,
                "shrunk_from": first["variant"], "shapes": rec.get("shapes"),
                "original_shapes": first.get("shapes"), "tries": got.tries,
                "seconds": got.seconds})
    say(f"shrink {t.site.name} {first['variant']} -> {got.name}: shapes "
        f"{rec.get('shapes')} ({got.tries} tries, {got.seconds:.1f} s)")
  return out
