"""The study's report: per-run summaries, per-method aggregates over seeds, PNG plots and one
markdown file (``results.md``), regenerated from the run directories alone."""

from agentrl.study.report.page import (
    band_fraction,
    diff_cell,
    entropy_slope,
    paired_differences,
    summarize_run,
    supported,
    write_report,
)

__all__ = [
    "band_fraction",
    "diff_cell",
    "entropy_slope",
    "paired_differences",
    "summarize_run",
    "supported",
    "write_report",
]
