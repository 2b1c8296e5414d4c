"""The study's report: per-run summaries, per-method aggregates over seeds, PNG plots and one
markdown file (``results.md``), regenerated from the run directories alone.

``summaries.py`` reads each run's numbers (and defines them); ``comparison.py`` compares the methods
over seeds; ``plots.py`` draws the curves; ``page.py`` writes ``results.md`` and ``summary.json``."""

from agentrl.study.report.comparison import diff_cell, paired_differences
from agentrl.study.report.page import write_report
from agentrl.study.report.significance import paired_t, supported
from agentrl.study.report.summaries import band_fraction, entropy_slope, summarize_run

__all__ = [
    "band_fraction",
    "diff_cell",
    "entropy_slope",
    "paired_differences",
    "paired_t",
    "summarize_run",
    "supported",
    "write_report",
]
