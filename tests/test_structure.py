"""The package structure: the public API, the import rule and the layering.

* ``peat_jax`` exports the same public names as before the component
  packages (name for name), each the object its package facade exports;
* a package name is never a public function's name (``import
  peat_jax.inject`` would hand back the function);
* outside ``peat_jax/`` (tools, bridges, models, benchmarks, scripts, the
  docs and the README) nothing imports a private module of the library;
* inside ``peat_jax/``, imports point one way along :data:`LAYERS`, across
  packages only through a package's facade, and never reach the model zoo,
  the tools, the bridges or torch.
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
Diagnosis ERROR_MODELS EveryCall EveryNSteps Fraction GOLDEN GoldenResult
InjectGradientsState InjectionRecord Monitor OpsResult PeatError
PlaybackResult ProfileResult REFERENCES RecordFileError ReportPaths
RuntimeResult Signature SignatureState Site SiteTable Substitution
TENSOR_ERROR_MODELS Tap TaskFactory TrainState TrainTask Verdict
abstract_state analyze analyze_batch bit_probabilities campaign check_kut
composite composite_call data_parallel_runtime detect detect_batch
discover_sites forward_campaign ForwardCampaign golden_train init_distributed inject inject_gradients
inject_tree injecting_kernel injection_params kernel_campaign nnx_task playback
playback_many playback_ops profile read_campaign read_log rebuild_report reference
reference_attention reference_conv reference_cross_entropy
reference_dot_general reference_gelu reference_layer_norm reference_matmul
reference_softmax register_kut replay resolve_kut restore_state runtime
saved_steps select_sites shard_kut sharded_playback signature_finalize
signature_init signature_pure signature_update substitute tap validate
verdict write_report
""".split())

#: The packages of peat_jax, lowest first: a package imports only packages
#: before it (and itself).
LAYERS = ("core", "sites", "kernels", "injectors", "analyzer", "detector",
          "report", "profiler", "testing")
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


_PRIVATE = re.compile(r"peat_jax(\.(core|sites|kernels|injectors|analyzer|"
                      r"detector|report|profiler|testing))?\._\w+")


_FROM_PRIVATE = re.compile(r"from peat_jax(\.(core|sites|kernels|injectors|"
                           r"analyzer|detector|report|profiler|testing))? import "
                           r"\(?\s*(_\w+)")


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
  docs = glob.glob(os.path.join(ROOT, "docs", "*.md")) + [
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
      "from peat_jax.analyzer import _api\n")
  (tmp_path / "docs").mkdir()
  (tmp_path / "README.md").write_text("see peat_jax._campaign\n"
                                      "from peat_jax.profiler import _golden\n")
  (tmp_path / "BUILD.md").write_text("\n")
  with pytest.raises(AssertionError, match="tools/x.py:1") as err:
    test_nothing_outside_peat_jax_imports_a_private_module()
  assert "README.md:1: peat_jax._campaign" in str(err.value)
  assert "README.md:2: from peat_jax.profiler import _golden" in str(err.value)
