"""The report's "Shapes beyond training" section: fuzz records of the KUT.

``peat.fuzz`` (``peat.validate(..., fuzz=...)``, ``--fuzz``) runs the KUT
on variants of its sites' captured real inputs: other batch sizes, one
row, other lengths, attention's masks and head layouts, magnitudes up to
the overflow edge, denormals. Their records (``fuzz.msgpack``, the
playback site record format plus ``variant``, ``family``, ``shapes``,
``seed``, ``golden_from``) and findings (``kind: "fuzz_error"``: the KUT
raised or returned another shape or dtype) get a verdict of their own,
kept apart from the training verdict, which covers the training's shapes
only.

:func:`fuzz_data` builds the report data's ``fuzz`` mapping (docs/report.md,
``peat_jax.report._html``), :func:`fuzz_lines` its lines of the plain-text
summary and :func:`section_fuzz` its HTML section.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from peat_jax import detector as _detector
from peat_jax.report._charts import esc, fmt
from peat_jax.report._markup import chip, empty_section, model, note, table

#: What the training verdict covers, and what the fuzz verdict adds.
SCOPE = ("The training verdict covers the training's shapes only: the "
         "shapes, masks and magnitudes the training run gave each site. "
         "The verdict of the shapes beyond training covers the variants "
         "of the sites' captured real inputs listed here; it is kept "
         "apart and does not change the training verdict.")


def _ratio(x) -> float | None:
  """A noise ratio as a float (NaN and Inf kept: the JSON file writes
  them as null and "Infinity")."""
  return None if x is None else float(x)


def _variant_entry(r: Mapping) -> dict:
  d = r["diagnosis"]
  sig = r.get("signature") or {}
  out = {"site": r["site"], "kernel": r.get("kernel"),
         "variant": r["variant"], "family": r.get("family") or "",
         "shapes": [list(s) for s in r.get("shapes") or []],
         "model": d["model"], "confidence": d.get("confidence"),
         "verdict": d["verdict"], "evidence": d.get("evidence") or "",
         "noise_ratio": _ratio(sig.get("noise_ratio")),
         "seed": r.get("seed"), "step": r.get("step"),
         "golden_from": r.get("golden_from")}
  sec = d.get("secondary")
  if sec:
    out["secondary"] = {"model": sec["model"],
                        "confidence": sec.get("confidence"),
                        "evidence": sec.get("evidence") or ""}
  return out


def _finding_entry(f: Mapping) -> dict:
  return {"site": f["site"], "variant": f["variant"],
          "family": f.get("family") or "", "step": f.get("step"),
          "seed": f.get("seed"), "error": f.get("error") or ""}


def _verdict(records: Sequence[Mapping], findings: Sequence[Mapping]
             ) -> tuple[str, str, list]:
  """``(verdict, summary, deciding)``: a finding fails it (as
  ``peat.fuzz``'s verdict does: the same function)."""
  v, summary = _detector.variants_verdict(records, findings)
  return v.verdict, summary, [list(k) for k in v.deciding]


def fuzz_data(entries: Sequence[Mapping]) -> dict | None:
  """The report's ``fuzz`` mapping of one KUT's fuzz records.

  Args:
    entries: the KUT's entries of ``fuzz.msgpack`` in file (run) order:
      site records (``kind: "site"``, ``source: "fuzz"``) and findings
      (``kind: "fuzz_error"``); other kinds are ignored.

  Returns:
    ``{"verdict", "summary", "scope", "deciding", "counts", "families",
    "sites", "variants", "findings", "first_failure"}``
    (``peat_jax.report._html`` has the schema), or None when there is
    no record and no finding.
  """
  records = [r for r in entries if r.get("kind") == "site"]
  findings = [f for f in entries if f.get("kind") == "fuzz_error"]
  if not records and not findings:
    return None
  verdict, summary, deciding = _verdict(records, findings)
  first = None
  for e in entries:
    if e.get("kind") == "fuzz_error":
      first = dict(_finding_entry(e), verdict="fail", model=None)
      break
    if e.get("kind") == "site" and e["diagnosis"]["verdict"] == "fail":
      first = _variant_entry(e)
      break
  sites: list[str] = []
  families: list[str] = []
  for e in (*records, *findings):
    if e["site"] not in sites:
      sites.append(e["site"])
    fam = e.get("family") or ""
    if fam and fam not in families:
      families.append(fam)
  counts = {v: sum(r["diagnosis"]["verdict"] == v for r in records)
            for v in _detector.VERDICTS}
  counts.update(variants=len(records), findings=len(findings))
  return {"verdict": verdict, "summary": summary, "scope": SCOPE,
          "deciding": deciding[:50], "counts": counts,
          "families": families, "sites": sites,
          "variants": [_variant_entry(r) for r in records],
          "findings": [_finding_entry(f) for f in findings],
          "first_failure": first}


def _count(n: int, word: str) -> str:
  return f"{n} {word}{'' if n == 1 else 's'}"


def _shapes_text(shapes: Any) -> str:
  if not shapes:
    return "\u2014"
  return ", ".join("[" + ", ".join(str(n) for n in s) + "]" for s in shapes)


def first_failure_text(f: Mapping) -> str:
  """The first failing variant in words (summary and page)."""
  where = f"{f['site']} {f['variant']}"
  fam = f" ({f['family']})" if f.get("family") else ""
  if f.get("error"):
    return f"{where}{fam}: {f['error']}"
  shapes = (f", shapes {_shapes_text(f.get('shapes'))}" if f.get("shapes")
            else "")
  text = (f"{where}{fam}{shapes}: {f['model']} "
          f"(noise ratio {fmt(f.get('noise_ratio'), 3)})")
  return text + (f": {f['evidence']}" if f.get("evidence") else "")


def fuzz_lines(fz: Mapping | None) -> list[str]:
  """The summary table's lines of the shapes beyond training."""
  if not fz:
    return []
  c = fz.get("counts") or {}
  lines = [f"shapes beyond training (fuzz, kept apart from the verdict "
           f"above): {fz['verdict'].upper()}, "
           f"{_count(c.get('variants', 0), 'variant')}, "
           f"{_count(c.get('findings', 0), 'finding')}",
           f"  {fz['summary']}"]
  if fz.get("first_failure"):
    lines.append("  first failing variant: "
                 + first_failure_text(fz["first_failure"]))
  return lines


def verdict_line(d: Mapping) -> str:
  """The verdict section's pointer to the separate fuzz verdict."""
  fz = d.get("fuzz")
  if not fz:
    return ""
  return (f'<p class="covers">Shapes beyond training (fuzz): '
          f'{chip(fz["verdict"])}, kept apart from this verdict, which '
          f'covers the training\'s shapes only: see '
          f'<a href="#fuzz">Shapes beyond training</a>.</p>')


def _variant_row(v: Mapping) -> list[str]:
  return [f"<code>{esc(v['variant'])}</code>", esc(v.get("family") or ""),
          esc(_shapes_text(v.get("shapes"))), model(v), chip(v["verdict"]),
          esc(fmt(v.get("noise_ratio"), 3)),
          esc(v.get("golden_from") or "\u2014"),
          esc(v.get("evidence") or "")]


def section_fuzz(d: Mapping) -> str:
  """The "Shapes beyond training" section (a note when there is none)."""
  fz = d.get("fuzz")
  if not fz:
    return empty_section(
        "fuzz", "Shapes beyond training",
        "No fuzz records: the verdict above covers the training's shapes "
        "only; shapes beyond them were not tried (peat.validate(..., "
        "fuzz=True), peat.fuzz, --fuzz).")
  out = ['<section id="fuzz"><h2>Shapes beyond training</h2>',
         '<div class="verdict">',
         f'<div class="badge small v-{esc(fz["verdict"])}">'
         f'{esc(fz["verdict"].upper())}</div>',
         f'<p class="summary">{esc(fz["summary"])}</p></div>',
         f'<p class="covers">{esc(fz.get("scope") or SCOPE)} Training '
         f'verdict: {chip(d["verdict"]["verdict"])}.</p>']
  c = fz.get("counts") or {}
  fams = ", ".join(fz.get("families") or []) or "\u2014"
  out.append(f"<p>{esc(_count(c.get('variants', 0), 'variant'))} recorded "
             f"({esc(fmt(c.get('pass', 0)))} pass, "
             f"{esc(fmt(c.get('warn', 0)))} warn, "
             f"{esc(fmt(c.get('fail', 0)))} fail) and "
             f"{esc(_count(c.get('findings', 0), 'finding'))}, at "
             f"{esc(_count(len(fz.get('sites') or []), 'site'))}; "
             f"families: {esc(fams)}.</p>")
  first = fz.get("first_failure")
  if first:
    out.append("<p><b>First failing variant</b> (in run order): "
               f"{esc(first_failure_text(first))}.</p>")
  else:
    out.append(note("No variant failed."))
  findings = fz.get("findings") or []
  if findings:
    out.append("<h3>Findings: the KUT raised, or returned another shape "
               "or dtype than the golden kernel</h3>")
    out.append(table(["site", "variant", "family", "error"], [
        [f"<code>{esc(f['site'])}</code>", f"<code>{esc(f['variant'])}"
         "</code>", esc(f.get("family") or ""), esc(f.get("error") or "")]
        for f in findings], (), ["r-fail"] * len(findings)))
  variants = fz.get("variants") or []
  for site in fz.get("sites") or []:
    rows = [v for v in variants if v["site"] == site]
    if not rows:
      continue
    out.append(f"<h3><code>{esc(site)}</code> "
               f"({esc(_count(len(rows), 'variant'))})</h3>")
    out.append(table(["variant", "family", "input shapes", "error model",
                      "verdict", "noise ratio", "golden kernel",
                      "evidence"], [_variant_row(v) for v in rows], (5,),
                     [f"r-{esc(v['verdict'])}" for v in rows]))
  out.append("</section>")
  return "".join(out)
