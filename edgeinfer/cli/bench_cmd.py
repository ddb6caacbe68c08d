"""``edgeinfer bench``: a table (or JSON list) of latency, throughput, load time and memory."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .model_cmds import model_inputs

_COLUMNS = (
    ("provider", "<22"), ("threads", ">7"), ("load ms", ">8"), ("p50 ms", ">8"), ("p90 ms", ">8"),
    ("p99 ms", ">8"), ("mean ms", ">8"), ("min ms", ">8"), ("max ms", ">8"), ("runs/s", ">8"),
    ("peak MiB", ">9"),
)


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure ``args.model`` per provider and thread count; print a table or JSON.

    Exit code 0 when at least one configuration was measured (failed ones are shown with their
    reason); the library raises when none could be.
    """
    from ..bench import bench, parse_threads, plot_histograms
    from ..catalog import resolve_model

    path = resolve_model(args.model)
    results = bench(
        path,
        providers=args.providers,
        threads=parse_threads(args.threads),
        runs=args.runs,
        warmup=args.warmup,
        input_shapes=model_inputs(args.model, args.input_shape)[0],
    )
    if args.plot:
        plot_histograms(results, args.plot)
    if args.json:
        rows = [{"model": str(path), **r.to_dict()} for r in results]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    print(f"model {path}: {args.runs} timed runs after {args.warmup} warm-up, "
          "each configuration in a fresh process")
    print("  ".join(f"{name:{fmt}}" for name, fmt in _COLUMNS))
    for r in results:
        print(_row(r))
    if args.plot:
        print(f"histograms: {args.plot}")
    return 0


def _row(r: Any) -> str:
    name = (r.provider or r.requested).removesuffix("ExecutionProvider")
    threads = str(r.threads) if r.threads else "default"
    if r.error:
        return f"{name:<22}  {threads:>7}  failed: {r.error}"
    lat = r.latency_ms
    values = [name, threads, f"{r.load_ms:.1f}", *(f"{lat[k]:.2f}" for k in
              ("p50", "p90", "p99", "mean", "min", "max")), f"{r.throughput:.1f}",
              f"{r.peak_rss_mb:.1f}"]
    return "  ".join(f"{v:{fmt}}" for v, (_, fmt) in zip(values, _COLUMNS))
