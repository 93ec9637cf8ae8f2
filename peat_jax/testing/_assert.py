"""``assert_kernel_trains``: a campaign as one assertion of a test suite."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Sequence

from peat_jax import detector as _detector
from peat_jax import kernels as _kernels
from peat_jax import profiler as _profiler
from peat_jax.core import PeatError


class KernelTrainingError(AssertionError):
  """The KUT's verdict reached ``fail_on``; the message holds the diagnoses.

  Attributes:
    results: the campaign's :class:`peat_jax.profiler.CampaignResults`.
    report: the path of its ``report.html``.
  """

  def __init__(self, message: str, results, report: str):
    super().__init__(message)
    self.results = results
    self.report = report


def _task(task):
  if isinstance(task, str):
    return _profiler.TaskFactory.from_spec(task)
  if isinstance(task, (_profiler.TrainTask, _profiler.TaskFactory)):
    return task
  raise PeatError(f"task must be a peat.TrainTask, a peat.TaskFactory or a "
                  f"'<module>:<function>' string; got {type(task).__name__}")


def _message(results, fail_on: str, report: str, limit: int = 10) -> str:
  v = results.verdict
  lines = [f"KUT {results.kut} on {results.scenario}: verdict "
           f"{v.verdict} reaches fail_on={fail_on!r}", f"  {v.summary}"]
  bad = [r for r in results.playback
         if _detector.reaches(r.verdict, fail_on)]
  worst: dict = {}
  for r in bad:  # the most severe, most confident record of each site
    key = (_detector.severity(r.verdict), r.confidence)
    if r.site not in worst or key > worst[r.site][0]:
      worst[r.site] = (key, r)
  for _, r in list(worst.values())[:limit]:
    ratio = "-" if r.noise_ratio is None else f"{r.noise_ratio:.3g}"
    lines.append(f"  {r.site}: {r.model} ({r.verdict}, confidence "
                 f"{r.confidence:.2f}, noise ratio {ratio}) at step "
                 f"{r.step}: {r.evidence}")
  if len(worst) > limit:
    lines.append(f"  ... and {len(worst) - limit} more sites")
  for f in results.crashes[:limit]:
    lines.append(f"  {f.kind} in {f.phase} (step {f.step}, site {f.site}): "
                 f"{f.message}")
  for run in results.runtime:
    if run.diverged_at is not None or run.crashed:
      lines.append(f"  runtime FI {run.frequency}: diverged at step "
                   f"{run.diverged_at} ({run.reason})")
  lines.append(f"  report: {report}")
  return "\n".join(lines)


def assert_kernel_trains(kut, *, kernel: str | None = None, task,
                         steps: int | None = None,
                         checkpoint_every: int | None = None,
                         frequencies: Sequence[str] = ("every",),
                         campaign_dir: str | os.PathLike | None = None,
                         fail_on: str = "fail", select: str | None = None,
                         seed: int = 0,
                         progress: Callable[[str], None] | None = None,
                         **validate_kwargs):
  """Validates a KUT inside real training; raises when its verdict is bad.

  Runs :func:`peat_jax.validate` (golden run, playback FI at every
  checkpoint, runtime FI at ``frequencies``, verdict, report) and raises
  :class:`KernelTrainingError` (an ``AssertionError``) when the verdict
  reaches ``fail_on``, with every offending site's diagnosis, the runtime
  divergences and the report's path as its message.

  Args:
    kut: a KUT spec (``"py:my_kernels:matmul"``, ``"ffi:..."``,
      ``"native:..."``, a registered name) or a parsed
      :class:`peat_jax.kernels.KutSpec`.
    kernel: the site kernel of a user spec (``"dot_general"``, ...).
    task: a :class:`peat_jax.TrainTask`, a :class:`peat_jax.TaskFactory`
      (for ``ffi:``/``native:`` KUTs: worker processes, crashes become
      findings) or ``"<module>:<function>"``.
    steps: golden training steps (task default when None).
    checkpoint_every: checkpoint interval (task default when None).
    frequencies: runtime FI frequencies; empty for playback only.
    campaign_dir: where the campaign goes (default: a new temporary
      directory, kept for the report); resumed when it exists.
    fail_on: ``"fail"`` (default), ``"warn"`` or ``"never"``.
    select: an ``fnmatch`` pattern narrowing the KUT's sites.
    seed: golden seed.
    progress: progress lines (None: silent).
    **validate_kwargs: further arguments of :func:`peat_jax.validate`.

  Returns:
    The campaign's :class:`peat_jax.profiler.CampaignResults` when the
    verdict does not reach ``fail_on``.

  Raises:
    KernelTrainingError: the verdict reaches ``fail_on``.
    PeatError: bad input (an unknown spec, a task that cannot be built, a
      bad ``fail_on``), as ``peat.validate``.
  """
  if fail_on not in _detector.FAIL_ON:
    raise PeatError(f"fail_on must be one of {', '.join(_detector.FAIL_ON)};"
                    f" got {fail_on!r}")
  spec = _kernels.checked(kut, validate_kwargs.get("backward", "golden"),
                          kernel)
  directory = os.fspath(campaign_dir) if campaign_dir is not None else (
      tempfile.mkdtemp(prefix="peat_kernel_trains_"))
  paths = _profiler.validate(
      _task(task), spec, directory, steps=steps,
      checkpoint_every=checkpoint_every, frequencies=tuple(frequencies),
      select=select, seed=seed, progress=progress, **validate_kwargs)
  results = _profiler.read_campaign(paths.directory, kut=spec.name)
  if _detector.reaches(results.verdict.verdict, fail_on):
    raise KernelTrainingError(_message(results, fail_on, paths.html),
                              results, paths.html)
  return results
