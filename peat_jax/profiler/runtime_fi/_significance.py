"""Training-level significance of a runtime FI run, from its records.

A run's weight distances to the golden trajectory
(:mod:`peat_jax.profiler.runtime_fi._weights`) mean little alone: a distance is read
in units of two yardsticks measured the same way at the same saved steps:

* ``seed``: two golden runs that differ only in their seed (the largest
  distance of the seed runs of the spread to the golden run);
* ``bf16``: the precision-proxy run, the same training with every matmul
  and convolution one format below its inputs' own (float32 inputs at
  bfloat16, bfloat16 and float16 inputs at float8 e4m3 with a per-tensor
  scale; ``proxy`` names the formats, :func:`_weights.proxy_formats`). The
  key keeps its name from when every model trained in float32.

``vs_seed`` and ``vs_bf16`` (also as ``vs_proxy``) are the run's distance
divided by the yardstick's. The headline metric is the Wasserstein-1 distance of the
weight values (:data:`METRIC`), as in "Is Flash Attention Stable?" (arXiv
2405.02803); relative L2 is given beside it. A report's verdict warns when
a KUT moves the weights beyond the bf16 proxy (``vs_bf16 > 1`` at the last
saved step; :mod:`peat_jax.report`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from peat_jax import report as _report
from peat_jax.profiler.runtime_fi._weights import METRICS

#: The metric of the headline ratios ``vs_seed`` / ``vs_bf16``.
METRIC = "w1"
#: The precision proxy's record label (runtime records, report).
BF16_LABEL = "bf16 proxy"


def proxy_label(proxy: str | None) -> str:
  """``"bf16 proxy"``, ``"fp8_e4m3 proxy"``, ... for a proxy's formats."""
  return f"{proxy or 'bf16'} proxy"


def ratio(a: Any, b: Any) -> float | None:
  """``a / b``, or None when ``b`` is not a positive finite number."""
  if a is None or b is None:
    return None
  a, b = float(a), float(b)
  if not (b > 0 and math.isfinite(b)) or math.isnan(a):
    return None
  return a / b


def _series(w: Mapping, i: int | None) -> dict:
  """``{metric: [per step]}`` of a layer (``i``) or the total (None)."""
  if i is None:
    return {m: list(w[m + "_total"]) for m in METRICS}
  return {m: [row[i] for row in w[m]] for m in METRICS}


def _block(run: Mapping, refs: Mapping[str, Mapping | None],
           name: str | None) -> dict:
  """Distances and ratios of one layer (``name``) or the total (None)."""
  def pick(w):
    if w is None:
      return None
    if name is None:
      return _series(w, None)
    return _series(w, w["layers"].index(name)) if name in w["layers"] \
        else None

  out = {"distance": pick(run)}
  for key, w in refs.items():
    ref = pick(w)
    out[key] = ref
    out["vs_" + key] = None if ref is None else {
        m: [ratio(a, b) for a, b in zip(out["distance"][m], ref[m])]
        for m in METRICS}
  return out


def significance(run: Mapping | None, seed: Mapping | None,
                 bf16: Mapping | None, proxy: str = "bf16") -> dict | None:
  """A run's ``significance`` entry in the report schema (docs/report.md).

  Args:
    run: the run's ``weights`` record field (``_weights.Tracker.record``).
    seed: the spread record's ``weights`` (None: not measured).
    bf16: the precision-proxy record's ``weights`` (None: not measured).
    proxy: the formats of that proxy (its record's ``proxy``; records
      from before it was one format below the model's own say nothing:
      ``"bf16"``).

  Returns:
    ``{"metric", "step", "vs_seed", "vs_bf16", "vs_proxy", "proxy",
    "steps", "total", "layers"}``: ``vs_seed`` / ``vs_bf16`` the total
    :data:`METRIC` ratios at the last saved ``step`` (None without that
    yardstick), ``vs_proxy`` the same as ``vs_bf16``; ``total`` and each entry
    of ``layers`` (``{"layer": path, ...}``) hold ``distance``, ``seed``,
    ``bf16``, ``vs_seed`` and ``vs_bf16``, each ``{metric: [per step]}``
    or None. None when the run has no weight distances.
  """
  if not run or not run.get("steps"):
    return None
  refs = {k: w for k, w in (("seed", seed), ("bf16", bf16))
          if w and list(w["steps"]) == list(run["steps"])}
  refs = {"seed": refs.get("seed"), "bf16": refs.get("bf16")}
  total = _block(run, refs, None)
  last = {k: (total["vs_" + k] or {}).get(METRIC, [None])[-1]
          for k in refs}
  return {"metric": METRIC, "step": int(run["steps"][-1]),
          "vs_seed": last["seed"], "vs_bf16": last["bf16"],
          "vs_proxy": last["bf16"], "proxy": proxy,
          "steps": [int(s) for s in run["steps"]], "total": total,
          "layers": [{"layer": n, **_block(run, refs, n)}
                     for n in run["layers"]]}


def progress_note(byname: Mapping[str, Mapping], name: str) -> str:
  """``", moves the weights ..."`` for a progress line ('' without data)."""
  rec = byname.get(name, {})
  sig = significance(rec.get("weights"),
                     byname.get("spread", {}).get("weights"),
                     byname.get("bf16", {}).get("weights"),
                     proxy=byname.get("bf16", {}).get("proxy", "bf16"))
  return "" if sig is None else ", " + _report.significance_sentence(sig)


__all__ = ["BF16_LABEL", "METRIC", "progress_note", "proxy_label", "ratio",
           "significance"]
