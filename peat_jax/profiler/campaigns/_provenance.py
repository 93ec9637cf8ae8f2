"""Verdict provenance: what exactly a campaign's records were made with.

A verdict covers the KUT that ran, on the platform and versions that ran
it, at the sites with the input shapes and dtypes exercised, in the phases,
checkpoint steps and runtime FI frequencies that have records, and nothing
else. :func:`collect` gathers the run-time half (the KUT with a content hash
of the user's code, the platform, the versions and the XLA flags, the
selected sites' shapes and dtypes) when ``peat.validate`` runs;
:func:`write` keeps it in ``provenance.json``; :func:`provenance` joins it
with what the record files show (phases, checkpoint steps, frequencies) as
the report's ``provenance`` (docs/report.md).

A KUT's content hash covers the files its code lives in, by spec source
(:data:`CONTENT_FILES`): the native library (``.so``) of a ``native:`` spec,
the source files of a registered KUT's callable and of the functions it
closes over (a built-in ``torch:<name>`` spec: the torch bridge module),
the module file and the function's source of a user's ``py:`` or
``torch:<module>:<function>`` spec, the shared library of an ``ffi:``
spec. A new spec source adds its own entry.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import platform as _platform
import sys
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax

from peat_jax import core as _core
from peat_jax import kernels as _kernels
from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import golden as _golden
from peat_jax.profiler import files as _files
from peat_jax.profiler.golden import saved_steps
from peat_jax.profiler.playback_fi import select_calls

PROVENANCE_FILE = _files.PROVENANCE_FILE
#: Distributions whose versions are recorded (when installed).
DISTRIBUTIONS = ("jax", "jaxlib", "numpy", "ml_dtypes", "flax", "optax",
                 "orbax-checkpoint")
#: Substrings of XLA flags known to change numerics (fast math, excess
#: precision, algorithm and autotuning choices, determinism, denormals,
#: device counts that change how work is split).
NUMERIC_FLAG_HINTS = ("fast_math", "fast_min_max", "excess_precision",
                      "precision", "autotune", "deterministic", "denormal",
                      "ftz", "triton", "cublas", "cudnn", "algorithm",
                      "reduce_precision", "device_count", "multi_thread",
                      "eigen")
_SKIP_MODULES = ("jax", "jaxlib", "numpy", "torch", "functools")


def sha256_file(path: str) -> str:
  """The SHA-256 hex digest of a file's bytes."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _native_files(spec: _kut.KutSpec) -> list[str]:
  return [_kernels.library_path(_kernels.jax_platform())]


def _code_files(fn: Any, depth: int = 3) -> list[str]:
  """Source files of a callable, a partial's function and its closure."""
  out: list[str] = []
  todo, seen = [(fn, 0)], set()
  while todo:
    f, d = todo.pop()
    if id(f) in seen or d > depth:
      continue
    seen.add(id(f))
    if isinstance(f, functools.partial):
      todo.append((f.func, d))
      continue
    module = getattr(f, "__module__", None) or ""
    if module.split(".")[0] in _SKIP_MODULES:
      continue
    try:
      path = inspect.getsourcefile(f)
    except TypeError:
      path = None
    if path and os.path.isfile(path) and path not in out:
      out.append(path)
    for cell in getattr(f, "__closure__", None) or ():
      try:
        v = cell.cell_contents
      except ValueError:  # an empty cell
        continue
      if callable(v):
        todo.append((v, d + 1))
  return out


def _custom_files(spec: _kut.KutSpec) -> list[str]:
  return _code_files(_kut.kut_callable(spec))


def _module_files(spec: _kut.KutSpec) -> list[str]:
  """A ``py:`` or ``torch:`` spec's module file and its function's code."""
  module, function = spec.parts
  what = f"KUT spec {spec.spec!r}"
  first = getattr(_core.import_user_module(module, what), "__file__", None)
  fn = _core.user_function(module, function, what)
  out = [first] if first and os.path.isfile(first) else []
  return out + [p for p in _code_files(fn) if p not in out]


def _library_files(spec: _kut.KutSpec) -> list[str]:
  """An ``ffi:`` spec's shared library."""
  return [spec.parts[0]]


#: Spec source -> the files whose bytes the KUT's content hash covers.
CONTENT_FILES: dict[str, Callable[[_kut.KutSpec], list[str]]] = {
    "native": _native_files,
    "custom": _custom_files,
    "py": _module_files,
    "torch": _module_files,
    "ffi": _library_files,
}


def content_hash(spec: _kut.KutSpec) -> dict | None:
  """The KUT's content hash: ``{"sha256", "files": [{"path", "sha256"}]}``.

  ``sha256`` is the digest of the files' digests in order. None for the
  golden kernel (nothing but jax ran) and for sources without files.

  Raises:
    PeatError: a file of the KUT cannot be read.
  """
  find = CONTENT_FILES.get(spec.source)
  files = find(spec) if find else []
  if not files:
    return None
  try:
    parts = [{"path": p, "sha256": sha256_file(p)} for p in files]
  except OSError as err:
    raise PeatError(f"cannot hash the code of KUT {spec.spec!r}: {err}. Fix: "
                    "rebuild or reinstall the KUT's library or module") from err
  whole = hashlib.sha256("".join(p["sha256"] for p in parts).encode())
  return {"sha256": whole.hexdigest(), "files": parts}


def kut_entry(spec: _kut.KutSpec) -> dict:
  """The provenance's ``kut``: the parsed spec and its content hash."""
  return {"spec": spec.spec, "source": spec.source, "kernel": spec.kernel,
          "variant": spec.variant, "tile": spec.tile,
          "site_kernel": spec.site_kernel, "content": content_hash(spec)}


def visible_cores() -> int | None:
  """The CPU cores this process may run on (its affinity on Linux, the
  machine's count elsewhere)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count()


def platform_entry() -> dict:
  """The provenance's ``platform``: backend, devices, host."""
  dev = jax.devices()[0]
  cores = visible_cores()
  return {"backend": jax.default_backend(), "device_kind": dev.device_kind,
          "device_count": jax.device_count(),
          "process_count": jax.process_count(),
          "platform_version": str(getattr(dev.client, "platform_version",
                                          "")),
          "system": _platform.system(), "machine": _platform.machine(),
          "cpu_count": os.cpu_count(), "cores_visible": cores,
          "python": _platform.python_version()}


def xla_flags(text: str | None = None) -> tuple[list[str], list[str]]:
  """``XLA_FLAGS`` entries: (those known to change numerics, the others)."""
  entries = (os.environ.get("XLA_FLAGS", "") if text is None else
             text).split()
  known = [e for e in entries if any(h in e for h in NUMERIC_FLAG_HINTS)]
  return known, [e for e in entries if e not in known]


def versions_entry(extra: Iterable[str] = ()) -> dict:
  """The provenance's ``versions``: libraries, XLA flags, jax config."""
  out: dict[str, Any] = {}
  out["peat_jax"] = _core.VERSION
  for name in tuple(DISTRIBUTIONS) + tuple(extra):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  if "torch" in sys.modules:  # a torch KUT ran: never imported here
    out["torch"] = str(getattr(sys.modules["torch"], "__version__", "?"))
  known, other = xla_flags()
  out["xla_flags"] = known
  out["xla_flags_other"] = other
  out["jax_default_matmul_precision"] = str(
      jax.config.jax_default_matmul_precision)
  out["jax_enable_x64"] = bool(jax.config.jax_enable_x64)
  return out


def site_entries(calls: Sequence[Any]) -> list[dict]:
  """The provenance's ``sites`` from selected calls (``select_calls``)."""
  return [{"site": c.site.name, "kernel": c.site.kernel,
           "phase": c.site.phase,
           "in_shapes": [list(map(int, s)) for s in c.site.in_shapes],
           "in_dtypes": [str(d) for d in c.site.in_dtypes]} for c in calls]


def collect(spec: _kut.KutSpec, calls: Sequence[Any]) -> dict:
  """The run-time provenance of a campaign (what :func:`write` stores).

  Args:
    spec: the KUT.
    calls: the selected sites (``_player.select_calls``).

  Returns:
    ``{"kut", "platform", "versions", "sites"}``.

  Raises:
    PeatError: the KUT's code cannot be hashed.
  """
  return {"kut": kut_entry(spec), "platform": platform_entry(),
          "versions": versions_entry(), "sites": site_entries(calls)}


def write(directory: str, prov: Mapping) -> None:
  """Writes ``provenance.json`` (atomically); an earlier environment that
  differs is kept in ``earlier`` (a campaign resumed elsewhere)."""
  path = os.path.join(directory, PROVENANCE_FILE)
  old = read(directory)
  prov = dict(prov)
  if old:
    earlier = list(old.get("earlier") or [])
    env = {k: old.get(k) for k in ("platform", "versions")}
    if env != {k: prov.get(k) for k in ("platform", "versions")} and (
        env not in earlier):
      earlier.append(env)
    if earlier:
      prov["earlier"] = earlier
  try:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(prov, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
  except OSError as err:
    raise PeatError(f"cannot write {path}: {err.strerror or err}. Fix: free "
                    "disk space or fix the directory's permissions") from err


def read(directory: str) -> dict:
  """``provenance.json`` of a campaign directory ({} when there is none).

  Raises:
    PeatError: the file is not a JSON object.
  """
  path = os.path.join(directory, PROVENANCE_FILE)
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except (OSError, ValueError) as err:
    raise PeatError(f"{path} is not readable JSON ({err}). Fix: delete it "
                    "and run the campaign again (peat.validate rewrites "
                    "it)") from err
  if not isinstance(out, dict):
    raise PeatError(f"{path} holds a {type(out).__name__}; expected a JSON "
                    "object. Fix: delete it and run the campaign again")
  return out


def provenance(stored: Mapping, kut: str, records: Sequence[Mapping],
               runtime_runs: Sequence[Mapping] | None, *,
               backward: str = "golden") -> dict:
  """The report's ``provenance``: the stored half joined with the records.

  Args:
    stored: ``provenance.json``'s content ({}: not recorded; the KUT comes
      from the spec, the sites from the records, without shapes).
    kut: the KUT spec of the report.
    records: the KUT's site records.
    runtime_runs: the report's runtime runs.
    backward: the campaign's backward setting: ``"kut"`` (the KUT's VJP
      ran at the backward sites) or ``"golden"``.

  Returns:
    ``{"kut", "platform", "versions", "sites", "phases", "backward",
    "checkpoint_steps", "frequencies", "runtime_steps"}`` (and ``earlier``
    environments when the campaign ran in several). ``phases`` are the
    records' phases (``fwd``, ``bwd``); without records, the stored
    sites'; ``bwd`` also when runtime FI ran the KUT's VJP.
  """
  sites = list(stored.get("sites") or [])
  known = {s["site"] for s in sites}
  for r in records:
    if r["site"] not in known:
      known.add(r["site"])
      sites.append({"site": r["site"], "kernel": r.get("kernel"),
                    "phase": r.get("phase")})
  ran = [r for r in runtime_runs or () if not r.get("crashed") and r["steps"]]
  phases = {r["phase"] for r in records if r.get("phase")}
  if not records:
    phases |= {s["phase"] for s in sites if s.get("phase")}
  if backward == "kut" and ran:
    phases.add("bwd")
  out = {"kut": dict(stored.get("kut") or {"spec": kut}),
         "platform": dict(stored.get("platform") or {}),
         "versions": dict(stored.get("versions") or {}),
         "sites": sites,
         "phases": sorted(phases),
         "backward": backward,
         "checkpoint_steps": sorted({int(r["step"]) for r in records}),
         "frequencies": [r["frequency"] for r in ran],
         "runtime_steps": ([ran[0]["steps"][0], ran[0]["steps"][-1]]
                           if ran else None)}
  if stored.get("earlier"):
    out["earlier"] = list(stored["earlier"])
  return out


def record(task: Any, checkpoint_dir: str, kut: _kut.CheckedSpec,
           select: str | Sequence[str] | None, directory: str) -> dict:
  """Collects and writes a campaign's provenance (``peat.validate``).

  The sites are selected on the golden run's first checkpoint, as playback
  selects them; the KUT itself does not run.

  Args:
    task: the golden run's task.
    checkpoint_dir: its checkpoint directory.
    kut: the KUT, as checked at the campaign's entry.
    select: the campaign's site selection.
    directory: the campaign directory.

  Returns:
    What was written.
  """
  state = _golden.restore_state(checkpoint_dir, task,
                                saved_steps(checkpoint_dir)[0])
  # The forward sites the KUT replaces (whatever its backward setting).
  calls, _ = select_calls(task, state, task.batch_at(int(state.data_position)),
                          kut._replace(backward="golden"), select)
  prov = collect(kut.spec, calls)
  write(directory, prov)
  return prov
