"""The package structure: the public API, the import rule and the layering.

* ``peat_jax`` exports the same public names as before the component
  packages (name for name), each the object its package facade exports;
* a package name is never a public function's name (``import
  peat_jax.inject`` would hand back the function);
* outside ``peat_jax/`` (tools, bridges, models, benchmarks, scripts, the
  docs and the README) nothing imports a private module of the library;
* inside ``peat_jax/``, imports point one way along :data:`LAYERS`, across
  packages only through a package's facade, and never reach the model zoo,
  the tools, the bridges or torch;
* inside a package made of parts (:data:`PARTS`: the Analyzer's references,
  signature, slips and probes; the Detector's facts, hypotheses, verdicts and
  calibration; the Profiler's campaign files, golden runs,
  playback, runtime FI, captures, isolation, scale-out, campaigns),
  imports point one way along the parts and across parts only through a
  part's facade;
* no circle of imports exists anywhere in ``peat_jax/`` (module-level and
  deferred imports alike), and no package or part holds more than
  :data:`MAX_MODULES` modules.
"""

import ast
import glob
import importlib
import os
import re
import types

import pytest

import peat_jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The public names of peat_jax (tests/test_structure.py is their list).
PUBLIC = sorted("""
COMPUTATION_ERROR_MODELS Campaign CampaignPaths Candidate CheckpointError
Diagnosis ERROR_MODELS EveryCall EveryNSteps Fraction FuzzResult GOLDEN GoldenResult
InjectGradientsState InjectionRecord Monitor OpsResult PeatError
PlaybackResult ProfileResult REFERENCES RecordFileError ReportPaths
RuntimeResult Signature SignatureState Site SiteTable Substitution
TENSOR_ERROR_MODELS Tap TaskFactory TrainState TrainTask Verdict
abstract_state analyze analyze_batch bit_probabilities campaign check_kut
composite composite_call data_parallel_runtime detect detect_batch
discover_sites export_repro forward_campaign ForwardCampaign fuzz golden_train init_distributed inject inject_gradients
inject_tree injecting_kernel injection_params kernel_campaign nnx_task playback
playback_many playback_ops profile read_campaign read_log rebuild_report reference
reference_attention reference_conv reference_cross_entropy
reference_dot_general reference_gelu reference_layer_norm reference_matmul
reference_rope reference_silu reference_softmax register_kut replay resolve_kut restore_state runtime
saved_steps select_sites shard_kut sharded_playback signature_finalize
signature_init signature_pure signature_update substitute tap validate
verdict write_report
""".split())

#: The packages of peat_jax, lowest first: a package imports only packages
#: before it (and itself).
LAYERS = ("core", "sites", "kernels", "injectors", "analyzer", "detector",
          "report", "profiler", "testing")
#: Packages made of parts (sub-packages), lowest part first: a part imports
#: only parts before it (and itself), through their facades.
PARTS = {
    "analyzer": ("references", "signature", "slips", "probes"),
    "detector": ("facts", "hypotheses", "verdicts", "calibration"),
    "profiler": ("files", "golden", "playback_fi", "runtime_fi", "capture",
                 "isolation", "scaleout", "fuzz", "campaigns"),
}
#: Top-level modules of peat_jax above every package (the facade).
TOP = ("__init__",)
OUTSIDE = ("tools", "bridges", "models", "benchmarks", "scripts")


def _public_now() -> list[str]:
  return sorted(n for n in dir(peat_jax) if not n.startswith("_")
                and not isinstance(getattr(peat_jax, n), types.ModuleType))


def test_public_names_are_those_of_before_name_for_name():
  assert _public_now() == PUBLIC


@pytest.mark.parametrize("package", LAYERS)
def test_each_package_has_a_facade_and_no_name_clash(package):
  mod = importlib.import_module(f"peat_jax.{package}")
  assert isinstance(mod, types.ModuleType) and mod.__doc__
  assert package not in PUBLIC  # import peat_jax.<package> is the package
  # Every name of the top-level API that the facade exports is the same object.
  for name in PUBLIC:
    if hasattr(mod, name):
      assert getattr(mod, name) is getattr(peat_jax, name), (package, name)


def test_every_public_name_comes_from_a_package_facade():
  src = open(os.path.join(ROOT, "peat_jax", "__init__.py")).read()
  imported = re.findall(r"^from peat_jax\.(\w+) import (\w+) as \2$", src,
                        re.M)
  assert sorted(n for _, n in imported) == PUBLIC
  assert {p for p, _ in imported} <= set(LAYERS)


def test_the_docstring_maps_peats_parts_to_packages():
  doc = peat_jax.__doc__
  for part in ("Profiler", "Analyzer", "Detector"):
    assert part in doc
  for package in LAYERS:
    assert f"peat_jax.{package}" in doc, package


# --------------------------------------------------------------- imports


def _imports(path: str):
  """(line, module) of every import statement of a Python file."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        yield node.lineno, a.name
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      yield node.lineno, node.module
      for a in node.names:
        yield node.lineno, f"{node.module}.{a.name}"


#: The library's packages (their parts included): private below them is
#: private to peat_jax/ (tools/ and bridges/ have private modules of their
#: own, installed as peat_jax.tools and peat_jax.bridges).
_LIBRARY = (r"(\.(core|sites|kernels|injectors|analyzer|detector|report|"
            r"profiler|testing)(\.[a-z]\w*)*)?")
_PRIVATE = re.compile(r"peat_jax" + _LIBRARY + r"\._\w+")


_FROM_PRIVATE = re.compile(r"from peat_jax" + _LIBRARY +
                           r" import \(?\s*(_\w+)")


def _private_uses(text: str) -> list[str]:
  dotted = [m.group(0) for m in _PRIVATE.finditer(text)
            if not m.group(0).startswith("peat_jax.__")]
  return dotted + [m.group(0) for m in _FROM_PRIVATE.finditer(text)]


def test_nothing_outside_peat_jax_imports_a_private_module():
  bad = []
  for top in OUTSIDE:
    for path in glob.glob(os.path.join(ROOT, top, "**", "*.py"),
                          recursive=True):
      for line, mod in _imports(path):
        if _private_uses(mod):
          bad.append(f"{os.path.relpath(path, ROOT)}:{line}: {mod}")
  docs = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                   recursive=True) + [
      os.path.join(ROOT, "README.md"), os.path.join(ROOT, "BUILD.md")]
  for path in docs:
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
      for use in _private_uses(line):
        bad.append(f"{os.path.relpath(path, ROOT)}:{i}: {use}")
  assert not bad, "private modules used outside peat_jax/:\n" + "\n".join(bad)


def _package_of(path: str) -> str:
  rel = os.path.relpath(path, os.path.join(ROOT, "peat_jax")).split(os.sep)
  return rel[0] if len(rel) > 1 else os.path.splitext(rel[0])[0]


def test_imports_inside_peat_jax_point_one_way_through_facades():
  rank = {p: i for i, p in enumerate(LAYERS)}
  bad = []
  for path in glob.glob(os.path.join(ROOT, "peat_jax", "**", "*.py"),
                        recursive=True):
    own = _package_of(path)
    where = os.path.relpath(path, ROOT)
    for line, mod in _imports(path):
      parts = mod.split(".")
      if parts[0] == "torch":
        bad.append(f"{where}:{line}: imports torch (only bridges/ may)")
      if parts[0] != "peat_jax" or len(parts) < 2:
        continue
      target = parts[1]
      if target in ("models", "tools", "bridges"):
        bad.append(f"{where}:{line}: imports {mod} (peat_jax/ never "
                   "imports the model zoo, the tools or the bridges)")
      if target not in rank or own in TOP or own == target:
        continue
      if own not in rank:
        bad.append(f"{where}:{line}: module outside the packages")
      elif rank[target] > rank[own]:
        bad.append(f"{where}:{line}: {own} imports {mod}, a higher layer")
      elif len(parts) > 2 and parts[2].startswith("_"):
        bad.append(f"{where}:{line}: {own} imports {mod}, a private module "
                   f"of {target} (use the peat_jax.{target} facade)")
  assert not bad, "\n".join(bad)


def _part_of(path: str) -> tuple[str, str] | None:
  """(package, part) of a module inside a part of a package with parts."""
  rel = os.path.relpath(path, os.path.join(ROOT, "peat_jax")).split(os.sep)
  if len(rel) > 2 and rel[0] in PARTS:
    return rel[0], rel[1]
  return None


def test_parts_of_a_package_point_one_way_through_facades():
  bad = []
  for package, parts in PARTS.items():
    rank = {p: i for i, p in enumerate(parts)}
    for path in glob.glob(os.path.join(ROOT, "peat_jax", package, "**",
                                       "*.py"), recursive=True):
      own = _part_of(path)
      where = os.path.relpath(path, ROOT)
      if own is None:
        continue  # the package's own facade
      assert own[1] in rank, f"{where}: part {own[1]} not in PARTS"
      for line, mod in _imports(path):
        p = mod.split(".")
        if p[:2] != ["peat_jax", package] or len(p) < 3:
          continue
        if p[2].startswith("_"):
          bad.append(f"{where}:{line}: imports {mod}, a module outside the "
                     f"parts of {package}")
          continue
        target = p[2]
        if target not in rank:
          continue  # a public name of the package's facade: not allowed below
        if target == own[1]:
          continue
        if rank[target] > rank[own[1]]:
          bad.append(f"{where}:{line}: {own[1]} imports {mod}, a higher part "
                     f"of {package}")
        elif len(p) > 3 and p[3].startswith("_"):
          bad.append(f"{where}:{line}: {own[1]} imports {mod}, a private "
                     f"module of part {target} (use its facade "
                     f"peat_jax.{package}.{target})")
      for line, mod in _imports(path):
        p = mod.split(".")
        if p[:2] == ["peat_jax", package] and len(p) == 3 and \
            p[2] not in rank and not p[2].startswith("_"):
          bad.append(f"{where}:{line}: imports {mod} from the facade of "
                     f"{package}, which stands above its parts")
  assert not bad, "\n".join(bad)


#: Most modules a package (or a part of one) holds before it is split into
#: parts a reader can find by name.
MAX_MODULES = 15


def test_no_package_or_part_outgrows_max_modules():
  big = []
  for init in glob.glob(os.path.join(ROOT, "peat_jax", "**", "__init__.py"),
                        recursive=True):
    folder = os.path.dirname(init)
    mods = [f for f in os.listdir(folder)
            if f.endswith(".py") and f != "__init__.py"]
    if len(mods) > MAX_MODULES:
      big.append(f"{os.path.relpath(folder, ROOT)}: {len(mods)} modules")
  assert not big, ("split these into parts (PARTS):\n" + "\n".join(big))


def _module_graph(root: str) -> dict[str, set[str]]:
  """Module -> the peat_jax modules it imports (anywhere in its code)."""
  modules = {}
  for path in glob.glob(os.path.join(root, "peat_jax", "**", "*.py"),
                        recursive=True):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] == "__init__":
      rel = rel[:-1]
    modules[".".join(rel)] = path
  graph = {}
  for name, path in modules.items():
    deps = set()
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}"
                   in modules else node.module for a in node.names]
      else:
        continue
      for t in targets:
        while t and t not in modules:
          t = t.rpartition(".")[0]
        if t and t != name:
          deps.add(t)
    graph[name] = deps
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One circle through each strongly connected group of modules, skipping
  a package's own facade importing its modules (the way in, not a circle
  unless a module imports the facade back)."""
  index, low, stack, on, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = []
      while True:
        w = stack.pop()
        on.discard(w)
        group.append(w)
        if w == v:
          break
      if len(group) > 1:
        found.append(sorted(group))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_circle_of_imports_anywhere_in_peat_jax():
  graph = _module_graph(ROOT)
  # A package's facade imports its modules, and they import other packages'
  # facades; a module importing a facade that (through others) imports the
  # module back is a circle.
  cycles = _cycles(graph)
  assert not cycles, "import circles:\n" + "\n".join(
      " <-> ".join(c) for c in cycles)


def test_the_circle_test_finds_a_circle(tmp_path):
  pkg = tmp_path / "peat_jax" / "kernels"
  pkg.mkdir(parents=True)
  (tmp_path / "peat_jax" / "__init__.py").write_text("")
  (pkg / "__init__.py").write_text("from peat_jax.kernels import kut\n")
  (pkg / "kut.py").write_text("from peat_jax.kernels import _user\n")
  (pkg / "_user.py").write_text(
      "def f():\n  from peat_jax.kernels import kut\n")
  assert _cycles(_module_graph(str(tmp_path))) == [
      ["peat_jax.kernels._user", "peat_jax.kernels.kut"]]


def test_the_layering_test_catches_a_violation(tmp_path, monkeypatch):
  """The two scans above fail on the violations they are for."""
  src = tmp_path / "peat_jax" / "sites"
  src.mkdir(parents=True)
  (src / "_bad.py").write_text(
      "from peat_jax.profiler import _golden\nimport torch\n")
  monkeypatch.setitem(globals(), "ROOT", str(tmp_path))
  with pytest.raises(AssertionError, match="a higher layer") as err:
    test_imports_inside_peat_jax_point_one_way_through_facades()
  assert "imports torch" in str(err.value)
  (tmp_path / "tools").mkdir()
  (tmp_path / "tools" / "x.py").write_text(
      "from peat_jax.analyzer.signature import _api\n")
  (tmp_path / "docs").mkdir()
  (tmp_path / "README.md").write_text("see peat_jax._campaign\n"
                                      "from peat_jax.profiler import _golden\n")
  (tmp_path / "BUILD.md").write_text("\n")
  with pytest.raises(AssertionError, match="tools/x.py:1") as err:
    test_nothing_outside_peat_jax_imports_a_private_module()
  assert "README.md:1: peat_jax._campaign" in str(err.value)
  assert "README.md:2: from peat_jax.profiler import _golden" in str(err.value)
