"""The campaign report: one self-contained HTML page and the same data as JSON.

Private modules: ``_data`` (the one builder of the report data from a
campaign's records, and its plain-text summary), ``_schema`` (validation of the report data, strict JSON),
``_html`` (the page's sections and :func:`write_report`), ``_charts``
(inline SVG plots). docs/report.md has the schema.
"""

from peat_jax.report._data import finding_line as finding_line
from peat_jax.report._data import report_data as report_data
from peat_jax.report._data import site_entries as site_entries
from peat_jax.report._data import summary_table as summary_table
from peat_jax.report._data import verdict_data as verdict_data
from peat_jax.report._html import finding_cause as finding_cause
from peat_jax.report._html import render_html as render_html
from peat_jax.report._html import write_report as write_report
from peat_jax.report._schema import HTML_NAME as HTML_NAME
from peat_jax.report._schema import JSON_NAME as JSON_NAME
from peat_jax.report._schema import ReportPaths as ReportPaths
