"""`wb report NAME`: a Markdown (and optional HTML) report with tables and PNG plots, read from MLflow.

    wb report my-sweep                 # reports/my-sweep/report.md + *.png
    wb report my-sweep --html          # + report.html (markdown-it-py)
    wb report <run name or run id> --out /tmp/r

Modules: :mod:`~workbench.report.target` resolves NAME and assembles the rows;
:mod:`~workbench.report.tables` the Markdown tables and the training-signal section (rewards with
and without speculation, Welch test); :mod:`~workbench.report.plots` the matplotlib plots;
:mod:`~workbench.report.write` writes the files. `wb export NAME` (docs/export.md) reads the same rows:
:mod:`~workbench.report.export` (pure: a drafter spec as vLLM / NeMo RL / verl / TRL settings),
:mod:`~workbench.report.export_point` (the best or named point, the files), :mod:`~workbench.report.export_head`
(the drafter folder vLLM loads).
"""

import sys
import types

from workbench.report.target import ReportError, RunPoint, Target, build_rows, label, resolve, row_mean, row_runs
from workbench.report.write import Report, make_report, markdown_to_html, report, write_report

__all__ = [
    "ReportError",
    "Report",
    "Target",
    "RunPoint",
    "resolve",
    "write_report",
    "make_report",
    "report",
    "markdown_to_html",
    "build_rows",
    "label",
    "row_runs",
    "row_mean",
]


class _ReportPackage(types.ModuleType):
    """This package is callable as :func:`workbench.report.write.report` (``from workbench import report``)."""

    def __call__(self, *args, **kwargs):
        return report(*args, **kwargs)


sys.modules[__name__].__class__ = _ReportPackage
