"""Escape suite: kernel bugs that pass random-input tests, caught in training.

Usage::

  python benchmarks/escape_suite.py [--workdir=/tmp/peat_escape] \
      [--only=padded_tail,input_zeroing] [--quick] [--json=out.json] \
      [--fuzz | --nofuzz] [--fuzz_budget=150s]

For each defect (``benchmarks/escape/cases.py``: a documented real-world
failure mode, as a C++ kernel of ``benchmarks/escape/escape_kernels.cc``
or a JAX port of ``benchmarks/escape/escape_jax.py``) and each control
(correct kernels: native variants of peat_jax, the escape attention
without its bugs, torch's scaled_dot_product_attention through the
bridge), side by side in one run:

* the field's random-input checks on the kernel's unit test
  (``benchmarks/escape/protocols.py``): KernelBench's (``torch.rand``
  inputs, 5 trials, forward only, allclose at 1e-4), a unit test with
  ``torch.testing.assert_close``'s defaults on ``torch.randn``, and
  robust-kbench's (1e-5, forward and backward, three input settings);
* ``peat.validate`` on the training scenario where the kernel lives
  (``invariance=True``; ``backward="kut"`` for backward defects): the
  verdict, the error-model family of the records that decided it, and the
  first of them (site, step);
* with ``--fuzz`` (the default for the shape-gated defects of
  ``benchmarks/escape/escape_shapes.py`` and for the controls;
  ``--fuzz`` runs it on every row, ``--nofuzz`` on none): ``peat.profile``
  captures the inputs of the case's site kernel at step 0, ``peat.fuzz``
  runs the kernel on the variants of the first such site within
  ``--fuzz_budget`` (every axis on the lattice, masks, magnitudes,
  interleaved so the budget covers every family first): the fuzz verdict,
  the family of the records that decided it and the variant that exposed
  it (the first of them), which the fuzz shrinks to the smallest input
  failing the same way; for a defect, ``peat.export_repro`` writes that
  smallest input's regression test and pytest
  runs it twice in a subprocess, on the defect (as exported) and on its
  ``fixed`` twin (``PEAT_REPRO_KUT``, ``PEAT_REPRO_PATH=benchmarks/escape``):
  ``fails / passes`` is the expected outcome.

Prints a Markdown table (the one in docs/escape.md) and writes it with every
detail as JSON (``<workdir>/escape_suite.json``). ``--quick`` runs two CNN
defects (input_zeroing, batch_variant_split) and one shape-gated defect
(attention_gqa_modulo, with its fuzz and repro): the shape of the table in
a few minutes. Exit status 1 when a defect is caught by neither
``peat.validate`` nor the fuzz, a control does not pass either, or a
shape-gated defect's repro does not fail before its fix and pass after it
(a random-input protocol that rejects a correct kernel is that protocol's
false alarm: the summary says which).
"""

import json
import os
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging

HERE = os.path.dirname(os.path.abspath(__file__))
ESCAPE = os.path.join(HERE, "escape")
#: docs/examples: the Pallas controls' ``py:pallas_kernels`` module.
EXAMPLES = os.path.join(os.path.dirname(HERE), "docs", "examples")
sys.path.insert(0, ESCAPE)
sys.path.insert(1, EXAMPLES)

import jax  # pylint: disable=wrong-import-position

import peat_jax as peat  # pylint: disable=wrong-import-position
from peat_jax import models  # pylint: disable=wrong-import-position
import cases as cases_lib  # pylint: disable=wrong-import-position
import protocols  # pylint: disable=wrong-import-position

_WORKDIR = flags.DEFINE_string("workdir", "/tmp/peat_escape",
                               "Golden runs, campaigns and the library.")
_ONLY = flags.DEFINE_list("only", [], "Run only these cases (names).")
_QUICK = flags.DEFINE_bool("quick", False,
                           "Two CNN defects only: the table's shape.")
_JSON = flags.DEFINE_string("json", None, "Where the JSON goes (default: "
                            "<workdir>/escape_suite.json).")
_FUZZ = flags.DEFINE_bool(
    "fuzz", None, "Fuzz every row (--fuzz) or none (--nofuzz); default: the "
    "shape-gated defects and the controls.")
_FUZZ_BUDGET = flags.DEFINE_string(
    "fuzz_budget", "150s", "The fuzz budget of a case: N variants, or Ns "
    "seconds (no variant starts after them), or 0 for every variant of the "
    "site (hours: every axis on the lattice).")


def fuzz_budget(text: str) -> dict:
  """``peat.fuzz``'s budget arguments of ``--fuzz_budget``."""
  t = text.strip()
  try:
    n = float(t[:-1]) if t.endswith("s") else int(t)
  except ValueError:
    raise SystemExit(f"error: --fuzz_budget={text!r}; expected N (variants), "
                     "Ns (seconds) or 0 (all)") from None
  if n < 0:
    raise SystemExit(f"error: --fuzz_budget={text!r} is negative")
  if not n:
    return {}
  return ({"budget_seconds": n} if t.endswith("s")
          else {"budget_cases": int(n)})

QUICK = ("input_zeroing", "batch_variant_split", "attention_gqa_modulo")
#: The capture budget of ``peat.profile`` (one step's inputs of a kernel).
CAPTURE_BYTES = 256 << 20
#: The expected repro outcomes: fails on the defect, passes on its fix.
REPRO_OK = ("fails", "passes")
SOURCE = os.path.join(HERE, "escape", "escape_kernels.cc")


def build_library(workdir: str) -> str:
  """Compiles escape_kernels.cc (once per source version) into workdir."""
  stamp = str(int(os.path.getmtime(SOURCE)))
  out = os.path.join(workdir, f"libescape_kernels_{stamp}.so")
  if not os.path.exists(out):
    gxx = shutil.which("g++")
    if gxx is None:
      raise SystemExit("error: g++ not found; the escape suite compiles "
                       "benchmarks/escape/escape_kernels.cc. Install g++.")
    subprocess.run([gxx, "-std=c++17", "-O2", "-fPIC", "-shared",
                    f"-isystem{jax.ffi.include_dir()}", SOURCE, "-o",
                    out + ".tmp"], check=True)
    os.replace(out + ".tmp", out)
  return out


def _spec(case, lib: str):
  text = case.spec.format(lib=lib)
  return (peat.kernels.parse_kut(text, kernel=case.kernel) if case.kernel
          else peat.kernels.parse_kut(text))


def _task(scenario: str):
  name, overrides, _, _ = cases_lib.SCENARIOS[scenario]
  return models.get_task(name, **overrides)


def golden_runs(needed, workdir: str) -> dict:
  """One golden run per scenario, copied into each campaign after."""
  out = {}
  for scen in needed:
    _, _, steps, every = cases_lib.SCENARIOS[scen]
    d = os.path.join(workdir, "golden", scen)
    peat.golden_train(_task(scen), d, steps=steps, checkpoint_every=every,
                      resume=True, evaluate=False)
    out[scen] = d
  return out


def _first(records, verdict: str):
  deciding = [r for r in records if r.verdict == verdict]
  if not deciding:
    return None, None
  fams = [peat.detector.family(r.model) for r in deciding]
  family = max(dict.fromkeys(fams), key=fams.count)
  return family, deciding[0]


def _campaign(case, golden: str, workdir: str) -> str:
  """The case's campaign directory, its golden run copied in."""
  camp = os.path.join(workdir, "campaigns", case.name)
  if not os.path.exists(os.path.join(camp, peat.profiler.GOLDEN_DIR)):
    shutil.copytree(golden, os.path.join(camp, peat.profiler.GOLDEN_DIR))
  return camp


def run_peat(case, spec, golden: str, workdir: str) -> dict:
  """``peat.validate`` on the case's scenario; the row's peat columns."""
  _, _, steps, every = cases_lib.SCENARIOS[case.scenario]
  camp = _campaign(case, golden, workdir)
  t0 = time.time()
  peat.validate(_task(case.scenario), spec, camp, steps=steps,
                checkpoint_every=every, frequencies=("every",),
                select=case.select, backward=case.backward,
                invariance=True, progress=None)
  res = peat.read_campaign(camp)
  verdict = res.verdict.verdict
  family, first = _first(res.playback, verdict)
  return {"verdict": verdict, "family": family if first else "-",
          "site": first.site if first else "-",
          "step": first.step if first else None,
          "evidence": first.evidence if first else res.verdict.summary,
          "records": len(res.playback), "seconds": round(time.time() - t0, 1)}


def _fuzz_decided(res) -> dict:
  """The fuzz verdict's family and exposing variant.

  The records that decided the verdict (the Detector's order: most
  confident first; a KUT that raised is family ``error``), their most
  common family (ties: the first's), the first of them, and the first
  failing one in the order the variants ran.
  """
  v = res.verdict
  if v is None:
    return {"verdict": "-", "family": "-", "variant": None,
            "first_in_order": None, "evidence": res.summary, "failing": []}
  recs = {(r["site"], r["variant"]): r for r in res.records}
  errs = {(e["site"], e["variant"]): e for e in res.errors}
  failing = []
  for key in v.deciding if v.verdict != "pass" else ():
    if key in errs:
      failing.append({"variant": key[1], "family": "error",
                      "model": "error", "evidence": errs[key]["error"]})
    elif key in recs:
      d = recs[key]["diagnosis"]
      failing.append({"variant": key[1],
                      "family": peat.detector.family(d["model"]),
                      "model": d["model"], "evidence": d["evidence"]})
  if not failing:
    return {"verdict": v.verdict, "family": "-", "variant": None,
            "first_in_order": None, "evidence": res.summary, "failing": []}
  fams = [f["family"] for f in failing]
  names = {f["variant"] for f in failing}
  ran = [r["variant"] for r in res.records] + [e["variant"]
                                                for e in res.errors]
  return {"verdict": v.verdict,
          "family": max(dict.fromkeys(fams), key=fams.count),
          "variant": failing[0]["variant"],
          "first_in_order": next((n for n in ran if n in names), None),
          "evidence": failing[0]["evidence"], "failing": failing}


def run_fuzz(case, spec, golden: str, workdir: str, budget: dict) -> dict:
  """``peat.profile`` (step 0's inputs of the case's site kernel) and
  ``peat.fuzz`` on every variant of its first site; the row's fuzz
  columns."""
  _, _, steps, every = cases_lib.SCENARIOS[case.scenario]
  camp = _campaign(case, golden, workdir)
  task = _task(case.scenario)
  t0 = time.time()
  prof = peat.profile(task, camp, steps=steps, checkpoint_every=every,
                      capture_sites=case.select,
                      capture_kernel=spec.site_kernel, capture_phase="fwd",
                      capture_steps=[0], budget_bytes=CAPTURE_BYTES)
  if not prof.captured:
    raise RuntimeError(f"{case.name}: no {spec.site_kernel} site captured "
                       f"under {CAPTURE_BYTES} bytes: {prof.skipped[:3]}")
  site = min(prof.captured, key=lambda e: tuple(e["address"]))["site"]
  t1 = time.time()
  res = peat.fuzz(camp, spec, task=task, select=[site], seed=0, **budget)
  out = {"site": site, "sites_captured": len({e["site"]
                                              for e in prof.captured}),
         "summary": res.summary, "planned": res.planned,
         "records": len(res.records), "errors": len(res.errors),
         "skipped": res.skipped, "shrunk": res.shrunk,
         "families": sorted({r["family"] for r in res.records}),
         "profile_seconds": round(t1 - t0, 1),
         "seconds": round(time.time() - t1, 1)}
  out.update(_fuzz_decided(res))
  return out


def _pytest(folder: str, kut: str | None) -> dict:
  """pytest on a repro folder in a subprocess (``kut``: PEAT_REPRO_KUT)."""
  env = dict(os.environ, PEAT_REPRO_PATH=os.pathsep.join((ESCAPE, EXAMPLES)))
  env.pop("PEAT_REPRO_KUT", None)
  if kut is not None:
    env["PEAT_REPRO_KUT"] = kut
  t0 = time.time()
  argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
          folder, folder]
  out = subprocess.run([sys.executable] + argv, cwd=folder, env=env,
                       capture_output=True, text=True, timeout=900,
                       check=False)
  text = out.stdout + out.stderr
  shown = " ".join(f"{k}={env[k]}" for k in ("PEAT_REPRO_PATH",
                                              "PEAT_REPRO_KUT") if k in env)
  header = f"$ {shown} python {' '.join(argv)}\n"
  if out.returncode == 0:
    outcome = "passes"
  elif out.returncode == 1 and "GoldenMismatchError" in text:
    outcome = "fails"
  else:  # an error that is not the golden check's: import, collection
    outcome = f"error (rc {out.returncode})"
  lines = [l for l in text.splitlines() if l.strip()]
  return {"outcome": outcome, "rc": out.returncode,
          "kut": kut or "(as exported)", "last_line": lines[-1] if lines
          else "", "output": header + text,
          "seconds": round(time.time() - t0, 1)}


def run_repro(case, fuzz: dict, lib: str, golden: str, workdir: str
              ) -> dict:
  """The exposing variant's regression test, before and after the fix;
  the pytest outputs are kept beside it (pytest_bug.txt, pytest_fix.txt)."""
  camp = _campaign(case, golden, workdir)
  folder = peat.export_repro(camp, site=fuzz["site"],
                             variant=fuzz["variant"],
                             task=_task(case.scenario))
  meta = peat.testing.load_repro(folder).meta
  out = {"folder": folder, "variant": meta["variant"],
         "found_as": meta.get("shrunk_from") or meta["variant"],
         "shapes": meta["site"]["in_shapes"],
         "original_shapes": meta.get("original_shapes")}
  for key, kut in (("bug", None), ("fix", case.fixed.format(lib=lib))):
    res = _pytest(folder, kut)
    with open(os.path.join(folder, f"pytest_{key}.txt"), "w",
              encoding="utf-8") as f:
      f.write(res.pop("output"))
    out[key] = res
  return out


def _fuzzes(case) -> bool:
  """Whether the case runs the fuzz (``--fuzz``/``--nofuzz``, else the
  shape-gated defects and the controls)."""
  if _FUZZ.value is not None:
    return _FUZZ.value
  return case.fixed is not None or case.kind == "control"


def run_case(case, lib: str, goldens: dict, workdir: str) -> dict:
  t0 = time.time()
  spec = _spec(case, lib)
  kut = peat.resolve_kut(spec)[0].kut
  row = {"name": case.name, "kind": case.kind, "home": case.home,
         "precedent": case.precedent, "problem": case.problem.name,
         "spec": spec.spec.replace(lib, "libescape_kernels.so"),
         "expected": case.expected, "fixed": case.fixed,
         "shape_gated": case.fixed is not None}
  for name, check in protocols.PROTOCOLS.items():
    out = check(case.problem, kut)
    row[name] = {"passed": out.passed, "detail": out.detail}
  row["peat"] = run_peat(case, spec, goldens[case.scenario], workdir)
  row["fuzz"] = row["repro"] = None
  if _fuzzes(case):
    row["fuzz"] = run_fuzz(case, spec, goldens[case.scenario], workdir,
                           fuzz_budget(_FUZZ_BUDGET.value))
    if (case.kind == "defect" and case.fixed is not None
        and row["fuzz"]["variant"] is not None):
      row["repro"] = run_repro(case, row["fuzz"], lib,
                               goldens[case.scenario], workdir)
  row["seconds"] = round(time.time() - t0, 1)
  return row


def _mark(passed: bool) -> str:
  return "pass" if passed else "**fail**"


def _fuzz_cells(r) -> tuple[str, str, str, str]:
  """The fuzz verdict, family (expected), exposing variant and repro
  cells of a row ("-" where the fuzz did not run)."""
  f = r.get("fuzz")
  if f is None:
    return "-", "-", "-", "-"
  want = ("pass" if r["kind"] != "defect" else
          r["expected"] if r.get("shape_gated") else "-")
  if r["kind"] == "defect":
    fam = f["family"]
    ok = fam == want if r.get("shape_gated") else f["verdict"] != "pass"
  else:
    fam = f["family"] if f["verdict"] != "pass" else "-"
    ok = f["verdict"] == "pass"
  variant = f"`{f['variant']}`" if f["variant"] else "-"
  rep = r.get("repro")
  repro = (f"{rep['bug']['outcome']} / {rep['fix']['outcome']}"
           + ("" if _repro_ok(r) else " (!)")) if rep else "-"
  if rep and rep.get("original_shapes"):  # exported at its smallest
    repro += (f" at `{_shape(rep['shapes'])}` (found at "
              f"`{_shape(rep['original_shapes'])}`)")
  return (f"**{f['verdict']}**", f"{fam} ({want})" + ("" if ok else " (!)"),
          variant, repro)


def _shape(shapes) -> str:
  """The first input's shape of a repro (``[1, 1, 1, 192]``)."""
  return str(list(shapes[0])) if shapes else "-"


def _training_family(r) -> str:
  """The training family cell: a defect's family against its expected
  one (a shape-gated defect's training playback is expected to pass)."""
  p = r["peat"]
  if r["kind"] != "defect":
    return "- (pass)" + ("" if p["verdict"] == "pass" else " (!)")
  if r.get("shape_gated"):
    return (f"{p['family']} (pass) (!)" if p["verdict"] != "pass"
            else "- (pass)")
  return f"{p['family']} ({r['expected']})" + (
      "" if p["family"] == r["expected"] else " (!)")


HEAD = ("| case | bug in | KernelBench (rand, 1e-4, fwd) | assert_close "
        "(randn, fwd) | robust-kbench (randn, 1e-5, fwd+bwd) | training "
        "verdict | family (expected) | first site, step | fuzz verdict | "
        "fuzz family (expected) | exposing variant | repro: bug / fix |")
COLUMNS = HEAD.count(" | ") + 1


def table(rows) -> str:
  """The Markdown table of docs/escape.md."""
  lines = [HEAD, "| " + " | ".join(["---"] * COLUMNS) + " |"]
  for r in rows:
    p = r["peat"]
    where = (f"`{p['site']}`, {p['step']}" if p["step"] is not None
             else "-")
    lines.append(
        f"| {r['name']} ({r['kind']}) | {r['home']} | "
        f"{_mark(r['KernelBench']['passed'])} | "
        f"{_mark(r['assert_close']['passed'])} | "
        f"{_mark(r['robust-kbench']['passed'])} | "
        f"**{p['verdict']}** | {_training_family(r)} | {where} | "
        + " | ".join(_fuzz_cells(r)) + " |")
  return "\n".join(lines)


def _caught(r) -> bool:
  """A defect flagged by training playback or by the fuzz."""
  f = r.get("fuzz")
  return r["peat"]["verdict"] != "pass" or (
      f is not None and f["verdict"] not in ("pass", "-"))


def _control_ok(r) -> bool:
  f = r.get("fuzz")
  return r["peat"]["verdict"] == "pass" and (f is None
                                             or f["verdict"] == "pass")


def _repro_ok(r) -> bool:
  rep = r.get("repro")
  return rep is not None and (rep["bug"]["outcome"],
                              rep["fix"]["outcome"]) == REPRO_OK


def summary(rows) -> tuple[str, bool]:
  """Which defects each protocol misses and which correct kernels it
  rejects; whether peat_jax's goals hold (every defect caught by training
  playback or the fuzz, every control passing both, every shape-gated
  defect's repro failing before its fix and passing after)."""
  defects = [r for r in rows if r["kind"] == "defect"]
  controls = [r for r in rows if r["kind"] == "control"]
  out = []
  for name in protocols.PROTOCOLS:
    missed = [r["name"] for r in defects if r[name]["passed"]]
    rejected = [r["name"] for r in controls if not r[name]["passed"]]
    out.append(f"{name} misses {len(missed)} of {len(defects)}: "
               f"{', '.join(missed) or 'none'}; rejects "
               f"{len(rejected)} of {len(controls)} controls"
               + (f" ({', '.join(rejected)})" if rejected else ""))
  old = [r for r in defects if not r.get("shape_gated")]
  flagged = [r for r in old if r["peat"]["verdict"] != "pass"]
  named = [r for r in old if r["peat"]["family"] == r["expected"]]
  peat_bad = [r["name"] for r in controls if r["peat"]["verdict"] != "pass"]
  bad_controls = [r["name"] for r in controls if not _control_ok(r)
                  or not all(r[p]["passed"] for p in protocols.PROTOCOLS)]
  if old or controls:
    out.append(f"peat flags {len(flagged)} of {len(old)} defects in training, "
               f"names the expected family for {len(named)}; passes "
               f"{len(controls) - len(peat_bad)} of {len(controls)} controls"
               + (f" (not: {', '.join(peat_bad)})" if peat_bad else "")
               + f"; controls passing everywhere: "
               f"{len(controls) - len(bad_controls)} of {len(controls)}"
               + (f" (not: {', '.join(bad_controls)})" if bad_controls else ""))
  shaped = [r for r in defects if r.get("shape_gated")]
  fuzzed = [r for r in controls if r.get("fuzz") is not None]
  if shaped:
    quiet = [r for r in shaped if r["peat"]["verdict"] == "pass"]
    caught = [r for r in shaped if r.get("fuzz") is not None
              and r["fuzz"]["verdict"] not in ("pass", "-")]
    fnamed = [r for r in caught if r["fuzz"]["family"] == r["expected"]]
    repro = [r for r in shaped if _repro_ok(r)]
    out.append(
        f"shape-gated defects: training-shape playback passes "
        f"{len(quiet)} of {len(shaped)}"
        + (f" (flags: {', '.join(r['name'] for r in shaped if r not in quiet)})"
           if len(quiet) < len(shaped) else "")
        + f"; the fuzz catches {len(caught)} of {len(shaped)} and names "
        f"the expected family for {len(fnamed)}"
        + (f" (not: {', '.join(r['name'] for r in shaped if r not in fnamed)})"
           if len(fnamed) < len(shaped) else "")
        + f"; their repros fail before the fix and pass after it for "
        f"{len(repro)} of {len(shaped)}"
        + (f" (not: {', '.join(r['name'] for r in shaped if r not in repro)})"
           if len(repro) < len(shaped) else ""))
  if fuzzed:
    clean = [r for r in fuzzed if r["fuzz"]["verdict"] == "pass"]
    out.append(
        f"controls passing every fuzz variant: {len(clean)} of "
        f"{len(fuzzed)}" + (
            f" (not: {', '.join(r['name'] for r in fuzzed if r not in clean)})"
            if len(clean) < len(fuzzed) else "")
        + f" ({sum(r['fuzz']['records'] for r in fuzzed)} variants)")
  missed = [r["name"] for r in defects if not _caught(r)]
  if missed:
    out.append(f"caught neither in training nor by the fuzz: "
               f"{', '.join(missed)}")
  ok = (not missed and all(_control_ok(r) for r in controls)
        and all(_repro_ok(r) for r in shaped if r.get("fuzz") is not None))
  return "\n".join(out), ok


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = os.path.abspath(_WORKDIR.value)
  os.makedirs(workdir, exist_ok=True)
  names = list(QUICK) if _QUICK.value else list(_ONLY.value)
  known = {c.name: c for c in cases_lib.CASES}
  unknown = [n for n in names if n not in known]
  if unknown:
    print(f"error: unknown cases {unknown}; pass --only=<names> from "
          f"{sorted(known)}", file=sys.stderr)
    return 2
  chosen = [known[n] for n in names] if names else list(cases_lib.CASES)
  if any(c.spec.startswith("torch:") for c in chosen):
    import peat_jax.bridges  # pylint: disable=import-outside-toplevel,unused-import
  t0 = time.time()
  lib = build_library(workdir)
  goldens = golden_runs(sorted({c.scenario for c in chosen}), workdir)
  rows = []
  for case in chosen:
    row = run_case(case, lib, goldens, workdir)
    rows.append(row)
    p, f, rep = row["peat"], row["fuzz"], row["repro"]
    print(f"{case.name}: KernelBench {row['KernelBench']['passed']}, "
          f"assert_close {row['assert_close']['passed']}, robust-kbench "
          f"{row['robust-kbench']['passed']}; peat {p['verdict']} "
          f"{p['family']} at {p['site']} step {p['step']} "
          f"({p['seconds']} s)"
          + (f"; fuzz {f['verdict']} {f['family']} at {f['variant']} "
             f"({f['records']} variants of {f['site']}, {f['seconds']} s)"
             if f else "")
          + (f"; repro {rep['bug']['outcome']} / {rep['fix']['outcome']}"
             if rep else ""), flush=True)
  text, ok = summary(rows)
  print()
  print(table(rows))
  print()
  print(text)
  path = _JSON.value or os.path.join(workdir, "escape_suite.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"rows": rows, "summary": text,
               "seconds": round(time.time() - t0, 1)}, f, indent=1)
  print(f"{len(rows)} cases in {time.time() - t0:.0f} s; details: {path}")
  return 0 if ok else 1


if __name__ == "__main__":
  app.run(main)
