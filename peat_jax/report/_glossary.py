"""The report's glossary: the error models this report names, one click
from each name (docs/error_models.md has every model)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from peat_jax import detector as _detector
from peat_jax.report._charts import esc
from peat_jax.report._markup import MODEL_ANCHOR, model_family, table


def _models(node: Any) -> Iterator[str]:
  """Every ``"model"`` string anywhere in the report data."""
  if isinstance(node, Mapping):
    for k, v in node.items():
      if k == "model" and isinstance(v, str):
        yield v
      else:
        yield from _models(v)
  elif isinstance(node, (list, tuple)):
    for v in node:
      yield from _models(v)


def section_glossary(d: Mapping) -> str:
  """The entries of the error models the report names, in glossary order."""
  named = {f for f in map(model_family, _models(d)) if f}
  rows = [[f'<span id="{MODEL_ANCHOR.format(e.name)}"><code>{esc(e.name)}</code>'
           "</span>", esc(e.meaning), esc(_detector.verdict_of(e.name)),
           esc(e.look_at)]
          for e in _detector.GLOSSARY.values() if e.name in named]
  out = ['<section id="error-models"><h2>The error models named here</h2>']
  if rows:
    out.append(table(["error model", "what it means", "verdict",
                      "where to look"], rows))
  out.append('<p class="note">Every error model and the rule that decides '
             "pass, warn and fail: docs/error_models.md in peat_jax.</p>")
  out.append("</section>")
  return "".join(out)
