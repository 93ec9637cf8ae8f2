"""Tests of the campaign report (peat_jax/_report.py, peat_jax/_svg.py).

The report data is built from real numbers: float32 matmuls against a
float64 reference, a bf16-input kernel under test, a bit-flip fault, a
reordered summation, and a small least-squares training run in numpy whose
playback and runtime FI effects are measured, not made up.
"""

from __future__ import annotations

import html
import html.parser
import json
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from peat_jax import detector
from peat_jax.profiler.runtime_fi import _significance
from peat_jax.profiler import weight_distances
from peat_jax.report import _charts as _svg
from peat_jax.core import PeatError
from peat_jax.report import ReportPaths, render_html, write_report

STRANGE_SITE = "fwd/Block<0>/Attn & Co/dot_general:1"
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr", "area",
        "base", "source"}


# ------------------------------------------------------------ real numbers


def _bf16(x: np.ndarray) -> np.ndarray:
  """Rounds float32 to bfloat16 (nearest even), returned as float32."""
  u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
  return u.astype(np.uint32).view(np.float32)


def _ordered(x: np.ndarray) -> np.ndarray:
  i = x.view(np.int32).astype(np.int64)
  return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def _stats(t, g, r):
  """The per-record numbers the Analyzer would give, computed in numpy."""
  diff = t.astype(np.float64) - g
  rel = np.abs(diff) / np.maximum(np.abs(g), 1e-30)
  floor = np.sqrt(np.mean((g - r) ** 2))
  ulp = np.abs(_ordered(t) - _ordered(g))
  buckets = np.where(ulp == 0, 0,
                     np.floor(np.log2(np.maximum(ulp, 1))).astype(int) + 1)
  xor = t.view(np.uint32) ^ g.view(np.uint32)
  bits = [int(np.count_nonzero((xor >> np.uint32(b)) & np.uint32(1)))
          for b in range(32)]
  nz = rel[rel > 0]
  edges = np.logspace(-10, 1, 12)
  counts, _ = np.histogram(np.clip(nz, edges[0], edges[-1]), edges)
  return {
      "noise_ratio": float(np.sqrt(np.mean((t - r) ** 2)) / floor),
      "rel_rms": float(np.sqrt(np.mean(diff**2)) /
                       np.sqrt(np.mean(g.astype(np.float64) ** 2))),
      "share_differ": float(np.mean(t != g)),
      "ulp_hist": np.bincount(buckets.ravel(), minlength=12),
      "bits_xor": np.asarray(bits),
      "rel_hist": {"edges": edges, "counts": counts},
  }


def _kut(kind, a, b, rng):
  g = a @ b
  if kind == "bf16":
    return _bf16(a) @ _bf16(b)
  if kind == "reorder":
    half = a.shape[1] // 2
    return (a[:, half:] @ b[half:]) + (a[:, :half] @ b[:half])
  if kind == "bitflip":
    t = g.copy().view(np.uint32)
    t.flat[rng.choice(g.size, 3, replace=False)] ^= np.uint32(1 << 27)
    return t.view(np.float32)
  return g.copy()


SITES = (
    ("fwd/Dense_0/dot_general:0", "matmul", "fwd", "bf16", "precision:bf16",
     0.93, "warn"),
    ("bwd/Dense_0/dot_general:0", "matmul", "bwd", "bitflip", "bitflip",
     0.97, "fail"),
    (STRANGE_SITE, "matmul", "fwd", "reorder", "reordering", 0.81, "pass"),
    ("bwd/Dense_1/dot_general:1", "matmul", "bwd", "exact", "exact", 1.0,
     "pass"),
)


def _train(kut_every: int | None, steps: int, fault_at: int | None = None,
           *, init_seed: int | None = None, proxy: bool = False,
           weights: list | None = None):
  """Least squares by SGD; the KUT (bf16 matmul) at every kut_every-th step.

  From ``fault_at`` on, predictions are scaled by 1e19 (a corrupted
  exponent that propagates), so the loss overflows to Inf and then NaN.
  ``init_seed`` starts from seeded random weights instead of zeros (a seed
  run); ``proxy`` rounds the inputs of both matmuls (forward and gradient)
  to bf16 at every step (the bf16 proxy); ``weights`` gets the weights
  after every step.
  """
  rng = np.random.default_rng(7)
  x = rng.standard_normal((64, 24)).astype(np.float32)
  y = x @ rng.standard_normal((24, 1)).astype(np.float32)
  w = (np.zeros((24, 1), np.float32) if init_seed is None else
       np.random.default_rng(init_seed).normal(
           0, 0.1, (24, 1)).astype(np.float32))
  losses, grads, updates = [], [], []
  with np.errstate(all="ignore"):
    for s in range(steps):
      use = proxy or (kut_every is not None and s % kut_every == 0)
      pred = (_bf16(x) @ _bf16(w)) if use else x @ w
      if fault_at is not None and s >= fault_at:
        pred = pred * np.float32(1e19)
      err = pred - y
      losses.append(float(np.mean(err.astype(np.float64) ** 2)))
      grad = (_bf16(x).T @ _bf16(err) if proxy else x.T @ err) / np.float32(
          len(x))
      upd = np.float32(-0.05) * grad
      grads.append(grad)
      updates.append(upd)
      w = w + upd
      if weights is not None:
        weights.append(w)
  return np.asarray(losses), grads, updates


SAVED = [10, 20, 30, 40, 50, 60]


def _weights_record(run: list, golden: list) -> dict:
  """A run's weight distances at SAVED (the records' ``weights`` field)."""
  rows = [weight_distances({"w": run[s - 1]}, {"w": golden[s - 1]})
          for s in SAVED]
  out = {"steps": SAVED, "layers": rows[0]["layers"]}
  for m in ("w1", "rel_l2"):
    out[m] = [r[m] for r in rows]
    out[m + "_total"] = [r[m + "_total"] for r in rows]
  return out


PROVENANCE = {
    "kut": {"spec": "native:matmul:in_bf16", "source": "native",
            "kernel": "matmul", "variant": "in_bf16", "tile": None,
            "site_kernel": "dot_general",
            "content": {"sha256": "ab" * 32, "files": [
                {"path": "/site-packages/peat_jax/kernels/"
                         "_peat_kernels_cpu.so", "sha256": "cd" * 32}]}},
    "platform": {"backend": "cpu", "device_kind": "cpu", "device_count": 1,
                 "cores_visible": 2, "system": "Linux",
                 "machine": "x86_64", "python": "3.11.7"},
    "versions": {"peat_jax": "0.1.0", "jax": "0.10.2", "jaxlib": "0.10.2",
                 "xla_flags": ["--xla_cpu_enable_fast_math=false"],
                 "xla_flags_other": []},
    "sites": [{"site": s[0], "kernel": "dot_general", "phase": s[2],
               "in_shapes": [[64, 96], [96, 48]],
               "in_dtypes": ["float32", "float32"]} for s in SITES],
    "phases": ["bwd", "fwd"], "checkpoint_steps": [0, 10, 20, 30, 40, 50],
    "frequencies": ["every call", "every 4th step"],
    "runtime_steps": [0, 59]}


def campaign_data(seed: int = 0) -> dict:
  """A complete report data mapping, from real computations."""
  rng = np.random.default_rng(seed)
  steps = [0, 10, 20, 30, 40, 50]
  sites = []
  for name, kernel, direction, kind, model, conf, verdict in SITES:
    per_step = []
    for _ in steps:
      a = rng.standard_normal((64, 96)).astype(np.float32)
      b = rng.standard_normal((96, 48)).astype(np.float32)
      g = a @ b
      r = a.astype(np.float64) @ b.astype(np.float64)
      per_step.append(_stats(_kut(kind, a, b, rng), g, r))
    last = per_step[-1]
    site = {
        "site": name, "kernel": kernel, "direction": direction,
        "model": model, "confidence": conf, "verdict": verdict,
        "evidence": f"{model}: share differing "
                    f"{per_step[-1]['share_differ']:.3g}, noise ratio "
                    f"{per_step[-1]['noise_ratio']:.3g} (< 2 is benign)",
        "steps": np.asarray(steps), "noise_ratio":
            np.asarray([p["noise_ratio"] for p in per_step]),
        "rel_rms": [p["rel_rms"] for p in per_step],
        "share_differ": [p["share_differ"] for p in per_step],
        "ulp_hist": last["ulp_hist"], "bits_xor": last["bits_xor"],
        "mantissa_bits": 23, "exponent_bits": 8,
    }
    site["noise_trend"] = detector.noise_trend(steps, site["noise_ratio"])
    if kind != "exact":
      site["rel_hist"] = last["rel_hist"]
    sites.append(site)
  # Playback: one golden step vs one KUT step from the same state.
  n = 60
  gl, gg, gu = _train(None, n)
  kl, kg, ku = _train(1, n)
  ck = [0, 10, 20, 30, 40, 50]

  def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

  playback = {"steps": ck, "loss_golden": gl[ck], "loss_kut": kl[ck],
              "grad_rel_diff": [rel(kg[s], gg[s]) for s in ck],
              "update_rel_diff": [rel(ku[s], gu[s]) for s in ck]}
  runtime = []
  golden_w, seed_w, proxy_w = [], [], []
  _train(None, n, weights=golden_w)
  _train(None, n, init_seed=1, weights=seed_w)
  proxy_loss = _train(None, n, proxy=True, weights=proxy_w)[0]
  seed_rec = _weights_record(seed_w, golden_w)
  proxy_rec = _weights_record(proxy_w, golden_w)
  for freq, every, fault in (("every call", 1, None),
                             ("every 4th step", 4, None),
                             ("every call + bitflip", 1, 35)):
    run_w = []
    loss, _, _ = _train(every, n, fault, weights=run_w)
    with np.errstate(divide="ignore", invalid="ignore"):
      bad = ~np.isfinite(loss) | (np.abs(loss - gl) > 0.5 * np.abs(gl) + 1e-3)
    at = int(np.argmax(bad)) if bad.any() else None
    runtime.append({"frequency": freq, "steps": np.arange(n), "loss": loss,
                    "golden_loss": gl, "diverged_at": at,
                    "reason": None if at is None else
                    "loss left the golden envelope" if np.isfinite(loss[at])
                    else "loss is not finite"})
    if fault is None:
      runtime[-1]["significance"] = _significance.significance(
          _weights_record(run_w, golden_w), seed_rec, proxy_rec)
  spread = np.abs(_train(None, n)[0] - _train(2, n)[0]) + 0.02 * gl
  return {
      "title": "peat_jax campaign: native bf16 matmul",
      "kut": "matmul:native_bf16 <v2> & friends",
      "scenario": "least squares, SGD, 60 steps",
      "peat_version": "0.1.0",
      "created": "2026-11-29T12:00:00+00:00",
      "verdict": {"verdict": "fail",
                  "summary": "fail: 6 of 24 records decided it (bitflip x6)",
                  "deciding": [["bwd/Dense_0/dot_general:0", s]
                               for s in steps]},
      "sites": sites,
      "localization": {"site": "fwd/Dense_0/dot_general:0", "step": 0,
                       "noise_ratio": np.float32(
                           sites[0]["noise_ratio"][0])},
      "playback": playback,
      "runtime": runtime,
      "runtime_spread": {"steps": np.arange(n), "loss_spread": spread,
                         "bf16_loss": proxy_loss},
      "settings": {"checkpoint_every": 10, "seed": 0, "dtype": "float32",
                   "sites": "dot_general", "noise_floor_multiplier": 2.0},
      "provenance": PROVENANCE,
  }


# ------------------------------------------------------------ helpers


def _expected_json(obj):
  """What report.json must hold: plain JSON, NaN null, Inf strings."""
  if isinstance(obj, dict):
    return {str(k): _expected_json(v) for k, v in obj.items()}
  if isinstance(obj, np.ndarray):
    return _expected_json(obj.tolist())
  if isinstance(obj, (list, tuple)):
    return [_expected_json(v) for v in obj]
  if isinstance(obj, (np.integer,)):
    return int(obj)
  if isinstance(obj, (float, np.floating)):
    v = float(obj)
    return None if math.isnan(v) else ("Infinity" if v == math.inf else
                                        "-Infinity" if v == -math.inf else v)
  return obj


def _strict_load(path):
  def bad(token):
    raise AssertionError(f"invalid JSON token {token}")
  return json.loads(path.read_text(encoding="utf-8"), parse_constant=bad)


class _Balance(html.parser.HTMLParser):
  """Checks that every non-void tag is closed in order."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.stack, self.errors, self.text, self.count = [], [], [], 0

  def handle_starttag(self, tag, attrs):
    self.count += 1
    if tag not in VOID:
      self.stack.append(tag)

  def handle_startendtag(self, tag, attrs):
    self.count += 1

  def handle_endtag(self, tag):
    if not self.stack or self.stack[-1] != tag:
      self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
    else:
      self.stack.pop()

  def handle_data(self, data):
    self.text.append(data)


def _section(page: str, name: str) -> str:
  start = page.index(f'<section id="{name}">')
  return page[start:page.index("</section>", start)]


@pytest.fixture(scope="module")
def data():
  return campaign_data()


@pytest.fixture(scope="module")
def written(data, tmp_path_factory):
  return write_report(data, tmp_path_factory.mktemp("report") / "new" / "dir")


# ------------------------------------------------------------ tests


def test_data_is_real(data):
  by = {s["model"]: s for s in data["sites"]}
  assert by["precision:bf16"]["noise_ratio"].min() > 10
  assert 0 < by["reordering"]["noise_ratio"].max() < 3
  assert by["bitflip"]["bits_xor"][27] == 3
  assert sum(by["exact"]["ulp_hist"][1:]) == 0
  assert by["exact"]["ulp_hist"][0] == 64 * 48
  bad = data["runtime"][2]
  assert not np.isfinite(bad["loss"]).all() and bad["diverged_at"] == 35
  assert data["runtime"][0]["diverged_at"] is None


def test_json_round_trip(data, written):
  assert isinstance(written, ReportPaths)
  assert written.json.name == "report.json"
  assert written.html.name == "report.html"
  back = _strict_load(written.json)
  assert back == _expected_json(data)
  assert back["sites"][2]["site"] == STRANGE_SITE
  assert back["runtime"][2]["loss"][-1] in ("Infinity", None)


def test_html_well_formed_and_self_contained(written):
  page = written.html.read_text(encoding="utf-8")
  parser = _Balance()
  parser.feed(page)
  parser.close()
  assert parser.errors == []
  assert parser.stack == []
  assert parser.count > 500
  without_ns = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
  assert "http://" not in without_ns and "https://" not in without_ns
  assert "<script" not in page and "<link" not in page
  assert "<img" not in page and "url(" not in page
  svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
  assert len(svgs) >= 10
  for svg in svgs:  # each plot is well-formed XML on its own
    ET.fromstring(svg)


def test_html_content(data, written):
  page = written.html.read_text(encoding="utf-8")
  assert '<div class="badge v-fail">FAIL</div>' in page
  assert html.escape(data["verdict"]["summary"]) in page
  assert html.escape(data["kut"]) in page and data["kut"] not in page
  for site in data["sites"]:
    assert html.escape(site["site"]) in page
  assert STRANGE_SITE not in page
  assert "fwd/Block&lt;0&gt;/Attn &amp; Co/dot_general:1" in page
  order = ["verdict", "detector", "localization", "heat", "trends",
           "top-sites", "playback", "runtime", "significance", "provenance",
           "error-models", "settings"]
  pos = [page.index(f'<section id="{s}">') for s in order]
  assert pos == sorted(pos)
  assert page.index("<h1>") < pos[0] < pos[-1] < page.index("<footer>")
  footer = page[page.index("<footer>"):]
  assert "peat_jax 0.1.0" in footer and "report.json" in footer
  loc = _section(page, "localization")
  assert "fwd/Dense_0/dot_general:0" in loc and "step <b>0</b>" in loc
  rt = _section(page, "runtime")
  assert "every call + bitflip: diverged at 35" in rt
  for freq in ("every call", "every 4th step", "golden",
               "golden seed-to-seed spread"):
    assert f">{freq}</text>" in rt
  bits = _section(page, "top-sites")
  for word in ("sign", "exponent", "mantissa", "ULP distance",
               "Relative error", "bit 27 (exponent bit 4): 3"):
    assert word in bits


def test_every_model_named_links_to_its_glossary_entry(data, written):
  page = written.html.read_text(encoding="utf-8")
  glossary = _section(page, "error-models")
  links = set(re.findall(r'href="#(model-[a-z_]+)"', page))
  anchors = set(re.findall(r'id="(model-[a-z_]+)"', glossary))
  assert links and links == anchors
  named = {s["model"].split(":")[0] for s in data["sites"]}
  assert {f"model-{m}" for m in named} <= anchors
  for m in named:
    assert html.escape(detector.glossary_entry(m).meaning) in glossary
    assert html.escape(detector.verdict_of(m)) in glossary
  assert "docs/error_models.md" in glossary


def test_detector_table_worst_first(data, written):
  page = written.html.read_text(encoding="utf-8")
  table = _section(page, "detector")
  names = [html.escape(s["site"]) for s in data["sites"]]
  pos = {n: table.index(f"<code>{n}</code>") for n in names}
  ranked = sorted(names, key=pos.get)
  assert ranked[0] == "bwd/Dense_0/dot_general:0"  # fail
  assert ranked[1] == "fwd/Dense_0/dot_general:0"  # warn
  passing = sorted((s for s in data["sites"] if s["verdict"] == "pass"),
                   key=lambda s: -np.max(s["noise_ratio"]))
  assert ranked[2:] == [html.escape(s["site"]) for s in passing]
  assert table.count('class="r-fail"') == 1


def test_top_sites_limit(data, tmp_path):
  page = write_report(data, tmp_path, top_sites=1).html.read_text()
  top = _section(page, "top-sites")
  assert "bwd/Dense_0/dot_general:0" in top
  assert "fwd/Dense_0/dot_general:0" not in top
  assert "2 more sites with histograms" in top


@pytest.mark.parametrize("drop", [
    "localization", "playback", "runtime", "runtime_spread", "settings",
    "peat_version", "created", "all"])
def test_missing_optional_sections(data, tmp_path, drop):
  d = dict(data)
  keys = (["localization", "playback", "runtime", "runtime_spread",
           "settings", "peat_version", "created"] if drop == "all"
          else [drop])
  for k in keys:
    if drop == "all" or k in ("peat_version", "created"):
      d.pop(k)
    else:
      d[k] = None
  paths = write_report(d, tmp_path)
  page = paths.html.read_text()
  notes = {"localization": "No localization", "playback": "No playback FI",
           "runtime": "No runtime FI run", "settings": "No campaign settings"}
  for k in keys:
    if k in notes:
      assert notes[k] in page
  if "peat_version" in keys:
    import peat_jax
    assert f"peat_jax {peat_jax.__version__}" in page
  assert _strict_load(paths.json)["title"] == d["title"]
  parser = _Balance()
  parser.feed(page)
  assert parser.errors == [] and parser.stack == []


def test_sites_without_histograms_or_steps(data, tmp_path):
  d = dict(data)
  d["sites"] = [{k: v for k, v in s.items()
                 if k in ("site", "direction", "model", "verdict")}
                for s in data["sites"]]
  page = write_report(d, tmp_path).html.read_text()
  assert "No per-step noise ratios in the data." in page
  assert "No error histograms in the data" in page
  d["sites"] = []
  page = write_report(d, tmp_path).html.read_text()
  assert "No sites were profiled." in page


def test_nan_and_inf_give_valid_json(data, tmp_path):
  d = dict(data)
  d["sites"] = [dict(data["sites"][0])]
  ratio = np.array(d["sites"][0]["noise_ratio"], np.float32)
  ratio[1], ratio[2], ratio[3] = np.nan, np.inf, -np.inf
  d["sites"][0]["noise_ratio"] = ratio
  d["sites"][0]["confidence"] = np.float64(np.nan)
  d["settings"] = {"threshold": float("inf"), "n": np.int64(3),
                   "scale": np.float16(0.5)}
  paths = write_report(d, tmp_path)
  text = paths.json.read_text()
  assert "NaN" not in text and "Infinity" in text
  back = _strict_load(paths.json)
  assert back["sites"][0]["noise_ratio"][1:4] == [None, "Infinity",
                                                  "-Infinity"]
  assert back["sites"][0]["confidence"] is None
  assert back["settings"] == {"threshold": "Infinity", "n": 3, "scale": 0.5}
  page = paths.html.read_text()
  assert "noise ratio = NaN" in page and "noise ratio = Inf" in page


def _broken(data, path, value):
  d = json.loads(json.dumps(_expected_json(data)))
  *head, last = path
  node = d
  for k in head:
    node = node[k]
  if value is KeyError:
    del node[last]
  else:
    node[last] = value
  return d


@pytest.mark.parametrize("path,value,words", [
    (("title",), KeyError, ["'title'", "missing", "string"]),
    (("kut",), 3, ["'kut'", "int", "string"]),
    (("verdict", "verdict"), "maybe", ["verdict", "'maybe'", "pass"]),
    (("verdict", "summary"), KeyError, ["'summary'", "missing"]),
    (("sites", 1, "direction"), "up", ["bwd/Dense_0", "direction", "'up'"]),
    (("sites", 0, "verdict"), "ok", ["fwd/Dense_0", "'ok'", "fail"]),
    (("sites", 0, "noise_ratio"), [1.0], ["noise_ratio", "1 values", "6"]),
    (("sites", 0, "bits_xor"), [1] * 16, ["bits_xor", "16", "32"]),
    (("sites", 0, "rel_hist", "edges"), [1.0, 2.0], ["rel_hist", "edges"]),
    (("playback", "loss_kut"), [1.0], ["playback.'loss_kut'", "equal"]),
    (("runtime", 0, "frequency"), KeyError, ["runtime[0]", "frequency"]),
    (("localization", "step"), "zero", ["localization", "'step'", "int"]),
    (("sites",), {"a": 1}, ["'sites'", "list"]),
    (("runtime", 0, "significance", "total", "vs_bf16", "w1"), [1.0],
     ["runtime[0].significance.total.vs_bf16.w1", "1 values", "(6)"]),
    (("runtime", 0, "significance", "step"), "last",
     ["significance.'step'", "str"]),
    (("runtime", 1, "significance", "layers", 0, "layer"), KeyError,
     ["layers[0]", "'layer'", "missing"]),
    (("provenance", "kut"), KeyError, ["provenance.'kut'", "missing"]),
    (("provenance", "sites", 0, "in_dtypes"), ["float32"],
     ["provenance.sites[0]", "2 input shapes and 1 dtypes"]),
    (("runtime_spread", "bf16_loss"), [1.0],
     ["'bf16_loss' has 1 values", "equal"]),
])
def test_bad_input_raises_peat_error(data, tmp_path, path, value, words):
  d = _broken(data, path, value)
  with pytest.raises(PeatError) as info:
    write_report(d, tmp_path / "out")
  for w in words:
    assert w in str(info.value)
  assert isinstance(info.value, ValueError)
  assert not (tmp_path / "out").exists()


def test_unconvertible_value_raises(data, tmp_path):
  d = dict(data)
  d["settings"] = {"model": object()}
  with pytest.raises(PeatError, match=r"data\.settings\.model"):
    write_report(d, tmp_path)
  with pytest.raises(PeatError, match="mapping"):
    render_html([1, 2])


# ------------------------------------------------------------ svg helpers


def test_svg_bar_chart_log_and_empty():
  counts = np.bincount(np.random.default_rng(1).geometric(0.3, 500))
  svg = _svg.bar_chart(counts, [str(i) for i in range(len(counts))],
                       title="a <b>", log_y=True)
  root = ET.fromstring(svg)
  rects = [e for e in root.iter() if e.tag.endswith("rect")]
  assert len(rects) == 1 + np.count_nonzero(counts)
  assert "a &lt;b&gt;" in svg
  assert "no data" in _svg.bar_chart([0, 0], ["a", "b"], log_y=True)
  ET.fromstring(_svg.bar_chart([-2.0, 3.0, math.nan], ["x", "y", "z"]))


def test_svg_line_chart_breaks_at_nonfinite():
  x = np.arange(10)
  y = np.sin(x) + 2.0
  y[4] = np.nan
  svg = _svg.line_chart([_svg.Series("s", x, y, marks=(7,)),
                         _svg.Series("t", x, y * 3, dash=True)],
                        log_y=True, vlines=[(7, "here", "#f00")],
                        band=(x, y - 0.1, y + 0.1, "band"))
  root = ET.fromstring(svg)
  lines = [e for e in root.iter() if e.tag.endswith("polyline")]
  assert len(lines) == 4  # two series, each broken once
  assert "no finite data" in _svg.line_chart(
      [_svg.Series("s", [0, 1], [math.nan, math.inf])])


def test_svg_heat_table_colors():
  svg = _svg.heat_table(["r1", "r2"], ["0", "1", "2"],
                        [[0.5, 1.0, 100.0], [None, math.inf, 0.0]],
                        value_name="ratio")
  root = ET.fromstring(svg)
  fills = [e.get("fill") for e in root.iter() if e.tag.endswith("rect")
           and e.find("{http://www.w3.org/2000/svg}title") is not None]
  assert fills[1] == "#f7f7f7"                    # at the center: white
  assert fills[2] == _svg.diverging_color(1.0)    # largest: deepest red
  assert fills[3] == "#cfcfcf" and fills[4] == "#7f0000"
  assert fills[5] == _svg.diverging_color(-1.0)
  assert "r2 | 1 | ratio = Inf" in svg


def test_site_entries_carry_the_ratio_view_and_a_secondary_cause():
  """A bit flip over bf16-input rounding: the site table names both causes
  and the per-metric ratios of KUT over golden error vs float64."""
  import jax
  import jax.numpy as jnp
  from peat_jax import analyzer, detector, injectors, profiler, report
  rng = np.random.default_rng(11)
  a = rng.standard_normal((64, 160)).astype(np.float32)
  b = rng.standard_normal((160, 72)).astype(np.float32)
  g = jnp.asarray(a @ b)
  r = a.astype(np.float64) @ b.astype(np.float64)
  bf = lambda x: jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32)
  t = injectors.inject("bitflip", jax.random.key(2), bf(a) @ bf(b),
                       count=3, bits=28)
  sig = analyzer.analyze(t, g, r)
  diag = detector.detect(sig, context={"kernel": "dot_general",
                                       "reduction": 160})
  rec = {"kind": "site", "kut": "k", "step": 0, "site": "fwd/dot:0",
         "kernel": "dot_general", "phase": "fwd", "reduction": 160,
         "signature": profiler.signature_record(sig),
         "diagnosis": detector.diagnosis_record(diag)}
  (entry,) = report.site_entries([rec], ["fwd/dot:0"])
  assert entry["model"] == "bitflip" and entry["verdict"] == "fail"
  assert entry["secondary"]["model"].startswith("precision"), entry
  rt = entry["ratios"]
  assert set(rt) == set(analyzer.RATIO_METRICS)
  assert rt["rmse"] > 100 and rt["nonfinite_mismatch"] == 0
  assert 0 < rt["beyond_ulps"] <= 1
  json.dumps(rt)  # JSON-ready: no NaN


def test_site_table_reads_model_verdict_and_ratios_of_one_record():
  """Two passing records of one site (bitwise equal, and a reordering at
  a higher noise ratio): the table's model, noise ratio and ratio view
  are the reordering record's, not 'exact' beside another's ratio."""
  import jax.numpy as jnp
  from peat_jax import analyzer, detector, profiler, report
  rng = np.random.default_rng(12)
  a = rng.standard_normal((32, 256)).astype(np.float32)
  b = rng.standard_normal((256, 24)).astype(np.float32)
  g = np.asarray(jnp.asarray(a) @ jnp.asarray(b))
  r = a.astype(np.float64) @ b.astype(np.float64)
  # Rounding-sized noise 2.5x golden's, of the other sign (another order
  # of the same float32 sum looks like this).
  t = r - 2.5 * (g.astype(np.float64) - r)
  recs = []
  for step, out in ((0, g), (10, t.astype(np.float32))):
    sig = analyzer.analyze(out, g, r)
    diag = detector.detect(sig, context={"kernel": "dot_general",
                                         "reduction": 256})
    recs.append({"kind": "site", "kut": "k", "step": step,
                 "site": "fwd/dot:0", "kernel": "dot_general",
                 "phase": "fwd", "reduction": 256,
                 "signature": profiler.signature_record(sig),
                 "diagnosis": detector.diagnosis_record(diag)})
  assert recs[0]["diagnosis"]["model"] == "exact"
  assert recs[1]["diagnosis"]["model"] == "reordering"
  assert recs[1]["signature"]["noise_ratio"] > 1.2  # worse than golden
  (entry,) = report.site_entries(recs, ["fwd/dot:0"])
  assert entry["top_step"] == 10 and entry["model"] == "reordering"
  assert entry["top_noise_ratio"] == pytest.approx(
      recs[1]["signature"]["noise_ratio"])
  assert entry["ratios"]["rmse"] == pytest.approx(
      analyzer.metric_ratios(recs[1]["signature"])["rmse"])
