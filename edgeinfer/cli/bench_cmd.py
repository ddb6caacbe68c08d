"""``edgeinfer bench``: the measuring selector's candidate table (``--providers all|auto``), or
latency, throughput, load time and memory per provider and thread count, each in a fresh process
(an explicit ``--providers`` list)."""

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
_CANDIDATE_COLUMNS = (
    ("", "<1"), ("backend", "<11"), ("device", "<9"), ("prec", "<4"), ("thr", ">3"), ("opt", "<8"),
    ("spin", "<4"), ("p50 ms", ">8"), ("p99 ms", ">8"), ("runs", ">4"), ("load ms", ">8"),
    ("MiB", ">6"), ("status", "<8"), ("accuracy vs fp32 / why", ""),
)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("--providers all|auto: the candidate table the backend selector measures "
                     "(backend, device, precision, threads, graph optimization, spinning; "
                     "p50/p99 ms, load ms, MiB, accuracy against the fp32 reference, rejected or "
                     "failed and why) with what auto picks marked. A list of providers (cpu, "
                     "cuda,cpu...): warm up, then time N runs per provider and thread count, "
                     "each in a fresh process: latency p50/p90/p99, throughput, load time, peak "
                     "resident memory.")
    p.add_argument("model", help="ONNX or TFLite file, or an example model name (see `models`)")
    p.add_argument("--providers", default="auto",
                   help="auto (the probe load_model runs at first load: its candidates, its "
                   "table; default), all (every candidate the device offers, with a longer "
                   "budget), or a comma-separated list, each measured on its own in a fresh "
                   "process")
    p.add_argument("--threads", default=None, metavar="N[,N...]",
                   help="with all/auto the thread cap, candidates at 1, 2 and the cap (default: "
                   "the physical cores, at most 4); with a provider list the thread counts to "
                   "measure, e.g. 1,2,4 (default: the runtime's choice)")
    p.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp16",
                   help="all/auto: the lowest precision a candidate may use (fp16 also allows "
                   "bf16; default fp16, as load_model)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="all/auto: how long measuring may take (default 15 s for auto, as at "
                   "boot; 60 s for all)")
    p.add_argument("--runs", type=int, default=50, metavar="N",
                   help="provider list: timed runs (default 50)")
    p.add_argument("--warmup", type=int, default=5, metavar="N",
                   help="provider list: untimed runs first")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="fix a dynamic input shape, e.g. images=1,3,320,320 (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="OUT.png",
                   help="all/auto: draw the candidate table; provider list: a latency "
                   "histogram per configuration")


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure ``args.model``; print a table or JSON.

    Exit code 0 when at least one configuration was measured (failed ones are shown with their
    reason); the library raises when none could be.
    """
    if args.providers.strip().lower() in ("all", "auto"):
        return _cmd_candidates(args)
    # Inside, not at the top: both import numpy (bench msgspec too) at their top; `edgeinfer --help`
    # imports this module.
    from ..bench import bench, parse_threads, plot_histograms
    from ..model.catalog import resolve_model

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


def _cmd_candidates(args: argparse.Namespace) -> int:
    from ..bench import candidate_table, parse_threads, plot_candidates  # inside: numpy

    caps = [t for t in parse_threads(args.threads) if t is not None]
    table = candidate_table(
        args.model,
        providers=args.providers,
        threads=max(caps) if caps else None,
        precision=args.precision,
        budget_s=args.budget_s,
        input_shapes=model_inputs(args.model, args.input_shape)[0],
    )
    if args.plot:
        plot_candidates(table, args.plot)
    if args.json:
        sys.stdout.write(json.dumps(table.to_dict(), indent=2) + "\n")
        return 0
    d = table.decision
    print(f"model {table.model}: {len(d.rows)} candidates ({table.mode}), threads up to "
          f"{table.threads}, precision >= {table.precision}, measured in {d.elapsed_s:.1f} s "
          f"(budget {d.budget_s:g} s), gate {d.gate} on {d.inputs}")
    print("  ".join(f"{name:{fmt}}" for name, fmt in _CANDIDATE_COLUMNS).rstrip())
    for r in table.rows:
        print(_candidate_row(r, table))
    print(f"* auto picks: {d.summary()}")
    if table.fastest is not None and table.fastest != table.auto:
        print(f"  fastest correct candidate: {table.fastest.label()}"
              + (" (measured for comparison only)" if table.fastest in table.extra else
                 " (within 3 %: auto takes the cheaper)"))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}"  # microsecond models keep their digits


def _candidate_row(r: Any, table: Any) -> str:
    c = r.choice
    device = c.device.removesuffix("ExecutionProvider")
    if c.backend == "litert" and c.device != "xnnpack":
        device = c.device.rsplit("/", 1)[-1]
    detail = r.accuracy if r.status in ("ok", "picked") else r.reason
    if r.status == "rejected" and r.accuracy:
        detail = f"{r.reason} ({r.accuracy})" if r.accuracy not in r.reason else r.reason
    if c in table.extra:
        detail = f"{detail}; comparison only, auto does not consider it"
    values = ["*" if c == table.auto else "", c.backend, device[:9], c.precision, str(c.threads),
              c.opt or "-", "on" if c.spin else "-", _ms(r.p50_ms), _ms(r.p99_ms), str(r.runs),
              _ms(r.load_ms), "-" if r.mib is None else f"{r.mib:.1f}", r.status, detail]
    return "  ".join(f"{v:{fmt}}" for v, (_, fmt) in zip(values, _CANDIDATE_COLUMNS)).rstrip()
