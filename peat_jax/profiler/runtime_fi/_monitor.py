"""A kernel under test inside a user's own training loop.

:class:`Monitor` wraps any train step ``(state, batch) -> (state, metrics)``
(a user's own Flax/Optax step; no model change): every step runs with the
kernel under test at the selected sites on the given schedule (runtime FI:
errors persist and propagate), and every ``record_every``-th step also taps
those sites, so the pseudo-error of each site, on identical inputs, is
analyzed against the golden kernel and its float64 reference, diagnosed,
and appended to ``<directory>/monitor.msgpack``. Both step variants are
jit-compiled once.

>>> with peat.Monitor(train_step, "native:matmul:in_bf16", "runs/mine",
...                   record_every=50) as mon:
...   for batch in data:
...     state, metrics = mon(state, batch)
>>> mon.verdict().summary
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Sequence

import jax

from peat_jax.profiler import files as _files
from peat_jax.profiler.files import campaign_lock
from peat_jax import detector as _detector
from peat_jax import sites as _sites
from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import playback_fi as _playback_fi

MONITOR_FILE = _files.MONITOR_FILE


class Monitor:
  """Runs a KUT in a user's training and streams signatures to a directory.

  Args:
    step_fn: the user's pure train step ``(state, batch) -> (state,
      metrics)`` (un-jitted or jitted).
    kut_spec: a spec of :func:`peat_jax.resolve_kut` (e.g.
      ``"native:matmul:acc_bf16"``, ``"golden"``, or a name given to
      :func:`peat_jax.register_kut`).
    directory: where ``monitor.msgpack`` is appended (created; locked while
      the monitor is open as a context manager).
    schedule: when the KUT runs on steps that are not recorded
      (``peat.EveryCall()``, ``peat.EveryNSteps(n)``, ``peat.Fraction(p)``).
    record_every: tap and record every this many calls.
    select: narrow the spec's sites: an ``fnmatch`` pattern or site names.
    counter: ``(state, batch) -> int32 step`` for schedules; default
      ``state.step``.
  """

  def __init__(self, step_fn: Callable,
               kut_spec: "str | _kut.KutSpec | _kut.CheckedSpec",
               directory: str | os.PathLike, *,
               schedule: Any = _sites.EveryCall(),
               record_every: int = 10,
               select: str | Sequence[str] | None = None,
               counter: Callable | None = None):
    if not isinstance(record_every, int) or record_every < 1:
      raise PeatError(f"record_every must be an int >= 1, got "
                      f"{record_every!r}")
    self._step_fn = step_fn
    kut = _kut.checked(kut_spec)  # parsed and checked now, once
    self._spec = kut.name
    self._subs = _kut.resolve_kut(kut.spec)
    self._schedule = schedule
    self._every = record_every
    self._select = select
    self._counter = counter
    self.directory = os.path.abspath(os.fspath(directory))
    os.makedirs(self.directory, exist_ok=True)
    self.path = os.path.join(self.directory, MONITOR_FILE)
    self._calls = 0
    self._chosen: list[tuple[_sites.Site, Any]] = []
    self._store: dict = {}
    self._tapped = self._run = None
    self._lock = None

  def __enter__(self) -> "Monitor":
    self._lock = contextlib.ExitStack()
    self._lock.enter_context(campaign_lock(self.directory))
    return self

  def __exit__(self, *exc) -> None:
    if self._lock is not None:
      self._lock.close()
      self._lock = None

  def _build(self, state, batch) -> None:
    table = _sites.discover_sites(self._step_fn, state, batch)
    for sub in self._subs:
      kw = dict(kernel=sub.kernel, phase=sub.phase, pattern=sub.pattern)
      if isinstance(self._select, str):
        kw["pattern"] = self._select
      elif self._select is not None:
        kw["names"] = tuple(self._select)
      self._chosen += [(s, sub) for s in _sites.select_sites(table, **kw)]
    if not self._chosen:
      raise PeatError(f"KUT {self._spec!r} selects no site of this train "
                      f"step (select={self._select!r}); list them with "
                      "peat.discover_sites(step_fn, state, batch)")
    names = tuple(s.name for s, _ in self._chosen)
    taps = [_sites.Substitution(
        _kut.recording(sub.kut, s.name, s.kernel, s.composite, self._store),
        sites=(s.name,)) for s, sub in self._chosen]
    self._tapped = jax.jit(_sites.tap(self._step_fn, *taps,
                                            continue_with="kut"))
    sub0 = self._chosen[0][1]
    self._run = jax.jit(_sites.substitute(
        self._step_fn, _sites.Substitution(
            sub0.kut, sites=names, schedule=self._schedule,
            backward=sub0.backward), counter=self._counter))

  def __call__(self, state, batch):
    """One training step with the KUT; returns ``(state, metrics)``."""
    if self._tapped is None:
      self._build(state, batch)
    call = self._calls
    self._calls += 1
    if call % self._every:
      return self._run(state, batch)
    step = int(getattr(state, "step", call))
    (new_state, metrics), taps = self._tapped(state, batch)
    records = [_playback_fi.site_record(site, self._store[site.name],
                                     taps[site.name], self._spec, step)
               for site, _ in self._chosen]
    _files.append_records(self.path, records)
    return new_state, metrics

  def records(self) -> list[dict]:
    """Every record written to ``monitor.msgpack`` so far."""
    return _files.read_records(self.path)

  def verdict(self) -> _detector.Verdict:
    """The verdict over the recorded (site, step) diagnoses.

    Raises:
      PeatError: nothing recorded yet.
    """
    recs = [r for r in self.records() if r.get("kut") == self._spec]
    if not recs:
      raise PeatError(f"no record in {self.path} yet: call the monitor for "
                      "at least one step")
    return _detector.verdict({(r["site"], r["step"]): _detector.diagnosis_of(r)
                              for r in recs})
