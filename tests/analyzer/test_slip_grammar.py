"""The slip grammar is its own test (issue 66).

Cases are drawn at random (``peat.injectors.draw_slip_cases``: a site
kind, a shape, float32 or bfloat16, fresh seeded values, realistic
magnitudes and never zeros, and a slip of the grammar, or none: a
control). For each, ``t`` is the KUT's output (``slipped_call``, the
injector written apart from the Detector's slip search), ``g`` golden's
(``golden_call``) and the Detector diagnoses the call
(``peat.detector.diagnose_call``, which reruns the golden computation in
float64 under the grammar's slips and computes the float64 reference
``r`` itself).

What each case requires:

* a control (a correct port: the same math summed another way) passes;
* a *visible* slip is named: the diagnosis's primary model is the
  slip's error model (``slip.model``: ``indexing``, ``parameter``,
  ``scale``, ``approximation``, ``precision:<fmt>`` or
  ``accumulation:<fmt>``, the format included; another format is
  accepted where a precision slip in it explains the slip's own float64
  output as the probe reads it: tf32 and fp16 inputs round alike inside
  fp16's range). Visible
  (``peat.injectors.slip_visibility``): the slip's own output in float64,
  rounded to the output dtype, is at least ``VISIBLE_RMS`` = 16 times the
  golden kernel's RMS error from ``r`` (the Detector probes beyond 4x,
  ``BEYOND_GOLDEN``, and a KUT making the slip is itself about one golden
  noise from the slip's float64 output, which the explaining ratio must
  keep under ``EXPLAINS`` = 1/4 of the effect: 4 x 4), and its median
  effect over the elements the probe reads is at least ``VISIBLE_MEDIAN``
  = 4 times that error. A slip below these margins cannot be required.
* where the diagnosis carries them (the slip search stores them; the
  test asserts on them only when present): a visible ``constant`` slip's
  fitted value ``params["estimate"]`` (where the slip named, if any, is
  that constant) lies within ``ESTIMATE_SHARE`` of the slip's distance
  from the golden value, and the winning slip's name
  ``params["slip"]`` is a name of the grammar
  (``peat.injectors.slip_from_name``) whose model is the diagnosis's.
  A diagnosis that names another model is accepted where the slip it
  names (or, for a precision slip, the same op in the named format)
  gives the drawn slip's output: their float64 outputs differ by less
  than VISIBLE_RMS times golden's RMS error, so no search can tell them
  apart (tf32 and fp16 inputs inside fp16's range); the table counts
  these apart.

Invisible slips require nothing (they are counted). In CI a small seeded
draw runs (``CI_CASES`` cases over ``CI_CALLS`` call shapes, each shape
paying the Detector's compilations once); a larger one is slow. The
acceptance table (category x dtype) is printed by
``test_acceptance_table_*`` (``pytest -s``) and by
benchmarks/slip_grammar.py.
"""

from __future__ import annotations

import collections
import functools
import math
import time
import traceback
from typing import Any, NamedTuple

import numpy as np
import pytest

import peat_jax as peat
from peat_jax import injectors
from peat_jax.analyzer.probes import _ports

#: A constant's fitted value is accepted within this share of the slip's
#: distance from the golden value: the slip is visible at >= 16x the
#: golden noise, so a fit reading many elements lands far closer; a
#: quarter (EXPLAINS) leaves the fit the margin the explaining ratio has.
ESTIMATE_SHARE = 0.25

CI_SEED, CI_CASES, CI_CALLS = 66, 6, 3
SLOW_SEED, SLOW_CASES, SLOW_CALLS = 6601, 66, 22


def test_mirrored_margins_are_the_detectors():
  """The visibility margins restate the port probe's constants (the
  injectors stand below the Analyzer): they must agree."""
  assert injectors._slips.BEYOND_GOLDEN == _ports.BEYOND_GOLDEN
  assert injectors._slips.EXPLAINS == _ports.EXPLAINS
  assert injectors._slips.PROBE_MIN == _ports.PROBE_MIN
  assert injectors._slips.VISIBLE_RMS == _ports.BEYOND_GOLDEN / _ports.EXPLAINS
  assert injectors._slips.VISIBLE_MEDIAN == 1.0 / _ports.EXPLAINS


class Outcome(NamedTuple):
  case: Any  # peat.injectors.SlipCase
  visibility: Any  # peat.injectors.Visibility, None for a control
  diagnosis: Any  # peat.detector.Diagnosis, None when it raised
  error: str  # the traceback when the diagnosis raised
  seconds: float


def _run(case) -> Outcome:
  t = injectors.slipped_call(case.kind, case.slip, case.args, case.kwargs)
  g = injectors.golden_call(case.kind, case.args, case.kwargs)
  vis = None if case.slip is None else injectors.slip_visibility(
      case.kind, case.slip, case.args, case.kwargs, golden=g)
  t0 = time.perf_counter()
  try:
    diag = peat.detector.diagnose_call(case.kind, case.args, case.kwargs,
                                       t, g)
    err = ""
  except Exception:  # a diagnosis that raises fails its case, not the draw
    diag, err = None, traceback.format_exc(limit=6)
  return Outcome(case, vis, diag, err, time.perf_counter() - t0)


@functools.lru_cache(maxsize=2)
def _outcomes(seed: int, n: int, calls: int) -> tuple[Outcome, ...]:
  cases = injectors.draw_slip_cases(seed, n, calls=calls)
  out = tuple(_run(c) for c in cases)
  peat.core.release_compiled()
  return out


def named(o: Outcome) -> str:
  """How the diagnosis names the slip (``peat.injectors.names_slip``):
  ``model`` (the slip's own), ``equivalent`` (a slip of the named model,
  the one the search names where it says, gives the slip's output within
  the visibility margin: no search tells them apart on these inputs),
  or ``""``."""
  c, d = o.case, o.diagnosis
  if d is None:
    return ""
  params = dict(d.params or {})
  return injectors.names_slip(c.kind, c.slip, c.args, c.kwargs, d.model,
                              named=params.get("slip"),
                              estimate=params.get("estimate"))


def _describe(o: Outcome) -> str:
  c, d, v = o.case, o.diagnosis, o.visibility
  slip = "control" if c.slip is None else f"{c.slip.name} {c.slip!r}"
  vis = "" if v is None else (
      f" visibility: rms {v.rms_ratio:.3g}x, median {v.median_ratio:.3g}x "
      f"of golden over {v.read} elements, nonfinite {v.nonfinite}")
  shapes = [tuple(np.shape(a)) for a in c.args]
  got = (f"diagnosis {d.model} ({d.verdict}), params "
         f"{ {k: d.params[k] for k in list(d.params)[:6]} }, evidence: "
         f"{d.evidence[:400]}" if d is not None else f"raised:\n{o.error}")
  return (f"{c.kind} {c.dtype.name} {shapes} {c.kwargs}: {slip};{vis}\n"
          f"  {got}")


def failures(o: Outcome) -> list[str]:
  """What the case requires and did not get (empty: accepted)."""
  c, d, v = o.case, o.diagnosis, o.visibility
  if d is None:
    return ["the diagnosis raised"]
  if c.slip is None:
    return [] if d.verdict == "pass" else [f"a control got {d.verdict}"]
  bad = []
  if v.visible and not named(o):
    bad.append(f"a visible slip of model {c.slip.model} named {d.model}")
  params = dict(d.params or {})
  name = params.get("slip")
  parsed = None if name is None else injectors.slip_from_name(str(name))
  if name is not None and (parsed is None or parsed.model != d.model):
    bad.append(f"params['slip'] {name!r} is no grammar name of model "
               f"{d.model}")
  est = params.get("estimate")
  same = parsed is None or parsed.param == c.slip.param  # its own fit
  if (v.visible and c.slip.category == "constant" and same
      and est is not None and math.isfinite(float(est))
      and math.isfinite(c.slip.value)):
    g0 = injectors.golden_value(c.kind, c.args, c.kwargs, c.slip.param)
    if abs(float(est) - c.slip.value) > ESTIMATE_SHARE * abs(
        c.slip.value - g0):
      bad.append(f"estimate {est} for {c.slip.param}={c.slip.value} "
                 f"(golden {g0})")
  return bad


def _check(o: Outcome) -> None:
  bad = failures(o)
  assert not bad, "; ".join(bad) + "\n" + _describe(o)


def acceptance_table(outcomes) -> str:
  """Markdown: per category x dtype, drawn / visible / named / verdicts;
  the controls' line."""
  rows = collections.defaultdict(collections.Counter)
  for o in outcomes:
    c, d = o.case, o.diagnosis
    key = ("control" if c.slip is None else c.slip.category, c.dtype.name)
    row = rows[key]
    row["drawn"] += 1
    row[d.verdict if d is not None else "raised"] += 1
    if c.slip is not None and o.visibility.visible:
      row["visible"] += 1
      row["named"] += bool(named(o))
      row["equivalent"] += named(o) == "equivalent"
    row["accepted"] += not failures(o)
  lines = ["| category | dtype | drawn | visible | named (equivalent) "
           "| fail/warn/pass | raised | accepted |",
           "|---|---|---|---|---|---|---|---|"]
  for (cat, dt), r in sorted(rows.items()):
    lines.append(f"| {cat} | {dt} | {r['drawn']} | {r['visible']} | "
                 f"{r['named']} ({r['equivalent']}) | "
                 f"{r['fail']}/{r['warn']}/{r['pass']} | {r['raised']} | "
                 f"{r['accepted']} |")
  return "\n".join(lines)


# ------------------------------------------------------------------- CI


@pytest.mark.parametrize("i", range(CI_CASES))
def test_ci_case(i):
  _check(_outcomes(CI_SEED, CI_CASES, CI_CALLS)[i])


def test_acceptance_table_ci():
  outs = _outcomes(CI_SEED, CI_CASES, CI_CALLS)
  print("\n" + acceptance_table(outs))
  # The draw holds cases that can fail: controls and visible slips.
  assert any(o.case.slip is None for o in outs)
  assert any(o.visibility is not None and o.visibility.visible
             for o in outs)


# ------------------------------------------------------------------ slow


@pytest.mark.slow
@pytest.mark.parametrize("i", range(SLOW_CASES))
def test_slow_case(i):
  _check(_outcomes(SLOW_SEED, SLOW_CASES, SLOW_CALLS)[i])


@pytest.mark.slow
def test_acceptance_table_slow():
  outs = _outcomes(SLOW_SEED, SLOW_CASES, SLOW_CALLS)
  print("\n" + acceptance_table(outs))
  cats = {o.case.slip.category for o in outs if o.case.slip is not None}
  assert cats == set(peat.core.SLIP_OPS)
  assert sum(o.case.slip is None for o in outs) >= 5
