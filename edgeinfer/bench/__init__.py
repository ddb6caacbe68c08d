"""The benchmark harness behind ``edgeinfer bench``: configurations measured in child processes
(``harness``), the measuring selector's candidate table (``table``) and their pictures
(``plots``)."""

from __future__ import annotations

from .harness import BenchResult, bench, make_inputs, parse_threads, resolve_providers, summarize
from .plots import plot_candidates, plot_histograms
from .table import CandidateTable, candidate_table

__all__ = [
    "BenchResult", "CandidateTable", "bench", "candidate_table", "make_inputs", "parse_threads",
    "plot_candidates", "plot_histograms", "resolve_providers", "summarize",
]
