"""Validation campaigns: playback FI, runtime FI, verdict, localization, report.

With ``fuzz``, :func:`validate` also captures the KUT's forward sites at
step 0 (``peat.profile``, the campaign's own golden run) and runs
``peat.fuzz`` on variants of those inputs: the shapes beyond training,
whose verdict is kept apart from the training verdict.

A campaign is one directory; :mod:`peat_jax.profiler.files._layout` names every
file in it (docs/campaign.md).

Records hold small numbers only (signature scalars, the ULP and bit-position
histograms, the diagnosis), never arrays of activations. Both record files
are append-only streams of checksummed msgpack records (``_records``); a
restarted campaign reads them and skips the steps / frequencies already
done. Native KUTs run in worker processes by default (``_isolate``): a KUT
that crashes, hangs or exhausts memory becomes a finding, not the end of
the campaign (docs/reliability.md).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import numbers
import os
import time
from typing import Callable, NamedTuple, Sequence

import jax

from peat_jax.profiler.campaigns import _campaign_report
from peat_jax.profiler import capture as _capture
from peat_jax.profiler import files as _files
from peat_jax.profiler import fuzz as _fuzz
from peat_jax.profiler import golden as _golden
from peat_jax.profiler import isolation as _isolation
from peat_jax.profiler.campaigns import _provenance
from peat_jax import report as _report
from peat_jax import core as _core
from peat_jax.core import PeatError
# Re-exported: the campaign layers, reachable from one module.
from peat_jax.profiler.playback_fi import playback
from peat_jax.profiler.playback_fi import select_calls
from peat_jax.profiler.runtime_fi import parse_frequency
from peat_jax.profiler.runtime_fi import runtime
from peat_jax.profiler.isolation import TaskFactory
from peat_jax.profiler.golden import TrainTask
from peat_jax.kernels import kut as _kut
from peat_jax.profiler.files import campaign_lock

SETTINGS_FILE = _files.SETTINGS_FILE
LOCK_FILE = _files.LOCK_FILE
#: Version of the campaign directory's layout and record formats, stored in
#: campaign.json ("format"); a directory of another version is refused.
#: 2: checksummed record frames, crashes.msgpack.
CAMPAIGN_FORMAT = 2
#: Settings newer than format 2, with the value a campaign without them had.
_LATER_SETTINGS = {"backward": "golden", "invariance": False}


# --------------------------------------------------------------- campaign


def _check_settings(directory: str, settings: dict) -> None:
  """Stores the settings, or checks them against the stored ones.

  Raises:
    PeatError: a corrupt campaign.json, one of another campaign format
      (another peat_jax version), or other settings; nothing is changed.
  """
  path = os.path.join(directory, SETTINGS_FILE)
  if os.path.exists(path):
    try:
      with open(path, encoding="utf-8") as f:
        old = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
      raise PeatError(
          f"campaign settings file {path} is corrupt ({err}); expected the "
          "JSON written by peat.validate. Nothing was changed. Fix: restore "
          "it from a copy, or use another campaign directory.") from err
    if not isinstance(old, dict):
      raise PeatError(f"campaign settings file {path} holds a "
                      f"{type(old).__name__}; expected a JSON object. Fix: "
                      "restore it or use another campaign directory.")
    # Settings added after format 2 began; a campaign that predates one
    # had its default.
    for k, default in _LATER_SETTINGS.items():
      old.setdefault(k, default)
    if old.get("format") != settings["format"]:
      raise PeatError(
          f"campaign directory {directory} was written by another version "
          f"of peat_jax: {path} has campaign format {old.get('format')!r} "
          f"(None: from before format versions), this peat_jax reads format "
          f"{settings['format']}. Nothing was changed. Fix: run the campaign "
          "in a new directory, or finish it with the peat_jax version that "
          "started it.")
    diff = {k: (old.get(k), settings.get(k))
            for k in set(old) | set(settings) if old.get(k) != settings.get(k)}
    if diff:
      lines = "; ".join(f"{k}: expected {a!r} (stored), got {b!r}"
                        for k, (a, b) in sorted(diff.items()))
      raise PeatError(
          f"campaign directory {directory} holds a campaign with other "
          f"settings ({lines}). Fix: use another campaign directory or the "
          "stored settings.")
    return
  try:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(settings, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
  except OSError as err:
    with contextlib.suppress(OSError):
      os.remove(path + ".tmp")
    raise PeatError(
        f"cannot write campaign settings file {path}: {err.strerror or err}."
        " Fix: free disk space or fix the directory's permissions, then run "
        "the same command again.") from err


class CampaignPaths(NamedTuple):
  """Where :func:`validate` wrote a campaign.

  Attributes:
    directory: the campaign directory.
    html: report.html.
    json: report.json.
    verdict: the KUT's verdict (``pass``/``warn``/``fail``) over the
      training's shapes: playback and runtime FI; fuzzing never changes it.
    fuzz_verdict: the verdict of the shapes beyond training
      (``pass``/``warn``/``fail``): the KUT's fuzz records in the campaign
      (``fuzz.msgpack``, this run's and earlier ones'), as the report's
      "Shapes beyond training" section has it; None when there are none.
  """

  directory: str
  html: str
  json: str
  verdict: str
  fuzz_verdict: str | None = None


#: Keys of ``validate``'s ``fuzz`` settings.
FUZZ_KEYS = ("budget_cases", "budget_seconds", "seed", "families", "select",
             "capture_budget_bytes")
#: Variants fuzzed when the settings give no budget.
FUZZ_BUDGET_CASES = 40
#: Storage budget of the captures fuzzing starts from (bytes).
FUZZ_CAPTURE_BYTES = 256 << 20


def _positive(name: str, v, kind: type) -> None:
  if v is not None and (isinstance(v, bool) or not isinstance(v, kind)
                        or not v > 0):
    raise PeatError(f"fuzz setting {name!r} must be a positive "
                    f"{'integer' if kind is numbers.Integral else 'number'};"
                    f" got {v!r}")


def fuzz_settings(fuzz: "bool | dict | None", select: str | None
                  ) -> dict | None:
  """``validate``'s ``fuzz`` argument as complete, checked settings.

  Args:
    fuzz: None or False (no fuzzing), True (the defaults) or a dict of
      some of :data:`FUZZ_KEYS`.
    select: the campaign's ``select`` (the default of ``fuzz["select"]``).

  Returns:
    None, or every key of :data:`FUZZ_KEYS` with its value or default.

  Raises:
    PeatError: another type, an unknown key, a bad value (naming it).
  """
  if fuzz is None or fuzz is False:
    return None
  if fuzz is True:
    fuzz = {}
  if not isinstance(fuzz, dict):
    raise PeatError(f"fuzz must be None, True, False or a dict of settings "
                    f"{list(FUZZ_KEYS)}; got {type(fuzz).__name__} "
                    f"{fuzz!r}")
  bad = sorted(set(fuzz) - set(FUZZ_KEYS))
  if bad:
    raise PeatError(f"unknown fuzz settings {bad}; expected some of "
                    f"{list(FUZZ_KEYS)}")
  out = {k: fuzz.get(k) for k in FUZZ_KEYS}
  _positive("budget_cases", out["budget_cases"], numbers.Integral)
  _positive("budget_seconds", out["budget_seconds"], numbers.Real)
  _positive("capture_budget_bytes", out["capture_budget_bytes"],
            numbers.Integral)
  if out["budget_cases"] is None and out["budget_seconds"] is None:
    out["budget_cases"] = FUZZ_BUDGET_CASES
  if out["capture_budget_bytes"] is None:
    out["capture_budget_bytes"] = FUZZ_CAPTURE_BYTES
  seed = 0 if out["seed"] is None else out["seed"]
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise PeatError(f"fuzz setting 'seed' must be an integer; got {seed!r}")
  out["seed"] = int(seed)
  fams = out["families"]
  known = list(_fuzz.FUZZ_FAMILIES)
  if fams is not None:
    if not isinstance(fams, (list, tuple)) or not fams or not all(
        isinstance(f, str) for f in fams):
      raise PeatError(f"fuzz setting 'families' must be a list of family "
                      f"names, some of {known}; got {fams!r}")
    unknown = sorted(set(fams) - set(known))
    if unknown:
      raise PeatError(f"fuzz setting 'families' has unknown families "
                      f"{unknown}; expected some of {known}")
    out["families"] = list(fams)
  sel = out["select"]
  if sel is not None and not isinstance(sel, str) and not (
      isinstance(sel, (list, tuple)) and all(isinstance(x, str)
                                             for x in sel)):
    raise PeatError(f"fuzz setting 'select' must be an fnmatch pattern or "
                    f"a list of site names; got {sel!r}")
  if sel is None:
    out["select"] = select
  return out


def _capture_for_fuzz(task: TrainTask, kut: "_kut.CheckedSpec",
                      directory: str, fz: dict, *, steps: int,
                      checkpoint_every: int, seed: int,
                      say: Callable[[str], None], label: str) -> None:
  """Captures the inputs of the KUT's forward sites at step 0.

  ``peat.profile`` holds the campaign lock itself: the caller must not.
  """
  spec = kut.spec
  budget = (f"{fz['budget_cases']} variants" if fz["budget_cases"]
            else "no case limit") + (
                f", {fz['budget_seconds']:g} s"
                if fz["budget_seconds"] else "")
  say(f"{label} shapes beyond training: capture the forward "
      f"{spec.site_kernel} sites at step 0 (at most "
      f"{fz['capture_budget_bytes']} bytes), then fuzz {kut.name} "
      f"({budget}, seed {fz['seed']}"
      + (f", families {','.join(fz['families'])}" if fz["families"]
         else "") + ")")
  _capture.profile(
      task, directory, steps=steps, checkpoint_every=checkpoint_every,
      capture_kernel=spec.site_kernel, capture_phase="fwd",
      capture_steps=[0], budget_bytes=fz["capture_budget_bytes"],
      seed=seed, progress=say)


def _fuzz_variants(task: TrainTask, kut: "_kut.CheckedSpec",
                   directory: str, fz: dict,
                   say: Callable[[str], None]) -> None:
  """``peat.fuzz`` of the captures (under the campaign lock)."""
  r = _fuzz.fuzz(directory, kut, task=task, select=fz["select"],
                 phase="fwd", steps=[0], seed=fz["seed"],
                 budget_cases=fz["budget_cases"],
                 budget_seconds=fz["budget_seconds"],
                 families=fz["families"], progress=say)
  over = sum(s["reason"] == "over the budget" for s in r.skipped)
  say(f"fuzz: {r.ran} variants run, {len(r.records) + len(r.errors)} "
      f"recorded of {r.planned} planned, {over} over the budget "
      f"({r.seconds:.1f} s): {r.summary}")
  say(_fuzz.coverage_line(r.coverage))


def _use_isolation(isolate: bool | None, spec: _kut.KutSpec,
                   factory: TaskFactory | None,
                   say: Callable[[str], None]) -> bool:
  """Whether validate runs the KUT in worker processes (see validate)."""
  native_code = spec.source in ("native", "ffi")  # may crash the process
  if isolate is None:
    isolate = native_code and factory is not None
    if native_code and factory is None:
      if _kut.is_broken(spec):
        raise PeatError(
            f"KUT {spec.spec!r} is deliberately broken (it crashes, hangs or "
            "exhausts memory) and needs process isolation, which needs a "
            "peat.TaskFactory instead of a TrainTask (e.g. "
            "TaskFactory('peat_jax.models', 'get_task', {'name': 'cnn'})).")
      say("[isolation] off: native: and ffi: KUTs run in worker processes "
          "when validate gets a peat.TaskFactory instead of a TrainTask")
  if isolate and factory is None:
    raise PeatError("isolate=True needs a peat.TaskFactory (a picklable "
                    "recipe that rebuilds the task in a worker process) "
                    "instead of a TrainTask, e.g. TaskFactory("
                    "'peat_jax.models', 'get_task', {'name': 'cnn'})")
  if not isolate and _kut.is_broken(spec):
    raise PeatError(f"KUT {spec.spec!r} is deliberately broken (it crashes, "
                    "hangs or exhausts memory); run it with isolate=True "
                    "(or None) and a peat.TaskFactory")
  return bool(isolate)


def _check_sites_first(task: TrainTask, kut: _kut.CheckedSpec,
                       select: str | Sequence[str] | None, seed: int) -> None:
  """Refuses a KUT with no site to run at before the golden run trains.

  The sites are found on the step traced with the initial state's shapes
  (``jax.eval_shape``: nothing is computed), as playback selects them.
  The same check runs again on the golden run's first checkpoint; a task
  whose initial state cannot be traced abstractly is left to that one.

  Raises:
    PeatError: no site of the KUT's kernel, phase or pattern in the step
      (the message lists the step's close kernels), or both ``select``
      and a spec pattern.
  """
  try:
    state = jax.eval_shape(lambda: task.init_state(seed))
  except Exception:  # pylint: disable=broad-except
    return  # not traceable abstractly: the checkpoint's check decides
  select_calls(task, state, task.batch_at(0), kut._replace(backward="golden"),
               select)


def validate(task: TrainTask | TaskFactory,
             kut_spec: "str | _kut.KutSpec",
             campaign_dir: str | os.PathLike,
             *, steps: int | None = None, checkpoint_every: int | None = None,
             frequencies: Sequence[str] = ("every", "every_4",
                                           "fraction_0.25"),
             runtime_steps: int | None = None, select: str | None = None,
             seed: int = 0, scenario: str | None = None,
             isolate: bool | None = None,
             timeout_s: float = _isolation.TIMEOUT_S,
             startup_s: float = _isolation.STARTUP_S,
             memory_limit_mb: int | None = _isolation.MEMORY_LIMIT_MB,
             progress: Callable[[str], None] | None = print,
             backward: str = "golden",
             invariance: bool = False,
             fuzz: "bool | dict | None" = None,
             store_golden_step: bool = True) -> CampaignPaths:
  """Runs a whole campaign: golden, playback, runtime FI, verdict, report.

  With ``fuzz``, also the shapes beyond training, after runtime FI and
  before the report: ``peat.profile`` captures the inputs of the KUT's
  forward sites (its site kernel) at step 0, reusing the campaign's golden
  run (the same steps, checkpoint interval and seed), and ``peat.fuzz``
  runs the KUT on variants of them (other batch sizes, rows, lengths,
  attention masks and layouts, magnitudes, denormals). Their verdict is
  :attr:`CampaignPaths.fuzz_verdict` and the report's "Shapes beyond
  training" section; the training verdict stays what playback and runtime
  FI make it.

  >>> paths = peat.validate(task, "native:softmax:default", "runs/c1",
  ...                       fuzz={"budget_cases": 40})  # doctest: +SKIP
  >>> paths.verdict, paths.fuzz_verdict                 # doctest: +SKIP
  ('pass', 'pass')

  With isolation, playback and runtime FI run in worker processes with time
  and memory limits (``peat_jax.profiler.isolation._isolate``): a KUT that crashes, hangs or
  exhausts memory becomes a crash/hang finding (``crashes.msgpack``, the
  report, verdict ``fail``) and the campaign goes on. The records are the
  same with and without isolation.

  Args:
    task: the model scenario: a :class:`peat_jax.TrainTask`, or a
      :class:`TaskFactory` that builds it (needed for isolation, since a
      worker process rebuilds the task).
    kut_spec: the KUT spec (``peat_jax.kernels.kut``), a string or a
      parsed :class:`peat_jax.kernels.KutSpec`; parsed here, once, and
      passed on parsed.
    campaign_dir: the campaign directory (created; resumable).
    steps: golden training steps (task default when None).
    checkpoint_every: checkpoint interval (task default when None).
    frequencies: runtime FI frequencies (``every``, ``every_<n>``,
      ``fraction_<p>``); empty to skip runtime FI.
    runtime_steps: runtime FI steps from step 0 (default: ``steps``).
    select: narrow the spec's sites by an ``fnmatch`` pattern.
    seed: golden seed.
    scenario: the scenario's label in the report (default ``task.name``).
    isolate: run playback and runtime FI in worker processes. None
      (default): yes for native: and ffi: KUTs when ``task`` is a
      TaskFactory.
      Deliberately broken KUTs require it.
    timeout_s: isolation: time limit of one checkpoint / frequency.
    startup_s: isolation: extra time of the first checkpoint / frequency of
      each worker (import, tracing, compilation).
    memory_limit_mb: isolation: a worker's resident memory limit.
    progress: called with progress lines (None: silent).
    backward: ``"golden"`` (default): the golden kernel at the backward
      sites, the forward-only question. ``"kut"``: the KUT's VJP at the
      backward sites of the selected forward sites, in playback (each
      backward site recorded: one signature per cotangent against the
      golden VJP and a float64 reference VJP) and in runtime FI. Part of
      the campaign's settings: a directory holds one or the other.
    invariance: playback also probes the KUT for stale outputs, mutated
      inputs, ignored inputs and batch variance at each forward site and
      composite backward site (``peat.playback``'s ``invariance``); part
      of the campaign's settings.
    fuzz: None or False (default): no fuzzing. True: fuzz with the
      default settings. A dict of settings, each optional:
      ``budget_cases`` (at most this many variants run by this call;
      default 40 when no budget is given), ``budget_seconds`` (no variant
      starts after this many seconds), ``seed`` (the variants' seed,
      default 0), ``families`` (a list of ``peat.profiler.FUZZ_FAMILIES``:
      ``batch``, ``rows``, ``length``, ``attention``, ``magnitude``,
      ``denormal``; default all), ``select`` (an fnmatch pattern or site
      names; default the campaign's ``select``) and
      ``capture_budget_bytes`` (the captures' storage budget, default 256
      MiB). Not part of the campaign's settings: a rerun with other fuzz
      settings adds its variants to ``fuzz.msgpack`` (one already there
      for the KUT and seed is skipped), and the fuzz verdict covers every
      fuzz record of the KUT there. Fuzzing runs the KUT in this process,
      forward sites only.
    store_golden_step: the golden run keeps the parameters after each
      checkpoint's next step (one parameter set per checkpoint), and
      playback runs the KUT's step alone, the golden kernel tapped beside
      the KUT on that step's own inputs (``backward="golden"``); False:
      playback replays the golden step beside the KUT's at every
      checkpoint (docs/campaign.md).

  Returns:
    :class:`CampaignPaths`.

  Raises:
    PeatError: a campaign with other settings (or of another peat_jax
      version) in ``campaign_dir``, a campaign running there, an unknown
      spec or frequency, isolation without a TaskFactory, a corrupt record
      file (:class:`peat_jax.profiler.files._records.RecordFileError`), a bad
      ``backward``, a backward site the KUT's VJP cannot run at (named),
      bad ``fuzz`` settings (checked before any work), fuzzing a
      deliberately broken KUT; a capture or fuzzing that fails (captures
      of other settings in the directory, no captured site of the KUT's
      kernel, a composite kind without variants) after the training
      report is written, with its verdict and path.
  """
  _core.ensure_compilation_cache()  # compile once, reuse after
  say = progress or (lambda s: None)
  directory = os.path.abspath(os.fspath(campaign_dir))
  factory = task if isinstance(task, TaskFactory) else None
  # Parsed and checked here, once; every layer below gets this object.
  kut = _kut.checked(kut_spec, backward)
  spec = kut.spec
  if not isinstance(invariance, bool):
    raise PeatError(f"invariance must be True or False; got {invariance!r}")
  fz = fuzz_settings(fuzz, select)
  if fz is not None and _kut.is_broken(spec):
    raise PeatError(f"KUT {spec.spec!r} is deliberately broken (it crashes, "
                    "hangs or exhausts memory); fuzzing runs the KUT in this "
                    "process, without isolation: run it without fuzz")
  kut_spec = kut.name  # the records' and the report's key
  isolated = _use_isolation(isolate, spec, factory, say)
  if factory is not None:
    task = factory.build()
  steps = int(steps or task.default_steps)
  checkpoint_every = int(checkpoint_every or task.default_checkpoint_every)
  runtime_steps = int(runtime_steps or steps)
  for f in frequencies:
    parse_frequency(f)
  settings = {"format": CAMPAIGN_FORMAT,
              "scenario": scenario or task.name, "task": task.name,
              "task_config": json.dumps(task.config, sort_keys=True,
                                        default=str),
              "kut": kut_spec, "steps": steps,
              "checkpoint_every": checkpoint_every,
              "frequencies": ",".join(frequencies),
              "runtime_steps": runtime_steps, "select": select or "",
              "seed": seed, "backward": backward,
              "invariance": invariance}
  n = 4 if fz is None else 5  # the campaign's stages
  with campaign_lock(directory):
    _check_settings(directory, settings)
    _check_sites_first(task, kut, select, seed)
    t0 = time.perf_counter()
    say(f"[1/{n}] golden run: {steps} steps, checkpoint every "
        f"{checkpoint_every} -> {directory}/golden")
    g = _golden.golden_train(task, os.path.join(directory, _files.GOLDEN_DIR),
                             steps=steps, checkpoint_every=checkpoint_every,
                             seed=seed, resume=True, evaluate=False,
                             store_golden_step=store_golden_step)
    _provenance.record(task, g.checkpoint_dir, kut, select, directory)
    iso = (f" (isolated: worker processes, {timeout_s:g} s per unit, "
           f"{memory_limit_mb} MiB)" if isolated else "")
    limits = dict(timeout_s=timeout_s, startup_s=startup_s,
                  memory_limit_mb=memory_limit_mb)
    bwd = (" with its VJP at the backward sites" if backward == "kut"
           else "")
    plan = _Phases(
        playback=(f"[2/{n}] playback FI of {kut_spec}{bwd} at "
                  f"{len(g.steps) - 1} checkpoints{iso}"),
        runtime=(f"[3/{n}] runtime FI{bwd}: {', '.join(frequencies)}, "
                 f"{runtime_steps} steps{iso}") if frequencies else None)
    if isolated:
      common = dict(campaign_dir=directory, select=select, progress=say,
                    **limits)
      _isolated_phases(
          plan, say,
          lambda: _isolation.isolated_playback(
              factory, g.workdir, kut, invariance=invariance,
              replay_golden_step=not store_golden_step, **common),
          lambda: _isolation.isolated_runtime(
              factory, g.workdir, kut, frequencies=frequencies,
              steps=runtime_steps, **common))
    else:
      say(plan.playback)
      playback(task, g.workdir, kut, campaign_dir=directory,
               select=select, progress=say, backward=backward,
               invariance=invariance,
               replay_golden_step=not store_golden_step)
      if frequencies:
        say(plan.runtime)
        runtime(task, g.workdir, kut, frequencies=frequencies,
                steps=runtime_steps, campaign_dir=directory,
                select=select, progress=say, backward=backward)
    if fz is None:
      return _finish(directory, kut_spec, backward, say, t0, n)
  # peat.profile holds the campaign lock itself (a second flock of this
  # process on the file would fail): the capture runs between the two.
  failed = None
  try:
    _capture_for_fuzz(task, kut, directory, fz, steps=steps,
                      checkpoint_every=checkpoint_every, seed=seed, say=say,
                      label=f"[4/{n}]")
  except PeatError as err:
    failed = err
  with campaign_lock(directory):
    if failed is None:
      try:
        _fuzz_variants(task, kut, directory, fz, say)
      except PeatError as err:
        failed = err
    paths = _finish(directory, kut_spec, backward, say, t0, n)
  if failed is not None:  # the training report is written all the same
    raise PeatError(
        f"fuzzing the shapes beyond training failed: {failed} The training "
        f"verdict is {paths.verdict} (report: {paths.html}); running again "
        "resumes the campaign and skips what is done.") from failed
  return paths


class _Phases(NamedTuple):
  """The headers of a campaign's playback and runtime FI stages (None: the
  stage does not run)."""

  playback: str
  runtime: str | None


def side_by_side() -> bool:
  """Whether a campaign's isolated playback and runtime FI workers run at
  the same time: on CPU with two cores or more, where each worker's
  compilation (mostly one thread) takes a core the other leaves idle. On
  an accelerator they run one after the other, as two processes would
  each claim most of the device's memory."""
  return (jax.default_backend() == "cpu"
          and (_provenance.visible_cores() or 1) >= 2)


def _isolated_phases(plan: _Phases, say: Callable[[str], None],
                     play: Callable[[], object],
                     run: Callable[[], object]) -> None:
  """Isolated playback and runtime FI, side by side where
  :func:`side_by_side` allows. The two write different record files (and
  append findings under ``files``' lock); each one's records are kept
  when the other fails, whose error is raised after both ended.

  Raises:
    PeatError: either stage's error (playback's first).
  """
  say(plan.playback)
  if plan.runtime is None:
    play()
    return
  if not side_by_side():
    play()
    say(plan.runtime)
    run()
    return
  say(plan.runtime + " (side by side with playback)")
  with concurrent.futures.ThreadPoolExecutor(
      1, thread_name_prefix="peat-runtime") as pool:
    pending = pool.submit(run)
    try:
      play()
    finally:
      err = pending.exception()  # waits: runtime's records are kept
    if err is not None:
      raise err


def _finish(directory: str, kut_spec: str, backward: str,
            say: Callable[[str], None], t0: float, n: int) -> CampaignPaths:
  """The verdicts and the report, from the records on disk."""
  say(f"[{n}/{n}] verdict and report")
  # The report is built from the records on disk, by the same loader
  # as peat.rebuild_report (peat-report), so the two are the same.
  data = _campaign_report.load_report_data(directory, kut=kut_spec,
                                           backward=backward)
  paths = _report.write_report(data, directory)
  say(_report.summary_table(data))
  say(f"report: {paths.html} ({time.perf_counter() - t0:.1f} s)")
  return CampaignPaths(directory, str(paths.html), str(paths.json),
                       data["verdict"]["verdict"],
                       _campaign_report.fuzz_verdict_of(data))
