"""The report's data schema: validation and conversion to strict JSON.

The schema itself is documented in :mod:`peat_jax.report._html` and
docs/report.md."""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import os
import pathlib
from typing import Any, Mapping, NamedTuple, Sequence

from peat_jax.core import PeatError
from peat_jax.detector import VERDICTS

#: Verdicts, worst first.
DIRECTIONS = ("fwd", "bwd")
HTML_NAME = "report.html"
JSON_NAME = "report.json"


class ReportPaths(NamedTuple):
  """Where :func:`write_report` wrote the report.

  Attributes:
    html: the self-contained HTML page.
    json: the same data as JSON.
  """

  html: pathlib.Path
  json: pathlib.Path


# ---------------------------------------------------------------- plain data


def _plain(obj: Any, where: str, json_safe: bool) -> Any:
  """Converts numpy / JAX values to Python ones, recursively.

  With ``json_safe`` NaN becomes ``None`` and +/-Inf ``"Infinity"`` /
  ``"-Infinity"``.
  """
  if obj is None or isinstance(obj, (str, bool)):
    return obj
  if isinstance(obj, Mapping):
    return {str(k): _plain(v, f"{where}.{k}", json_safe)
            for k, v in obj.items()}
  if hasattr(obj, "dtype") and hasattr(obj, "tolist"):  # numpy, jax arrays
    return _plain(obj.tolist(), where, json_safe)
  if isinstance(obj, (list, tuple)):
    return [_plain(v, f"{where}[{i}]", json_safe) for i, v in enumerate(obj)]
  if isinstance(obj, numbers.Integral):
    return int(obj)
  if isinstance(obj, (numbers.Real, float)) or hasattr(obj, "__float__"):
    try:
      v = float(obj)
    except (TypeError, ValueError) as e:
      raise PeatError(f"report data: {where} is {type(obj).__name__}, "
                      "which is not a number") from e
    if json_safe and math.isnan(v):
      return None
    if json_safe and math.isinf(v):
      return "Infinity" if v > 0 else "-Infinity"
    return v
  if isinstance(obj, (_dt.datetime, _dt.date)):
    return obj.isoformat()
  if isinstance(obj, os.PathLike):
    return os.fspath(obj)
  raise PeatError(f"report data: {where} is a {type(obj).__name__}; expected "
                  "a mapping, list, string, number, bool or None")


# ---------------------------------------------------------------- validation


def _get(m: Mapping, key: str, where: str, kinds: tuple, expected: str,
         required: bool = True) -> Any:
  if key not in m or m[key] is None:
    if required:
      raise PeatError(f"report data: {where}{key!r} is missing; expected "
                      f"{expected}")
    return None
  v = m[key]
  if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
    raise PeatError(f"report data: {where}{key!r} is {type(v).__name__} "
                    f"{str(v)[:60]!r}; expected {expected}")
  return v


_NUM = (int, float)
_SEQ = (list,)


def _same_len(m: Mapping, keys: Sequence[str], ref: str, where: str) -> None:
  n = len(m[ref])
  for k in keys:
    if m.get(k) is not None:
      _get(m, k, where, _SEQ, "a list")
      if len(m[k]) != n:
        raise PeatError(f"report data: {where}{k!r} has {len(m[k])} values "
                        f"but {where}{ref!r} has {n}; expected equal lengths")


def _check_verdict(v: Any, where: str) -> None:
  if v not in VERDICTS:
    raise PeatError(f"report data: {where} is {v!r}; expected one of "
                    f"{', '.join(VERDICTS)}")


def _validate(d: Mapping) -> None:
  """Raises PeatError naming the first key that breaks the schema."""
  if not isinstance(d, Mapping):
    raise PeatError(f"report data is {type(d).__name__}; expected a mapping "
                    "(see docs/report.md)")
  for k in ("title", "kut", "scenario"):
    _get(d, k, "", (str,), "a string")
  for k in ("peat_version", "created"):
    _get(d, k, "", (str,), "a string", required=False)
  v = _get(d, "verdict", "", (dict,), 'a mapping {"verdict", "summary", '
           '"deciding"}')
  _check_verdict(v.get("verdict"), "verdict['verdict']")
  _get(v, "summary", "verdict.", (str,), "a string")
  for i, rec in enumerate(_get(v, "deciding", "verdict.", _SEQ,
                               "a list of [site, step]", False) or []):
    if not isinstance(rec, list) or len(rec) != 2:
      raise PeatError(f"report data: verdict.deciding[{i}] is {rec!r}; "
                      "expected [site, step]")
  sites = _get(d, "sites", "", _SEQ, "a list of site mappings")
  for i, s in enumerate(sites):
    w = f"sites[{i}]."
    if not isinstance(s, dict):
      raise PeatError(f"report data: sites[{i}] is {type(s).__name__}; "
                      "expected a mapping")
    _get(s, "site", w, (str,), "a string")
    w = f"sites[{i}] ({s['site']!r})."
    _get(s, "kernel", w, (str,), "a string", False)
    if s.get("direction") not in DIRECTIONS:
      raise PeatError(f"report data: {w}'direction' is "
                      f"{s.get('direction')!r}; expected 'fwd' or 'bwd'")
    _get(s, "model", w, (str,), "an error-model name")
    _check_verdict(s.get("verdict"), f"{w}'verdict'")
    _get(s, "confidence", w, _NUM, "a number in [0, 1]", False)
    _get(s, "evidence", w, (str,), "a string", False)
    _get(s, "ratios", w, (dict,), "a mapping of metric ratios", False)
    sec = _get(s, "secondary", w, (dict,), '{"model", "confidence", '
               '"evidence"}', False)
    if sec is not None:
      _get(sec, "model", w + "secondary.", (str,), "an error-model name")
    if s.get("steps") is not None:
      _get(s, "steps", w, _SEQ, "a list of steps")
      _same_len(s, ("noise_ratio", "rel_rms", "share_differ", "verdicts"),
                "steps", w)
      for j, rv in enumerate(s.get("verdicts") or []):
        _check_verdict(rv, f"{w}'verdicts'[{j}]")
    h = _get(s, "rel_hist", w, (dict,), '{"edges", "counts"}', False)
    if h is not None:
      e = _get(h, "edges", w + "rel_hist.", _SEQ, "a list of bin edges")
      c = _get(h, "counts", w + "rel_hist.", _SEQ, "a list of counts")
      if len(e) != len(c) + 1:
        raise PeatError(f"report data: {w}rel_hist has {len(e)} edges and "
                        f"{len(c)} counts; expected len(edges) == "
                        "len(counts) + 1")
    _get(s, "ulp_hist", w, _SEQ, "a list of counts", False)
    bits = _get(s, "bits_xor", w, _SEQ, "a list of counts per bit", False)
    if bits is not None:
      m = _get(s, "mantissa_bits", w, (int,), "an int (float32: 23)")
      x = _get(s, "exponent_bits", w, (int,), "an int (float32: 8)")
      if m + x + 1 != len(bits):
        raise PeatError(f"report data: {w}bits_xor has {len(bits)} entries; "
                        f"expected mantissa_bits + exponent_bits + 1 = "
                        f"{m + x + 1}")
  loc = _get(d, "localization", "", (dict,), '{"site", "step"} or None',
             False)
  if loc is not None:
    _get(loc, "site", "localization.", (str,), "a string")
    _get(loc, "step", "localization.", (int,), "an int")
  pb = _get(d, "playback", "", (dict,), "a mapping or None", False)
  if pb is not None:
    for k in ("steps", "loss_golden", "loss_kut"):
      _get(pb, k, "playback.", _SEQ, "a list")
    _same_len(pb, ("loss_golden", "loss_kut", "grad_rel_diff",
                   "update_rel_diff"), "steps", "playback.")
  runs = _get(d, "runtime", "", _SEQ, "a list of runs or None", False)
  for i, r in enumerate(runs or []):
    w = f"runtime[{i}]."
    if not isinstance(r, dict):
      raise PeatError(f"report data: runtime[{i}] is {type(r).__name__}; "
                      "expected a mapping")
    _get(r, "frequency", w, (str,), "a string, e.g. 'every call'")
    _get(r, "steps", w, _SEQ, "a list of steps")
    _get(r, "loss", w, _SEQ, "a list of losses")
    _same_len(r, ("loss", "golden_loss"), "steps", w)
    _get(r, "diverged_at", w, (int,), "an int step or None", False)
    _get(r, "reason", w, (str,), "a string or None", False)
    sig = _get(r, "significance", w, (dict,), "a significance mapping or "
               "None", False)
    if sig is not None:
      _check_significance(sig, w + "significance.")
  for i, c in enumerate(_get(d, "crashes", "", _SEQ,
                             "a list of findings or None", False) or []):
    w = f"crashes[{i}]."
    if not isinstance(c, dict):
      raise PeatError(f"report data: crashes[{i}] is {type(c).__name__}; "
                      "expected a mapping")
    if c.get("kind") not in ("crash", "hang"):
      raise PeatError(f"report data: {w}'kind' is {c.get('kind')!r}; "
                      "expected 'crash' or 'hang'")
    _get(c, "phase", w, (str,), "a string, e.g. 'playback'")
    _get(c, "message", w, (str,), "a string")
    _get(c, "step", w, (int,), "an int step or None", False)
    _get(c, "site", w, (str,), "a site name or None", False)
  sp = _get(d, "runtime_spread", "", (dict,), "a mapping or None", False)
  if sp is not None:
    _get(sp, "steps", "runtime_spread.", _SEQ, "a list of steps")
    _get(sp, "loss_spread", "runtime_spread.", _SEQ, "a list")
    _same_len(sp, ("loss_spread", "bf16_loss"), "steps", "runtime_spread.")
  _get(d, "settings", "", (dict,), "a mapping {name: value}", False)
  prov = _get(d, "provenance", "", (dict,), "a provenance mapping or None",
              False)
  if prov is not None:
    _check_provenance(prov)
  fz = _get(d, "fuzz", "", (dict,), "a fuzz mapping or None", False)
  if fz is not None:
    _check_fuzz(fz)


def _check_fuzz(fz: Mapping) -> None:
  """The shapes beyond training (``fuzz``): its own verdict and variants."""
  w = "fuzz."
  _check_verdict(fz.get("verdict"), "fuzz['verdict']")
  _get(fz, "summary", w, (str,), "a string")
  _get(fz, "scope", w, (str,), "a string", False)
  for i, rec in enumerate(_get(fz, "deciding", w, _SEQ,
                               "a list of [site, variant]", False) or []):
    if not isinstance(rec, list) or len(rec) != 2:
      raise PeatError(f"report data: fuzz.deciding[{i}] is {rec!r}; "
                      "expected [site, variant]")
  counts = _get(fz, "counts", w, (dict,), "a mapping {verdict: count}",
                False)
  for k in counts or {}:
    _get(counts, k, w + "counts.", (int,), "an int")
  for k in ("families", "sites"):
    _get(fz, k, w, _SEQ, "a list of strings", False)
  for i, v in _mappings(_get(fz, "variants", w, _SEQ,
                             "a list of variant mappings"), f"{w}variants"):
    vw = f"{w}variants[{i}]."
    _get(v, "site", vw, (str,), "a site name")
    _get(v, "variant", vw, (str,), "a variant name, e.g. 'len=64'")
    _get(v, "family", vw, (str,), "a family name", False)
    _get(v, "model", vw, (str,), "an error-model name")
    _check_verdict(v.get("verdict"), f"{vw}'verdict'")
    _get(v, "shapes", vw, _SEQ, "a list of input shapes", False)
    _get(v, "noise_ratio", vw, _NUM + (str,), "a number or None", False)
    _get(v, "evidence", vw, (str,), "a string", False)
  for i, f in _mappings(_get(fz, "findings", w, _SEQ,
                             "a list of findings", False) or [],
                        f"{w}findings"):
    fw = f"{w}findings[{i}]."
    _get(f, "site", fw, (str,), "a site name")
    _get(f, "variant", fw, (str,), "a variant name")
    _get(f, "error", fw, (str,), "what the KUT did")
  first = _get(fz, "first_failure", w, (dict,), "a variant, a finding or "
               "None", False)
  if first is not None:
    _get(first, "site", w + "first_failure.", (str,), "a site name")
    _get(first, "variant", w + "first_failure.", (str,), "a variant name")


_BLOCKS = ("distance", "seed", "bf16", "vs_seed", "vs_bf16")


def _mappings(items: Sequence, where: str):
  """``(i, item)`` of a list of mappings; PeatError at the first other."""
  for i, m in enumerate(items):
    if not isinstance(m, dict):
      raise PeatError(f"report data: {where}[{i}] is {type(m).__name__}; "
                      "expected a mapping")
    yield i, m


def _check_block(b: Mapping, steps: int, where: str) -> None:
  """One significance block: ``{key: {metric: [per step]} or None}``."""
  _get(b, "distance", where, (dict,), "{metric: [per step]}")
  for key in _BLOCKS:
    m = _get(b, key, where, (dict,), "{metric: [per step]} or None", False)
    for metric, vals in (m or {}).items():
      _get(m, metric, f"{where}{key}.", _SEQ, "a list per saved step")
      if len(vals) != steps:
        raise PeatError(f"report data: {where}{key}.{metric} has "
                        f"{len(vals)} values; expected one per saved step "
                        f"({steps})")


def _check_significance(sig: Mapping, w: str) -> None:
  _get(sig, "metric", w, (str,), "a metric name, e.g. 'w1'")
  _get(sig, "step", w, (int,), "the saved step of vs_seed / vs_bf16")
  for k in ("vs_seed", "vs_bf16", "vs_proxy"):
    _get(sig, k, w, _NUM, "a number or None", False)
  _get(sig, "proxy", w, (str,), "the proxy's formats, e.g. 'fp8_e4m3'",
       False)
  n = len(_get(sig, "steps", w, _SEQ, "a list of saved steps"))
  _check_block(_get(sig, "total", w, (dict,), "a mapping of distances"),
               n, w + "total.")
  for i, layer in _mappings(_get(sig, "layers", w, _SEQ,
                                 "a list of per-layer mappings"),
                            f"{w}layers"):
    _get(layer, "layer", f"{w}layers[{i}].", (str,), "a parameter path")
    _check_block(layer, n, f"{w}layers[{i}] ({layer['layer']!r}).")


def _check_provenance(prov: Mapping) -> None:
  w = "provenance."
  kut = _get(prov, "kut", w, (dict,), 'a mapping {"spec", ...}')
  _get(kut, "spec", w + "kut.", (str,), "the KUT spec")
  _get(kut, "content", w + "kut.", (dict,), '{"sha256", "files"} or None',
       False)
  _get(prov, "platform", w, (dict,), "a mapping (may be empty)")
  _get(prov, "versions", w, (dict,), "a mapping (may be empty)")
  for i, site in _mappings(_get(prov, "sites", w, _SEQ,
                                "a list of site mappings"), f"{w}sites"):
    _get(site, "site", f"{w}sites[{i}].", (str,), "a site name")
    shapes = _get(site, "in_shapes", f"{w}sites[{i}].", _SEQ,
                  "a list of shapes or None", False)
    dtypes = _get(site, "in_dtypes", f"{w}sites[{i}].", _SEQ,
                  "a list of dtype names or None", False)
    if shapes is not None and dtypes is not None and len(shapes) != len(
        dtypes):
      raise PeatError(f"report data: {w}sites[{i}] has {len(shapes)} input "
                      f"shapes and {len(dtypes)} dtypes; expected one dtype "
                      "per shape")
  for k in ("phases", "checkpoint_steps", "frequencies"):
    _get(prov, k, w, _SEQ, "a list", False)
  if prov.get("backward") not in (None, "golden", "kut"):
    raise PeatError(f"report data: {w}backward is {prov['backward']!r}; "
                    'expected "golden", "kut" or None')
