"""autoao's HTML report: one self-contained page that explains a run, plus its tables as CSV.

    from autoao.reports import render
    render("autoao-report/")        # -> autoao-report/report.html (+ report_*.csv beside it)

`load` (autoao.reports.load) reads a run directory through autoao.records' types (the run files
and the study's trial records); `render` turns them into HTML (Jinja2, autoescaped), SVG plots
(matplotlib) and CSV tables (pandas). Those three libraries are imported only when a report is
rendered, so importing this package stays light.
"""

from __future__ import annotations

if __name__ != "autoao.reports":  # the bare name from the checkout's root: the installed package's
    from autoao.common import step_aside

    step_aside(__name__, __file__)

from autoao.reports.html import render
from autoao.reports.load import ReportData, ReportError, load

__all__ = ["ReportData", "ReportError", "load", "render"]
