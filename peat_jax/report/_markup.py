"""Small HTML pieces of the report page: tables, notes, verdict chips.

Every string passed as text is escaped here; cells of :func:`table` hold
already escaped HTML."""

from __future__ import annotations

from typing import Mapping, Sequence

from peat_jax import detector as _detector
from peat_jax.report._charts import esc

#: The anchor of an error model's entry in the report's glossary.
MODEL_ANCHOR = "model-{}"


def model_family(name: str) -> str | None:
  """The glossary family of a model name (None: not a glossary name)."""
  fam = _detector.family(name)
  return fam if fam in _detector.GLOSSARY else None


def linked(name: str) -> str:
  """An error model's name in bold, linked to its glossary entry in the
  report when the glossary has it."""
  fam = model_family(name)
  text = f"<b>{esc(name)}</b>"
  return f'<a href="#{MODEL_ANCHOR.format(fam)}">{text}</a>' if fam else text


def chip(verdict: str) -> str:
  return f'<span class="chip v-{esc(verdict)}">{esc(verdict)}</span>'


def model(record: Mapping) -> str:
  """A diagnosis's error model in bold, with its second cause when given
  (a site, or a fuzz variant)."""
  second = record.get("secondary")
  return linked(record["model"]) + (
      f" + {linked(second['model'])}" if second else "")


def note(text: str) -> str:
  return f'<p class="note">{esc(text)}</p>'


def table(header: Sequence[str], rows: Sequence[Sequence[str]],
           num_cols: Sequence[int] = (), row_classes: Sequence[str] = ()
           ) -> str:
  """An HTML table; ``rows`` hold already escaped HTML."""
  out = ["<table><thead><tr>"]
  out += [f"<th>{esc(h)}</th>" for h in header]
  out.append("</tr></thead><tbody>")
  for i, row in enumerate(rows):
    cls = f' class="{row_classes[i]}"' if row_classes else ""
    out.append(f"<tr{cls}>")
    for j, cell in enumerate(row):
      out.append(f'<td class="num">{cell}</td>' if j in num_cols
                 else f"<td>{cell}</td>")
    out.append("</tr>")
  out.append("</tbody></table>")
  return "".join(out)


def empty_section(section_id: str, title: str, text: str) -> str:
  """A section that holds only a note (its data is missing)."""
  return (f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>'
          f"{note(text)}</section>")
