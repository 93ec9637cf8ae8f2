"""The campaign report: one self-contained HTML page and the same data as JSON.

Private modules: ``_data`` (the one builder of the report data from a
campaign's records, and its plain-text summary), ``_training`` (the
training-level statements in words: significance of runtime FI runs and
its part in the verdict, rising noise ratios, what a verdict covers),
``_schema`` (validation of the report data, strict JSON), ``_html`` (the
page and :func:`write_report`), ``_sections`` (the page's training-level
sections: noise ratio over training, significance, provenance),
``_shapes`` (the shapes beyond training: the fuzz records' data, verdict
and section, kept apart from the training verdict),
``_markup`` (tables, notes, chips) and ``_charts`` (inline SVG plots).
docs/report.md has the schema.
"""

from peat_jax.report._data import finding_line as finding_line
from peat_jax.report._data import report_data as report_data
from peat_jax.report._data import site_entries as site_entries
from peat_jax.report._data import summary_table as summary_table
from peat_jax.report._data import verdict_data as verdict_data
from peat_jax.report._shapes import fuzz_data as fuzz_data
from peat_jax.report._training import covers_sentence as covers_sentence
from peat_jax.report._training import provenance_lines as provenance_lines
from peat_jax.report._training import significance_sentence as significance_sentence
from peat_jax.report._html import finding_cause as finding_cause
from peat_jax.report._html import render_html as render_html
from peat_jax.report._html import write_report as write_report
from peat_jax.report._schema import HTML_NAME as HTML_NAME
from peat_jax.report._schema import JSON_NAME as JSON_NAME
from peat_jax.report._schema import ReportPaths as ReportPaths
