"""Escape suite: kernel bugs that pass random-input tests, caught in training.

Usage::

  python benchmarks/escape_suite.py [--workdir=/tmp/peat_escape] \
      [--only=padded_tail,input_zeroing] [--quick] [--json=out.json]

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
  first of them (site, step).

Prints a Markdown table (the one in README.md) and writes it with every
detail as JSON (``<workdir>/escape_suite.json``). ``--quick`` runs two CNN
defects (input_zeroing, batch_variant_split): the shape of the table in
about a minute. Exit status 1 when a control does not pass
``peat.validate`` or a defect passes it (a random-input protocol that
rejects a correct kernel is that protocol's false alarm: the summary says
which).
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
sys.path.insert(0, os.path.join(HERE, "escape"))

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

QUICK = ("input_zeroing", "batch_variant_split")
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


def run_peat(case, spec, golden: str, workdir: str) -> dict:
  """``peat.validate`` on the case's scenario; the row's peat columns."""
  _, _, steps, every = cases_lib.SCENARIOS[case.scenario]
  camp = os.path.join(workdir, "campaigns", case.name)
  if not os.path.exists(os.path.join(camp, peat.profiler.GOLDEN_DIR)):
    shutil.copytree(golden, os.path.join(camp, peat.profiler.GOLDEN_DIR))
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


def run_case(case, lib: str, goldens: dict, workdir: str) -> dict:
  spec = _spec(case, lib)
  kut = peat.resolve_kut(spec)[0].kut
  row = {"name": case.name, "kind": case.kind, "home": case.home,
         "precedent": case.precedent, "problem": case.problem.name,
         "spec": spec.spec.replace(lib, "libescape_kernels.so"),
         "expected": case.expected}
  for name, check in protocols.PROTOCOLS.items():
    out = check(case.problem, kut)
    row[name] = {"passed": out.passed, "detail": out.detail}
  row["peat"] = run_peat(case, spec, goldens[case.scenario], workdir)
  return row


def _mark(passed: bool) -> str:
  return "pass" if passed else "**fail**"


def table(rows) -> str:
  """The Markdown table of the README."""
  head = ("| case | bug in | KernelBench (rand, 1e-4, fwd) | assert_close "
          "(randn, fwd) | robust-kbench (randn, 1e-5, fwd+bwd) | peat "
          "verdict | family (expected) | first site, step |")
  lines = [head, "| " + " | ".join(["---"] * 8) + " |"]
  for r in rows:
    p = r["peat"]
    fam = p["family"] if r["kind"] == "defect" else "-"
    want = r["expected"] if r["kind"] == "defect" else "pass"
    ok = (fam == want) if r["kind"] == "defect" else (p["verdict"] == "pass")
    right = "" if ok else " (!)"
    where = (f"`{p['site']}`, {p['step']}" if p["step"] is not None
             else "-")
    lines.append(
        f"| {r['name']} ({r['kind']}) | {r['home']} | "
        f"{_mark(r['KernelBench']['passed'])} | "
        f"{_mark(r['assert_close']['passed'])} | "
        f"{_mark(r['robust-kbench']['passed'])} | "
        f"**{p['verdict']}** | {fam} ({want}){right} | {where} |")
  return "\n".join(lines)


def summary(rows) -> tuple[str, bool]:
  """Which defects each protocol misses and which correct kernels it
  rejects; whether peat_jax's goals hold (every defect flagged, every
  control passing peat_jax)."""
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
  flagged = [r for r in defects if r["peat"]["verdict"] != "pass"]
  named = [r for r in defects if r["peat"]["family"] == r["expected"]]
  peat_bad = [r["name"] for r in controls if r["peat"]["verdict"] != "pass"]
  bad_controls = [r["name"] for r in controls if r["peat"]["verdict"] != "pass"
                  or not all(r[p]["passed"] for p in protocols.PROTOCOLS)]
  out.append(f"peat flags {len(flagged)} of {len(defects)} defects, names "
             f"the expected family for {len(named)}; passes "
             f"{len(controls) - len(peat_bad)} of {len(controls)} controls"
             + (f" (not: {', '.join(peat_bad)})" if peat_bad else "")
             + f"; controls passing everywhere: "
             f"{len(controls) - len(bad_controls)} of {len(controls)}"
             + (f" (not: {', '.join(bad_controls)})" if bad_controls else ""))
  ok = len(flagged) == len(defects) and not peat_bad
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
    p = row["peat"]
    print(f"{case.name}: KernelBench {row['KernelBench']['passed']}, "
          f"assert_close {row['assert_close']['passed']}, robust-kbench "
          f"{row['robust-kbench']['passed']}; peat {p['verdict']} "
          f"{p['family']} at {p['site']} step {p['step']} "
          f"({p['seconds']} s)", flush=True)
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
