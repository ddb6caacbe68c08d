"""Pictures of benchmark results, drawn with Pillow alone: the candidate table as bars
(``plot_candidates``) and latency histograms per configuration (``plot_histograms``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .harness import BenchResult
from .table import CandidateTable

__all__ = ["plot_candidates", "plot_histograms"]


def plot_candidates(table: CandidateTable, out: str | os.PathLike[str]) -> Path:
    """Draw the table as a PNG (Pillow only): one bar per measured candidate, p50 as the bar and
    p99 as a whisker, auto's pick marked; rejected and failed candidates listed with the reason.
    """
    from PIL import Image, ImageDraw, ImageFont

    rows = table.rows
    timed = [r for r in rows if r.p50_ms is not None]
    refused = [r for r in rows if r.p50_ms is None]
    bar_h, label_w, w = 24, 330, 1000
    top = 56
    h = top + bar_h * len(timed) + 50 + 18 * len(refused) + 30
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    try:
        font: Any = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    left, right = label_w, w - 150
    # A p99 far out (a noisy moment) is cut at 3x the slowest p50, its value still written.
    slowest = max([r.p50_ms or 0.0 for r in timed] + [1e-3])
    hi = min(max([r.p99_ms or r.p50_ms or 0.0 for r in timed] + [1e-3]), 3 * slowest)
    draw.text((10, 8), f"{table.model.name}: {table.mode} candidates, threads up to "
              f"{table.threads}, precision >= {table.precision}, gate {table.decision.gate}",
              fill="black", font=font)
    draw.text((10, 26), f"bar: p50 ms, whisker: p99 ms; * = providers: auto's pick "
              f"({table.auto.label()})", fill="black", font=font)

    def sx(v: float) -> float:
        return left + v / hi * (right - left)

    colors = {"picked": (40, 140, 60), "ok": (120, 150, 190), "rejected": (210, 120, 60)}
    for i, r in enumerate(timed):
        y = top + i * bar_h
        mark = "* " if r.choice == table.auto else "  "
        extra = " (comparison)" if r.choice in table.extra else \
            " (fp32 reference)" if r.accuracy == "reference" else ""
        draw.text((10, y + 5), f"{mark}{r.choice.label()}{extra}", fill="black", font=font)
        p50 = r.p50_ms or 0.0
        draw.rectangle([left, y + 4, sx(p50), y + bar_h - 4],
                       fill=colors.get(r.status, (160, 160, 160)))
        p99 = min(r.p99_ms or p50, hi)
        if r.p99_ms is not None:
            ym = y + bar_h // 2
            draw.line([sx(p50), ym, sx(p99), ym], fill="black")
            if p99 < r.p99_ms:  # cut: an arrow head
                draw.polygon([(sx(p99), ym - 4), (sx(p99) + 6, ym), (sx(p99), ym + 4)],
                             fill="black")
            else:
                draw.line([sx(p99), ym - 4, sx(p99), ym + 4], fill="black")
        end = sx(max(p50, p99)) + 6
        draw.text((end + 6, y + 5), f"{p50:.2f} / {r.p99_ms or p50:.2f}", fill="black",
                  font=font)
    axis_y = top + bar_h * len(timed) + 4
    draw.line([left, top - 4, left, axis_y], fill="black")
    draw.line([left, axis_y, right, axis_y], fill="black")
    for k in range(6):
        v = k * hi / 5
        draw.line([sx(v), axis_y, sx(v), axis_y + 4], fill="black")
        draw.text((sx(v) - 12, axis_y + 6), f"{v:.1f}", fill="black", font=font)
    draw.text(((left + right) / 2 - 30, axis_y + 22), "ms per run", fill="black", font=font)
    y = axis_y + 46
    for r in refused:
        text = f"{r.status}: {r.choice.label()}: {r.reason}"
        draw.text((10, y), text[:150], fill=(170, 60, 20) if r.status == "rejected"
                  else (110, 110, 110), font=font)
        y += 18
    path = Path(out)
    img.save(path, format="PNG")
    return path

# -- the latency histogram ----------------------------------------------------------------------


def plot_histograms(results: Sequence[BenchResult], out: str | os.PathLike[str],
                    bins: int = 30) -> Path:
    """Draw one latency histogram per measured configuration into one PNG (Pillow only).

    Each panel has counts against milliseconds, with p50 and p99 marked. Runs slower than the
    panel's range (a long tail) are counted in the last bin, and the panel says how many.

    Raises:
        ConfigError: no configuration has latencies to draw.
    """
    from PIL import Image, ImageDraw, ImageFont

    rows = [r for r in results if r.latencies]
    if not rows:
        raise ConfigError("nothing to plot: no configuration was measured")
    w, h = 720, 300
    img = Image.new("RGB", (w, h * len(rows)), "white")
    draw = ImageDraw.Draw(img)
    try:
        font: Any = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    for i, r in enumerate(rows):
        _panel(draw, font, r, (0, i * h, w, h), bins)
    path = Path(out)
    img.save(path, format="PNG")
    return path


def _panel(draw: Any, font: Any, r: BenchResult, box: tuple[int, int, int, int], bins: int) -> None:
    import numpy as np

    x0, y0, w, h = box
    left, right, top, bottom = x0 + 60, x0 + w - 20, y0 + 40, y0 + h - 45
    p50, p99 = r.latency_ms["p50"], r.latency_ms["p99"]
    lo = r.latency_ms["min"]
    hi = min(r.latency_ms["max"], p99 + 0.25 * (p99 - lo)) if p99 > lo else lo + 1e-3
    hi = max(hi, lo + 1e-3)
    data = np.clip(np.asarray(r.latencies), lo, hi)
    counts, edges = np.histogram(data, bins=bins, range=(lo, hi))
    tail = int((np.asarray(r.latencies) > hi).sum())
    top_count = max(int(counts.max()), 1)

    def sx(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (right - left)

    def sy(c: float) -> float:
        return bottom - c / top_count * (bottom - top)

    title = (f"{r.provider or r.requested}, threads {r.threads or 'default'}: p50 {p50:.2f} ms, "
             f"p99 {p99:.2f} ms, {r.runs} runs" + (f" ({tail} slower in last bin)" if tail else ""))
    draw.text((left, y0 + 12), title, fill="black", font=font)
    for c, a, b in zip(counts, edges[:-1], edges[1:]):
        if c:
            draw.rectangle([sx(a) + 1, sy(c), sx(b) - 1, bottom], fill=(120, 150, 190))
    draw.line([left, bottom, right, bottom], fill="black")
    draw.line([left, top, left, bottom], fill="black")
    for k in range(6):
        v = lo + k * (hi - lo) / 5
        draw.line([sx(v), bottom, sx(v), bottom + 4], fill="black")
        draw.text((sx(v) - 14, bottom + 6), f"{v:.2f}", fill="black", font=font)
    draw.text(((left + right) / 2 - 40, bottom + 24), "latency, ms", fill="black", font=font)
    step = -(-top_count // 4)
    for c in range(0, top_count + 1, step):
        draw.line([left - 4, sy(c), left, sy(c)], fill="black")
        draw.text((x0 + 8, sy(c) - 7), str(c), fill="black", font=font)
    draw.text((x0 + 8, top - 22), "runs", fill="black", font=font)
    for v, label, color in ((p50, "p50", (0, 110, 0)), (p99, "p99", (200, 0, 0))):
        x = sx(min(v, hi))
        draw.line([x, top, x, bottom], fill=color, width=2)
        text = f"{label} {v:.2f}"
        width = draw.textlength(text, font=font)
        tx = x + 3 if x + 3 + width <= right else x - 3 - width
        draw.text((tx, top + (0 if label == "p50" else 14)), text, fill=color, font=font)
