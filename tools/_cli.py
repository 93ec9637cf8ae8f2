"""Running an absl-flag tool with flags of its own.

Each tool keeps its flags in its own ``flags.FlagValues`` (``FLAGS`` in the
tool's module), so several tools (and their tests) live in one process
without clashing flag names; this module parses them and runs the tool's
``main``, like ``absl.app.run`` does for the global flags.

Also shared by the campaign tools: :class:`Eta` (progress lines with an
ETA), :func:`table` (the summary table printed at the end), :func:`parse_bytes`
(``--budget=64MiB``), :func:`make_task` (a scenario's task from flags),
:func:`define_task_flags` (the flags that name a golden run's task:
``--scenario`` ... or the user's ``--task=<module>:<function>``),
:func:`define_kut_flags` (``--kut`` and ``--kernel``),
:func:`define_backward_flag` (``--backward=golden|kut``),
:func:`define_invariance_flag` (``--invariance``),
:func:`define_fuzz_flags` (``--fuzz``, ``--fuzz_budget``, ``--fuzz_seed``,
``--fuzz_families``: the shapes beyond training; :func:`parse_fuzz_budget`),
``--compilation_cache`` (every tool: :func:`run` defines and applies it),
:func:`define_fail_on` and :func:`exit_status` (``--fail_on``: exit status 1
when the verdict, or the fuzz verdict, reaches it),
:func:`campaign_dir_and_checkpoints` (the campaign tools' required
directory and checkpoint list),
:func:`define_golden_steps_flags` (``--steps`` and ``--checkpoint_every``
of a golden run) and :func:`define_renamed_flags` (hidden placeholders of
flags a tool took under another name: exit status 2 and one ``error:`` line
naming the new flag). :func:`run` refuses positional arguments with exit
status 2.

One language across the tools: ``--campaign_dir`` is a campaign directory
(its golden run in ``<campaign_dir>/golden``); ``--scenario``,
``--batch_size``, ``--overrides``, ``--seed``, ``--task`` name the golden
run's task; ``--select`` is an fnmatch pattern narrowing sites; ``--steps``
counts golden training steps; ``--checkpoints`` lists the checkpoint steps to
play back; ``--runtime_steps`` counts runtime FI steps.
"""

import json
import os
import re
import sys
import time
from typing import Callable, NamedTuple

from absl import flags
from absl import logging

_HELP = ("--help", "-h", "--helpfull", "--helpshort", "-?")


def run(main: Callable[[list[str]], int], flag_values: flags.FlagValues,
        doc: str | None = None, argv: list[str] | None = None) -> None:
  """Parses ``argv`` into ``flag_values``, runs ``main``, exits with its status.

  Args:
    main: ``argv -> exit status``; reads the tool's flags.
    flag_values: the tool's own flags.
    doc: text printed above the flags by ``--help`` / ``--helpfull``.
    argv: command line (default ``sys.argv``).
  """
  argv = list(sys.argv if argv is None else argv)
  _define_compilation_cache(flag_values)
  if any(a in _HELP for a in argv[1:]):
    print((doc or "").strip() + "\n\nflags:\n" + flag_values.get_help())
    sys.exit(0)
  try:
    rest = flag_values(argv)
  except RenamedFlagError as e:  # the message names the new flag already
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except flags.Error as e:
    print(f"error: {e}\nPass --help to list this tool's flags.",
          file=sys.stderr)
    sys.exit(2)
  if stray(rest) is not None:
    sys.exit(2)
  from peat_jax import core as peat_core  # pylint: disable=g-import-not-at-top
  cache = flag_values["compilation_cache"]
  try:
    peat_core.use_compilation_cache(cache.value)
  except peat_core.PeatError as e:
    if cache.present:  # asked for: refused
      print(f"error: --compilation_cache: {e}", file=sys.stderr)
      sys.exit(2)
    # The default directory unusable (a read-only home): said, and the
    # tool runs without a cache.
    print(f"warning: no compilation cache: {e}", file=sys.stderr)
  logging.use_absl_handler()
  logging.set_verbosity(logging.WARNING)
  sys.exit(main(rest))


def _define_compilation_cache(flag_values: flags.FlagValues) -> None:
  """Defines ``--compilation_cache`` in a tool's flags (once)."""
  if "compilation_cache" in flag_values:
    return
  from peat_jax import core as peat_core  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string(
      "compilation_cache", peat_core.default_compilation_cache(),
      "Directory of the persistent cache of compiled executables: a "
      "campaign run again, a worker after a crash, a site replayed alone "
      "load what an earlier process compiled instead of compiling it "
      "again (peat_jax.core.use_compilation_cache). Empty: no cache. Default: "
      "$PEAT_JAX_COMPILATION_CACHE when set, else "
      "$XDG_CACHE_HOME/peat_jax/xla or ~/.cache/peat_jax/xla.",
      flag_values=flag_values)


def stray(argv: list[str]) -> int | None:
  """2 (after one ``error:`` line) when ``argv`` has positional arguments.

  Args:
    argv: what flag parsing left: the program name, then positionals.

  Returns:
    2 when there are positional arguments, else None.
  """
  if len(argv) > 1:
    print(f"error: unexpected positional arguments {argv[1:]}; this tool "
          "takes flags only (--name=value). Pass --help to list them.",
          file=sys.stderr)
    return 2
  return None


# ------------------------------------------------------------- progress


class Eta:
  """Prints progress lines of a loop with elapsed time and an ETA.

  Pass an instance as the ``progress`` callable of a library call: every
  line is printed; a line that starts with one of ``prefixes`` counts as one
  finished unit of ``total`` and gets ``[k/total, elapsed, ETA]`` appended.
  ETA = units left x the mean time per unit after the first (the first
  unit's time holds compilation and whatever ran before the loop; it is the
  estimate only until a second unit finishes).

  >>> eta = Eta(4, prefixes=("playback step",))
  >>> eta("playback step 0: ...")   # doctest: +SKIP
  playback step 0: ... [1/4, 2.1 s elapsed, ETA 6.3 s]

  Args:
    total: units the loop will finish.
    prefixes: which lines count as a unit (all lines when empty).
    out: where lines go (default ``print``).
    clock: time source in seconds (for tests).
  """

  def __init__(self, total: int, prefixes: tuple = (), out=print,
               clock=None):
    self.total = int(total)
    self.prefixes = tuple(prefixes)
    self.done = 0
    self._out = out
    self._clock = clock or time.perf_counter
    self._t0 = self._clock()
    self._first = self._t0

  def __call__(self, line: str) -> None:
    if self.prefixes and not line.startswith(self.prefixes):
      self._out(line)
      return
    now = self._clock()
    self.done += 1
    if self.done == 1:
      self._first = now
    elapsed = now - self._t0
    left = max(self.total - self.done, 0)
    # Mean unit time after the first (which holds compilation and whatever
    # ran before the loop); the first unit's own time until there are two.
    per = ((now - self._first) / (self.done - 1) if self.done > 1
           else elapsed)
    eta = per * left
    self._out(f"{line} [{self.done}/{self.total}, {_secs(elapsed)} elapsed,"
              f" ETA {_secs(eta)}]")


def _secs(s: float) -> str:
  if s < 60:
    return f"{s:.1f} s"
  m, s = divmod(int(round(s)), 60)
  return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def table(rows: list, headers: tuple) -> str:
  """A fixed-width text table (the summary tools print at the end).

  Args:
    rows: one sequence of cells per row (any values; floats get 4
      significant digits).
    headers: column names.

  Returns:
    The table with a header and a rule, one line per row.
  """
  def cell(v):
    if isinstance(v, float):
      return f"{v:.4g}"
    return "-" if v is None else str(v)

  text = [tuple(map(str, headers))] + [tuple(cell(v) for v in r)
                                       for r in rows]
  widths = [max(len(r[i]) for r in text) for i in range(len(headers))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
           for r in text]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6,
          "mb": 10**6, "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_bytes(text: str) -> int:
  """Parses a size such as ``500000``, ``64MiB``, ``1.5GB`` or ``300kb``.

  Raises:
    ValueError: text that is not a number with an optional unit (B, kB,
      KiB, MB, MiB, GB, GiB).
  """
  m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
  if not m or m.group(2).lower() not in _UNITS:
    raise ValueError(f"expected a size like 500000, 64MiB or 1.5GB; got "
                     f"{text!r}")
  return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def make_task(scenario: str, workdir: str, *, overrides: str | None = None,
              batch_size: int | None = None, seed: int = 0,
              init_from: str | None = None, progress=print):
  """The scenario's task, as the campaign tools build it from their flags.

  Tasks are cached per (scenario, workdir, overrides, batch size, seed,
  init_from) in the process, so tools run one after another (or their
  tests) reuse one task and its compiled train step.

  Args:
    scenario: scenario name (``peat_jax.models.scenario_names()``).
    workdir: the campaign directory; a finetuning scenario keeps its
      pretraining run in ``<workdir>/task/pretrain`` (``models.prepare_task``
      of ``<workdir>/task``), unless ``init_from`` names one.
    overrides: JSON object of config overrides, or None.
    batch_size: overrides the batch size when set.
    seed: golden seed.
    init_from: a finetuning scenario's existing pretraining run, or None.
    progress: where pretraining lines go.

  Returns:
    The :class:`peat_jax.TrainTask`.

  Raises:
    peat_jax.PeatError: unknown scenario or config key, overrides that are
      not a JSON object.
  """
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  try:
    extra = json.loads(overrides) if overrides else {}
  except ValueError as e:
    raise peat.PeatError(f"--overrides must be a JSON object; got "
                         f"{overrides!r} ({e})") from e
  if not isinstance(extra, dict):
    raise peat.PeatError(f"--overrides must be a JSON object; got "
                         f"{overrides!r}")
  if batch_size:
    extra["batch_size"] = batch_size
  init_from = os.path.abspath(init_from) if init_from else None
  key = (scenario, os.path.abspath(workdir), json.dumps(extra, sort_keys=True),
         seed, init_from)
  if key not in _TASKS:
    from peat_jax import models  # pylint: disable=g-import-not-at-top
    _TASKS[key] = models.prepare_task(
        scenario, os.path.join(workdir, "task"), seed=seed,
        init_from=init_from, progress=progress, **extra)
  return _TASKS[key]


_TASKS: dict = {}


class TaskFlags(NamedTuple):
  """The flags of :func:`define_task_flags` (absl flag holders)."""

  scenario: flags.FlagHolder
  batch_size: flags.FlagHolder
  overrides: flags.FlagHolder
  seed: flags.FlagHolder
  user: flags.FlagHolder  # --task

  def task(self, workdir: str, progress=print,
           init_from: str | None = None):
    """:func:`make_task` from these flags' values, or the ``--task``'s.

    Args:
      workdir: the campaign directory (see :func:`make_task`).
      progress: where pretraining lines go.
      init_from: a finetuning scenario's pretraining run (see
        :func:`make_task`).

    Raises:
      UsageError: scenario flags together with ``--task``.
      peat_jax.PeatError: as :func:`make_task` or :func:`user_task`.
    """
    if self.user.value:
      check_task_flags(self.user, self.scenario, self.batch_size,
                       self.overrides)
      return user_task(self.user.value).build()
    return make_task(self.scenario.value, workdir,
                     overrides=self.overrides.value,
                     batch_size=self.batch_size.value, seed=self.seed.value,
                     init_from=init_from, progress=progress)

  def label(self) -> str | None:
    """The scenario's name, or None with ``--task`` (the task's own name)."""
    return None if self.user.value else self.scenario.value


TASK_HELP = ("The user's own task instead of --scenario: <module>:<function>"
             ", a function of a module on PYTHONPATH or in the current "
             "directory that returns a peat.TrainTask (peat.nnx_task builds "
             "one) or a peat.TaskFactory.")


def define_task_flag(flag_values: flags.FlagValues) -> flags.FlagHolder:
  """Defines ``--task=<module>:<function>`` in a tool's flags."""
  return flags.DEFINE_string("task", None, TASK_HELP, flag_values=flag_values)


def user_task(spec: str):
  """The :class:`peat_jax.TaskFactory` of ``--task=<module>:<function>``.

  Raises:
    peat_jax.PeatError: a spec not of that form.
  """
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  factory = peat.TaskFactory.from_spec(spec)
  key = ("user", spec)
  if key not in _TASKS:
    _TASKS[key] = _CachedFactory(factory)
  return _TASKS[key]


class _CachedFactory:
  """A TaskFactory whose task is built once in this process."""

  def __init__(self, factory):
    self.factory = factory
    self._task = None

  def build(self):
    if self._task is None:
      self._task = self.factory.build()
    return self._task


def check_task_flags(task: flags.FlagHolder, *scenario_flags) -> None:
  """Refuses scenario flags given together with ``--task``.

  Raises:
    UsageError: a scenario flag set on the command line with --task.
  """
  given = [f"--{h.name}" for h in scenario_flags if h.present]
  if task.value and given:
    raise UsageError(f"{', '.join(given)} set the reference scenario, which "
                     f"--task={task.value} replaces; drop them (your task "
                     "function builds its own model, data and batch size)")


def define_task_flags(flag_values: flags.FlagValues,
                      what: str = "The golden run's") -> TaskFlags:
  """Defines --scenario, --batch_size, --overrides, --seed, --task.

  Args:
    flag_values: the tool's own ``FlagValues``.
    what: how the help texts begin, e.g. ``"Model playback: the golden
      run's"``.

  Returns:
    Their holders.
  """
  from peat_jax import models  # pylint: disable=g-import-not-at-top
  return TaskFlags(
      flags.DEFINE_string(
          "scenario", models.DEFAULT_SCENARIO,
          f"{what} scenario, one of {models.scenario_names()}.",
          flag_values=flag_values),
      flags.DEFINE_integer("batch_size", None, f"{what} batch size override.",
                           flag_values=flag_values),
      flags.DEFINE_string("overrides", None,
                          f"{what} JSON config overrides.",
                          flag_values=flag_values),
      flags.DEFINE_integer("seed", 0, f"{what} seed.",
                           flag_values=flag_values),
      define_task_flag(flag_values))


class KutFlags(NamedTuple):
  """The flags of :func:`define_kut_flags` (absl flag holders)."""

  kut: flags.FlagHolder
  kernel: flags.FlagHolder

  def spec(self):
    """The parsed KUT spec (the bridge imported first for torch: specs).

    Raises:
      peat_jax.PeatError: as :func:`peat_jax.kernels.parse_kut`.
    """
    import peat_jax as peat  # pylint: disable=g-import-not-at-top
    if self.kut.value.startswith("torch:"):
      import peat_jax.bridges  # pylint: disable=g-import-not-at-top,unused-import  # registers torch: specs
    return peat.kernels.parse_kut(self.kut.value, self.kernel.value)


KUT_HELP = ("KUT spec: golden, native:<kernel>:<variant>[@tile], a "
            "registered torch:<name>, or your own py:<module>:<function>, "
            "ffi:<library.so>:<forward>[:<backward>] or "
            "torch:<module>:<function> with --kernel "
            "(peat_jax.kernels.known_specs(); docs/kernels.md).")


def kernel_help() -> str:
  """``--kernel``'s help: the site kernels, from their calling conventions."""
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  return ("The site kernel a py:, ffi: or torch:<module>:<function> KUT "
          f"replaces: {', '.join(peat.kernels.SITE_KERNELS)} (a py: KUT: "
          "any kernel of the step, called with its primitive's operands and "
          "parameters). Each kernel's KUT signature: docs/kernels.md, "
          "\"The KUT signature of each site kernel\".")


def define_kut_flags(flag_values: flags.FlagValues,
                     default: str | None = "native:conv2d:in_bf16"
                     ) -> KutFlags:
  """Defines ``--kut`` and ``--kernel`` in a tool's flags."""
  return KutFlags(
      flags.DEFINE_string("kut", default, KUT_HELP, flag_values=flag_values),
      flags.DEFINE_string(
          "kernel", None, kernel_help(), flag_values=flag_values))


def define_fail_on(flag_values: flags.FlagValues) -> flags.FlagHolder:
  """Defines ``--fail_on`` (CI: exit status 1 when the verdict reaches it)."""
  return flags.DEFINE_enum(
      "fail_on", "fail", ["fail", "warn", "never"],
      "Exit status 1 when the KUT's verdict reaches this (fail: a fail "
      "verdict; warn: warn or fail; never: always 0). Bad input exits 2.",
      flag_values=flag_values)


def exit_status(verdict: str, fail_on: str,
                fuzz_verdict: str | None = None) -> int:
  """1 when ``verdict`` or ``fuzz_verdict`` reaches ``fail_on``, else 0.

  Prints why on stderr.

  Args:
    verdict: the training verdict.
    fail_on: ``--fail_on``'s value.
    fuzz_verdict: the verdict of the shapes beyond training (``--fuzz``),
      or None.
  """
  import peat_jax as peat  # pylint: disable=g-import-not-at-top
  status = 0
  for what, v in (("verdict", verdict), ("fuzz verdict", fuzz_verdict)):
    if v is not None and peat.detector.reaches(v, fail_on):
      print(f"{what} {v} reaches --fail_on={fail_on}: exit status 1",
            file=sys.stderr)
      status = 1
  return status


def define_backward_flag(flag_values: flags.FlagValues):
  """Defines --backward=golden|kut in a campaign tool's flags.

  Args:
    flag_values: the tool's own ``FlagValues``.

  Returns:
    The flag's holder.
  """
  return flags.DEFINE_enum(
      "backward", "golden", ["golden", "kut"],
      "golden: the golden kernel at the backward sites (the forward-only "
      "question); kut: the KUT's VJP at the backward sites of the selected "
      "forward sites (native backward targets, torch autograd, a registered "
      "KUT's own custom_vjp), each backward site recorded. A campaign "
      "directory holds one or the other.", flag_values=flag_values)


def define_invariance_flag(flag_values: flags.FlagValues):
  """Defines --[no]invariance in a playback tool's flags.

  Args:
    flag_values: the tool's own ``FlagValues``.

  Returns:
    The flag's holder.
  """
  return flags.DEFINE_bool(
      "invariance", False,
      "Also probe the KUT at each forward site and composite backward site "
      "for stale outputs (an earlier call's values), inputs changed in "
      "place, ignored inputs and batch variance (five more KUT calls per "
      "site and checkpoint; docs/detector.md).", flag_values=flag_values)


def define_store_golden_step_flag(flag_values: flags.FlagValues):
  """Defines --store_golden_step=on|off in a tool that runs golden training.

  Args:
    flag_values: the tool's own ``FlagValues``.

  Returns:
    The flag's holder (``.value`` is ``"on"`` or ``"off"``).
  """
  return flags.DEFINE_enum(
      "store_golden_step", "on", ["on", "off"],
      "on: the golden run keeps the parameters after each checkpoint's next "
      "step (one parameter set per checkpoint, golden/golden_step/), so "
      "playback runs the KUT's step alone, the golden kernel tapped beside "
      "it. off: playback replays the golden step beside the KUT's.",
      flag_values=flag_values)


def parse_fuzz_budget(text: str | None) -> dict:
  """Parses ``--fuzz_budget``: a count of variants or a time in seconds.

  >>> parse_fuzz_budget("40"), parse_fuzz_budget("120s")
  ({'budget_cases': 40}, {'budget_seconds': 120.0})

  Args:
    text: ``"40"`` (at most 40 variants), ``"120s"`` or ``"1.5s"`` (no
      variant starts after that many seconds), or None / ``""`` (the
      library's default).

  Returns:
    ``{"budget_cases": n}``, ``{"budget_seconds": s}`` or ``{}``.

  Raises:
    UsageError: anything else, or a budget that is not positive.
  """
  if text is None or not str(text).strip():
    return {}
  t = str(text).strip()
  m = re.fullmatch(r"([0-9]+)", t)
  if m and int(m.group(1)) > 0:
    return {"budget_cases": int(m.group(1))}
  m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*s", t)
  if m and float(m.group(1)) > 0:
    return {"budget_seconds": float(m.group(1))}
  raise UsageError(f"--fuzz_budget must be a positive number of variants "
                   f"(e.g. 40) or of seconds (e.g. 120s); got {text!r}")


class FuzzFlags(NamedTuple):
  """The flags of :func:`define_fuzz_flags` (absl flag holders)."""

  fuzz: flags.FlagHolder
  budget: flags.FlagHolder
  seed: flags.FlagHolder
  families: flags.FlagHolder

  def settings(self) -> dict | None:
    """The fuzz settings of these flags, or None without ``--fuzz``.

    The keys are keywords of ``peat.fuzz`` and settings of
    ``peat.validate(..., fuzz=...)``: ``budget_cases`` or
    ``budget_seconds`` (from ``--fuzz_budget``; absent: the library's
    default), ``seed`` and ``families`` (absent when the flag is not
    given). A tool that fuzzes passes them on, e.g.
    ``peat.fuzz(campaign_dir, spec, **fuzz_flags.settings())``.

    Raises:
      UsageError: a bad ``--fuzz_budget`` or family, or a ``--fuzz_*``
        flag without ``--fuzz``.
    """
    budget = parse_fuzz_budget(self.budget.value)
    given = [f"--{h.name}" for h in (self.budget, self.seed, self.families)
             if h.present]
    if not self.fuzz.value:
      if given:
        raise UsageError(f"{', '.join(given)} set how the shapes beyond "
                         "training are fuzzed; add --fuzz to fuzz them")
      return None
    out = dict(budget)
    if self.seed.value is not None:
      out["seed"] = int(self.seed.value)
    if self.families.value:
      import peat_jax as peat  # pylint: disable=g-import-not-at-top
      known = tuple(peat.profiler.FUZZ_FAMILIES)
      bad = [f for f in self.families.value if f not in known]
      if bad:
        raise UsageError(f"--fuzz_families: unknown families {bad}; "
                         f"expected some of {list(known)}")
      out["families"] = list(self.families.value)
    return out


def _fuzz_families() -> tuple[str, ...]:
  """The fuzz's variant families (``peat_jax.profiler.FUZZ_FAMILIES``)."""
  from peat_jax.profiler import FUZZ_FAMILIES  # pylint: disable=g-import-not-at-top
  return FUZZ_FAMILIES


def define_fuzz_flags(flag_values: flags.FlagValues) -> FuzzFlags:
  """Defines --fuzz, --fuzz_budget, --fuzz_seed and --fuzz_families.

  The shapes beyond training: the KUT on variants of its sites' captured
  real inputs (``peat.fuzz``), with a verdict of its own. A tool reads
  them with :meth:`FuzzFlags.settings` (None without ``--fuzz``; a
  :class:`UsageError`, exit status 2, on bad values), e.g.::

    _FUZZ = _cli.define_fuzz_flags(FLAGS)
    ...
    fuzz = _FUZZ.settings()          # in main, inside its try
    if fuzz is not None:
      r = peat.fuzz(campaign_dir, spec, task=task, **fuzz)

  Args:
    flag_values: the tool's own ``FlagValues``.

  Returns:
    Their holders.
  """
  return FuzzFlags(
      flags.DEFINE_bool(
          "fuzz", False,
          "Also fuzz the shapes beyond training: run the KUT on variants of "
          "its forward sites' captured real inputs (other batch sizes, one "
          "row, lengths around multiples of 8..128 and 4096 and past 2^14, "
          "attention masks and head layouts, magnitudes up to the overflow "
          "edge, denormals; peat.fuzz). Their verdict is kept apart from "
          "the training verdict.", flag_values=flag_values),
      flags.DEFINE_string(
          "fuzz_budget", None,
          "With --fuzz: at most this many variants (e.g. 40), or no "
          "variant started after this many seconds (e.g. 120s). Default: "
          "the library's (peat.validate: 40 variants).",
          flag_values=flag_values),
      flags.DEFINE_integer(
          "fuzz_seed", None, "With --fuzz: the variants' seed (default 0).",
          flag_values=flag_values),
      flags.DEFINE_list(
          "fuzz_families", None,
          "With --fuzz: only these variant families, some of "
          + ", ".join(_fuzz_families()) + " (default all).",
          flag_values=flag_values))


def define_report_backward_flag(flag_values: flags.FlagValues):
  """Defines --backward for the tools that read a campaign's records.

  Returns:
    The flag's holder (None: the campaign's setting).
  """
  return flags.DEFINE_enum(
      "backward", None, ["golden", "kut"],
      "The records of which backward setting (default: campaign.json's, "
      "else kut when the KUT has only such records, else golden).",
      flag_values=flag_values)


class UsageError(ValueError):
  """A flag value a tool cannot run with (printed as ``error: ...``)."""


def campaign_dir_and_checkpoints(campaign_dir: str | None,
                                 checkpoints: list[str] | None
                                 ) -> tuple[str, list[int] | None]:
  """The campaign tools' required --campaign_dir and optional --checkpoints.

  Args:
    campaign_dir: ``--campaign_dir``'s value.
    checkpoints: ``--checkpoints``' value (checkpoint steps, or with
      ``peat-playback --ops`` capture steps), or None for all.

  Returns:
    ``(absolute directory, checkpoint steps as ints or None)``.

  Raises:
    UsageError: no directory, or checkpoint steps that are not integers.
  """
  if not campaign_dir:
    raise UsageError("--campaign_dir is required (a campaign made by "
                     "peat-golden, peat-profile or peat-validate)")
  try:
    ints = [int(s) for s in checkpoints] if checkpoints else None
  except ValueError:
    raise UsageError(f"--checkpoints must be integers (checkpoint steps, "
                     f"e.g. --checkpoints=0,10); got {checkpoints}"
                     ) from None
  return os.path.abspath(campaign_dir), ints


def define_golden_steps_flags(flag_values: flags.FlagValues,
                              steps: int | None = 40,
                              checkpoint_every: int | None = 10,
                              steps_note: str = ""
                              ) -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """Defines ``--steps`` and ``--checkpoint_every`` of a golden run.

  ``--steps`` means golden training steps in every tool that takes it
  (peat-golden, peat-profile, peat-validate); checkpoint steps to play back
  are ``--checkpoints``, runtime FI steps ``--runtime_steps``.

  Args:
    flag_values: the tool's own ``FlagValues``.
    steps: default of ``--steps`` (None: the scenario's own budget).
    checkpoint_every: default of ``--checkpoint_every`` (None: the
      scenario's own).
    steps_note: appended to ``--steps``' help.

  Returns:
    Their holders.
  """
  default = " Default: the scenario's budget." if steps is None else ""
  every = (" Default: the scenario's interval." if checkpoint_every is None
           else "")
  return (
      flags.DEFINE_integer(
          "steps", steps, "Golden training steps (optimizer steps of the "
          f"golden run).{default}{steps_note}", flag_values=flag_values),
      flags.DEFINE_integer(
          "checkpoint_every", checkpoint_every, "Golden checkpoint interval "
          f"in steps (= model playback points).{every}",
          flag_values=flag_values))


# ------------------------------------------------------------ renamed flags


class RenamedFlagError(flags.IllegalFlagValueError):
  """A flag a tool took under an old name, passed anyway.

  Its message names the new flag and what it means; :func:`run` prints it as
  one ``error:`` line and exits with status 2.
  """


class _RenamedFlag(flags.BooleanFlag):
  """A hidden placeholder: any use (``--old``, ``--old=x``, ``--noold``)
  raises :class:`RenamedFlagError` while the command line is parsed."""

  def __init__(self, name: str, message: str):
    super().__init__(name, None, message)
    self.message = message

  def parse(self, argument) -> None:
    del argument
    raise RenamedFlagError(self.message)


CHECKPOINTS_RENAMED = (
    "checkpoints", "the checkpoint steps to play back, e.g. "
    "--checkpoints=0,10; --steps counts golden training steps only "
    "(peat-golden, peat-profile, peat-validate)")


def define_renamed_flags(flag_values: flags.FlagValues,
                         **renamed: tuple[str, str]) -> None:
  """Defines hidden placeholders of flags this tool took under old names.

  A command line that uses one exits with status 2 and one line,
  ``error: --<old> is now --<new>: <meaning>``, instead of an unknown-flag
  error (or, worse, an old name that silently means something else). The
  placeholders are not listed by ``--help``.

  >>> define_renamed_flags(FLAGS, workdir=(
  ...     "campaign_dir", "the golden run goes to <campaign_dir>/golden"))

  Args:
    flag_values: the tool's own ``FlagValues``.
    **renamed: ``old name=(new name, what the new flag means)``.
  """
  for old, (new, meaning) in renamed.items():
    # Registered by name only (no defining module): get_help() lists flags
    # by module, so the placeholder stays out of --help.
    flag_values[old] = _RenamedFlag(old, f"--{old} is now --{new}: "
                                         f"{meaning}")
