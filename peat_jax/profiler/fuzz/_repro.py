"""A regression test for the kernel's repository: one record, no training.

:func:`export_repro` writes a folder with the real inputs of one record
(a fuzz variant, or a captured training step), the golden kernel's outputs
on them and their float64 reference, and a pytest file that runs the KUT
spec on the inputs and checks it with
:func:`peat_jax.testing.assert_matches_golden` (the Detector's own
noise-floor rule). The folder is self-contained: ``case.npz`` (arrays
``in0..``, ``golden0..``, ``reference``), ``case.json`` (the site, the
call's structure and parameters, the KUT spec, where the record came
from, its diagnosis) and ``test_repro.py``. :func:`load_repro` reads it
back (``peat.testing.load_repro``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from peat_jax.core import PeatError
from peat_jax.kernels import kut as _kut
from peat_jax.profiler import files as _files
from peat_jax.profiler import golden as _golden
from peat_jax.profiler import playback_fi as _playback_fi
from peat_jax.profiler import capture as io
from peat_jax.profiler.fuzz import _fuzz
from peat_jax.profiler.fuzz import _goldens
from peat_jax.profiler.fuzz import _variants as V

CASE_JSON = "case.json"
CASE_NPZ = "case.npz"
TEST_FILE = "test_repro.py"
FORMAT = 1
#: Environment variables the pytest file reads.
KUT_ENV = "PEAT_REPRO_KUT"
PATH_ENV = "PEAT_REPRO_PATH"


class Repro(NamedTuple):
  """An exported record, read back (:func:`load_repro`).

  Attributes:
    folder: the folder.
    meta: ``case.json``.
    call: the site call (arrays in place).
    golden: the golden kernel's outputs.
    reference: the float64 reference of the first output, or None.
    context: the Detector's context (kernel, reduction length).
  """

  folder: str
  meta: dict
  call: V.Call
  golden: list
  reference: np.ndarray | None
  context: dict

  @property
  def site_call(self) -> tuple:
    """``(kernel, args, kwargs)`` of the stored call: the Detector's slip
    search reads it (``peat.testing.assert_matches_golden(call=...)``)."""
    return self.meta["site"]["kernel"], tuple(self.call.args), dict(
        self.call.kwargs)

  def run(self, kut: str | None = None) -> np.ndarray:
    """The KUT's first output on the stored call.

    Args:
      kut: a KUT spec (default: ``$PEAT_REPRO_KUT`` or the exported one).

    Returns:
      The KUT's first output, a host array.
    """
    spec = kut or os.environ.get(KUT_ENV) or self.meta["kut"]
    for d in (os.environ.get(PATH_ENV) or "").split(os.pathsep):
      if d and d not in sys.path:
        sys.path.insert(0, d)
    if spec.startswith("torch:"):
      # torch specs are registered by the PyTorch bridge (imported here, on
      # demand: it imports torch).
      importlib.import_module("peat_jax.bridges")
    parsed = _kut.parse_kut(spec, kernel=self.meta["site"]["kernel"])
    site = io.site_of(self.meta["site"])
    out, _ = _fuzz.run_kut(parsed, site, self.call)
    return out[0]


def _structure(site, call: V.Call) -> dict:
  """The stored form of a call (arrays as slots, in leaf order)."""
  if not site.composite:
    return {"primitive": io.encode_value(dict(call.kwargs), site.name)}
  leaves, treedef = jax.tree.flatten((call.args, call.kwargs))
  k = iter(range(len(leaves)))
  slots = [io.ArraySlot(next(k)) if isinstance(x, (np.ndarray, jax.Array))
           else x for x in leaves]
  return {"composite": io.encode_value(jax.tree.unflatten(treedef, slots),
                                       site.name)}


def _call_of(site, stored: dict, arrays: Sequence[np.ndarray]) -> V.Call:
  if "primitive" in stored:
    return V.Call(tuple(arrays), io.decode_value(stored["primitive"]))
  structure = io.decode_value(stored["composite"])
  leaves, treedef = jax.tree.flatten(
      structure, is_leaf=lambda x: isinstance(x, io.ArraySlot))
  it = iter(arrays)
  filled = [next(it) if isinstance(x, io.ArraySlot) else x for x in leaves]
  args, kwargs = jax.tree.unflatten(treedef, filled)
  return V.Call(tuple(args), dict(kwargs))


def _find(path: str, site: str, step, variant, kut, seed) -> dict:
  recs = [r for r in _files.read_records(path)
          if r.get("kind") in ("site", "fuzz_error") and r.get("site") == site
          and (step is None or r.get("step") == step)
          and (variant is None or r.get("variant") == variant)
          and (kut is None or r.get("kut") == kut)
          and (seed is None or r.get("seed") == seed)]
  if not recs:
    have = sorted({(r.get("site"), r.get("variant"), r.get("step"))
                   for r in _files.read_records(path)
                   if r.get("kind") in ("site", "fuzz_error")})[:20]
    raise PeatError(f"no record of site {site!r} (step {step}, variant "
                    f"{variant!r}, KUT {kut!r}) in {path}; recorded: {have}")
  return recs[-1]


_TEST = '''"""Regression test exported by peat_jax (peat.export_repro).

What it checks: that the kernel under test,
    {kut}
called as site
    {site} ({kernel})
{where}, gives an output within the golden
kernel's noise floor: ``peat.testing.assert_matches_golden`` analyzes the
KUT's output against the golden kernel's (``case.npz``, computed by
{golden_from}) and their float64 reference, and fails unless the Detector
calls the difference rounding noise (``pass``); a failure names the slip
the Detector's search finds on the stored inputs. No training run.

When it was exported the KUT's record said: {model} ({verdict}): {evidence}

Run it on another implementation (your fix) with
``PEAT_REPRO_KUT=<spec> pytest <this folder>``; ``PEAT_REPRO_PATH`` adds
folders to ``sys.path`` (a ``py:`` KUT's module).
"""

import os

import peat_jax as peat

HERE = os.path.dirname(os.path.abspath(__file__))


def test_kut_matches_golden():
  case = peat.testing.load_repro(HERE)
  out = case.run()
  peat.testing.assert_matches_golden(out, case.golden[0], case.reference,
                                     context=case.context,
                                     call=case.site_call)
'''


def export_repro(campaign_dir: str | os.PathLike, *, site: str,
                 step: int | None = None, variant: str | None = None,
                 kut: str | None = None, seed: int | None = None,
                 task: _golden.TrainTask | None = None,
                 out_dir: str | os.PathLike | None = None,
                 smallest: bool = True) -> str:
  """Writes a regression test of one record: inputs, golden, pytest file.

  A fuzz variant the fuzz shrank (``peat.fuzz(..., shrink=True)``) is
  exported at its smallest failing input (``min:<variant>:<cuts>``), the
  original variant and its shapes recorded beside it in ``case.json``
  (``shrunk_from``, ``original_shapes``); ``smallest=False`` exports the
  variant as found.

  >>> d = peat.export_repro("runs/c1", site="fwd/Gpt/.../softmax:0",
  ...                       variant="len=64")        # doctest: +SKIP
  >>> # pytest d   (fails on the bug; PEAT_REPRO_KUT=<fix> pytest d passes)

  Args:
    campaign_dir: the campaign with the record (``fuzz.msgpack`` for a
      variant, else ``ops.msgpack`` or none) and, unless the record names
      its own (``captures``), the captures.
    site: the record's site.
    step: its capture step (default: the record's).
    variant: a fuzz variant's name; None for the captured training call.
    kut: the KUT spec (default: the record's).
    seed: the fuzz seed (default: the record's).
    task: the task the captures come from (needed when the record's golden
      kernel was the site's own function).
    out_dir: the folder (default ``<campaign>/repro/<site>_<variant>``).
    smallest: export the shrunk variant of ``variant`` when there is one.

  Returns:
    The folder's path.

  Raises:
    PeatError: no such record, no captures of it, a variant that does not
      rebuild, a missing task.
  """
  campaign = os.path.abspath(os.fspath(campaign_dir))
  rec = None
  if variant is not None:
    path = os.path.join(campaign, _files.FUZZ_FILE)
    rec = _find(path, site, step, variant, kut, seed)
    small = [r for r in _files.read_records(path) if smallest
             and r.get("shrunk_from") == variant and r.get("site") == site
             and r.get("kut") == rec.get("kut")
             and r.get("seed") == rec.get("seed")]
    if small:
      rec, variant = small[-1], small[-1]["variant"]
  else:
    path = os.path.join(campaign, _files.OPS_FILE)
    if os.path.exists(path) and kut is None:
      rec = _find(path, site, step, None, None, None)
  cdir = io.captures_dir_of((rec or {}).get("captures") or campaign)
  index = io.read_index(cdir)
  kut = kut or (rec or {}).get("kut")
  if kut is None:
    raise PeatError("export_repro needs the KUT spec: pass kut= (no record "
                    "of the site names one)")
  step = step if step is not None else (rec or {}).get("step")
  entries = [e for e in index["records"] if e["site"] == site
             and (step is None or e["step"] == step)]
  if not entries:
    raise PeatError(f"no captured record of site {site!r} at step {step} "
                    f"in {cdir}; expected one of "
                    f"{sorted({(e['site'], e['step']) for e in index['records']})[:20]}")
  entry = sorted(entries, key=lambda e: e["step"])[0]
  s = io.site_of(entry)
  params = io.decode_params(entry["params"])
  own = _goldens.site_goldens(task, [entry]) if task is not None else {}
  if (rec or {}).get("golden_from") == "site" and not own:
    raise PeatError(f"the record's golden kernel was site {site!r}'s own "
                    "function: pass task= (the task the captures come from)")
  golden = _goldens.Golden(s, params, own.get(site))
  arrays = io.load_record(cdir, entry)
  base = _fuzz.base_call(s, params, [arrays[f"in{i}"]
                                     for i in range(len(entry["in_shapes"]))])
  seed = seed if seed is not None else int((rec or {}).get("seed", 0))
  if variant is not None:
    target = _fuzz.Target(entry, s, base, golden,
                          _fuzz.plans_of(s, base, golden))
    call = _fuzz.build(target, variant, seed)
  else:
    call = base
  gold, frm = golden(call)
  ins = _fuzz._arrays(call) if s.composite else list(call.args)
  vsite = _fuzz.variant_site(s, call, gold)
  if s.composite:
    leaves, treedef = jax.tree.flatten((call.args, call.kwargs))
    is_array = tuple(isinstance(x, (np.ndarray, jax.Array)) for x in leaves)
    rec_params = {"template": (treedef, tuple(None if a else x for x, a in
                                              zip(leaves, is_array)),
                               is_array)}
  else:
    rec_params = dict(call.kwargs)
  ref = _playback_fi.site_reference(vsite, rec_params, ins)
  if isinstance(ref, (list, tuple)):
    ref = ref[0]
  name = _safe(f"{site}_" + (((rec or {}).get("shrunk_from", "") + "_min")
                             if (rec or {}).get("shrunk_from") else
                             (variant or f"step{entry['step']}")))
  folder = os.path.abspath(os.fspath(out_dir or os.path.join(
      campaign, _files.REPRO_DIR, name)))
  os.makedirs(folder, exist_ok=True)
  npz = {f"in{i}": np.asarray(x) for i, x in enumerate(ins)}
  npz.update({f"golden{i}": np.asarray(g) for i, g in enumerate(gold)})
  if ref is not None and np.shape(ref) == np.shape(gold[0]):
    npz["reference"] = np.asarray(ref, np.float64)
  np.savez(os.path.join(folder, CASE_NPZ), **{  # bf16 as its bits
      k: (v.view(np.uint16) if str(v.dtype) == "bfloat16" else v)
      for k, v in npz.items()})
  diag = (rec or {}).get("diagnosis") or {}
  meta = {"format": FORMAT, "kut": kut, "site": io.site_fields(vsite),
          "call": _structure(s, call), "variant": variant,
          "shrunk_from": (rec or {}).get("shrunk_from"),
          "original_shapes": (rec or {}).get("original_shapes"),
          "step": entry["step"], "seed": seed, "golden_from": frm,
          "dtypes": {k: str(np.asarray(v).dtype) for k, v in npz.items()},
          "context": {"kernel": s.kernel,
                      "reduction": _playback_fi.reduction_length(vsite,
                                                                 rec_params)},
          "record": {"model": diag.get("model"),
                     "verdict": diag.get("verdict"),
                     "evidence": diag.get("evidence"),
                     "error": (rec or {}).get("error")},
          "campaign": campaign}
  with open(os.path.join(folder, CASE_JSON), "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=1, default=str)
  text = _TEST.format(
      kut=kut, site=site, kernel=s.kernel,
      where=(f"on fuzz variant {variant} of step {entry['step']}'s inputs"
             + (f"\n    (the smallest input failing as "
                f"{rec['shrunk_from']} did, shapes "
                f"{rec.get('original_shapes')})"
                if (rec or {}).get("shrunk_from") else "")
             if variant else f"at training step {entry['step']}"),
      golden_from={"primitive": "the lax primitive",
                   "site": "the model's own function"}.get(
                       frm, "the kind's standard golden"),
      model=diag.get("model", "?"), verdict=diag.get("verdict", "?"),
      evidence=(diag.get("evidence") or (rec or {}).get("error")
                or "-").replace('"""', "'''")[:400])
  with open(os.path.join(folder, TEST_FILE), "w", encoding="utf-8") as f:
    f.write(text)
  return folder


def _safe(s: str) -> str:
  return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def load_repro(folder: str | os.PathLike) -> Repro:
  """Reads an exported record (:func:`export_repro`).

  Raises:
    PeatError: a folder without ``case.json`` / ``case.npz``, or of
      another format.
  """
  folder = os.path.abspath(os.fspath(folder))
  try:
    with open(os.path.join(folder, CASE_JSON), encoding="utf-8") as f:
      meta = json.load(f)
    data = np.load(os.path.join(folder, CASE_NPZ))
  except (OSError, ValueError) as e:
    raise PeatError(f"no readable repro in {folder} ({e}); expected "
                    f"{CASE_JSON} and {CASE_NPZ} written by "
                    "peat.export_repro") from e
  if meta.get("format") != FORMAT:
    raise PeatError(f"repro format {meta.get('format')!r} in {folder}; "
                    f"expected {FORMAT}. Fix: export it again")
  dtypes = meta["dtypes"]

  def arr(k):
    a = data[k]
    want = dtypes[k]
    return a.view(jax.numpy.dtype(want)) if str(a.dtype) != want else a
  n_in = sum(1 for k in dtypes if k.startswith("in"))
  n_g = sum(1 for k in dtypes if k.startswith("golden"))
  site = io.site_of(meta["site"])
  call = _call_of(site, meta["call"], [arr(f"in{i}") for i in range(n_in)])
  ref = arr("reference") if "reference" in dtypes else None
  return Repro(folder, meta, call, [arr(f"golden{i}") for i in range(n_g)],
               ref, dict(meta["context"]))
