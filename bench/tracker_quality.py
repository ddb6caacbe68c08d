"""Tracking quality: edgeinfer's ByteTracker against the ``bytetracker`` library on the same input.

    python3 bench/tracker_quality.py [--seeds 0-7] [--library-python /tmp/benchvenv/bin/python] [--json]

Ground truth: the annotated TUD-Campus and TUD-Stadtmitte sequences that the ``motmetrics``
wheel ships (MOTChallenge format). Detector-like input is made from it with a seeded RNG: each
true box is missed with ``MISS`` probability, jittered by ``JITTER`` of its size, and scored
like a detector (most high, ``LOW_SHARE`` of them low, 0.1..0.5); false positives (``FP_RATE``
per true box, boxes of true sizes at random places) score mostly low. Both trackers get the
same detections; ``motmetrics`` (IoU >= 0.5) gives MOTA, IDF1 and ID switches, per seed and
as the mean over the seeds (the sequences are short: one seed decides little).

What is compared: each tracker's output as its user gets it. The library returns, per frame,
its confirmed tracks matched in that frame with their Kalman-updated boxes. edgeinfer's
pipeline gives a track id to each detection and keeps the detection's own box: row
``edgeinfer`` is those (id, detection box) pairs. Row ``edgeinfer-kf`` is the same ids with
`TrackUpdate.boxes` (the track's Kalman-updated box, like the library's output); the ids, and so
the tracking decisions, are identical in both rows; only the reported boxes differ.

The library is ``bytetracker`` 0.3.2 (PyPI, "Packaged version of the ByteTrack repository").
It pins torch 1.13.0 (with CUDA wheels) and ``lap`` 0.4.0, so it lives in a separate venv,
never in the project's. ``lap`` 0.4.0's sdist does not compile on Python 3.11 (its generated
C++ needs ``longintrepr.h``), so ``lap`` 0.5.13 stands in (same ``lapjv`` call)::

    python3.11 -m venv /tmp/benchvenv
    /tmp/benchvenv/bin/pip install torch==1.13.0 scipy==1.9.3 "numpy<2" "lap>=0.5"
    /tmp/benchvenv/bin/pip install --no-deps bytetracker==0.3.2

This script runs itself under that interpreter with ``--run-library IN OUT``; detections and
tracks are exchanged as ``.npz`` files. The library gets the settings that mean what our
defaults mean: ``track_thresh`` = ``high_threshold`` (its new-track threshold is +0.1, which
is our ``new_track_threshold``), ``track_buffer`` = ``max_lost`` at ``frame_rate=30``, and its
default ``match_thresh`` 0.8 (cost ``1 - IoU * score``). Our side runs ``TrackConfig()``
unchanged, the same for both sequences.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEQUENCES = ("TUD-Campus", "TUD-Stadtmitte")
MISS = 0.10
JITTER = 0.05
LOW_SHARE = 0.15
FP_RATE = 0.05


def load_gt(name: str) -> np.ndarray:
    """Rows ``frame, id, x1, y1, x2, y2`` of a sequence shipped in the motmetrics wheel."""
    import motmetrics

    path = Path(motmetrics.__file__).parent / "data" / name / "gt.txt"
    raw = np.loadtxt(path, delimiter=",", ndmin=2)
    out = raw[:, :6].copy()
    out[:, 4] = raw[:, 2] + raw[:, 4]
    out[:, 5] = raw[:, 3] + raw[:, 5]
    return out


def make_detections(gt: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Rows ``frame, x1, y1, x2, y2, score`` of a simulated detector, from ground truth."""
    rows = []
    sizes = gt[:, 4:6] - gt[:, 2:4]
    width, height = gt[:, 4].max(), gt[:, 5].max()
    for frame in np.unique(gt[:, 0]):
        true = gt[gt[:, 0] == frame]
        kept = true[rng.random(len(true)) >= MISS]
        wh = kept[:, 4:6] - kept[:, 2:4]
        boxes = kept[:, 2:6] + rng.normal(0, JITTER, (len(kept), 4)) * np.tile(wh, 2)
        low = rng.random(len(kept)) < LOW_SHARE
        scores = np.where(low, rng.uniform(0.1, 0.5, len(kept)), rng.uniform(0.5, 0.95, len(kept)))
        n_fp = rng.poisson(FP_RATE * len(true))
        fp_wh = sizes[rng.integers(0, len(sizes), n_fp)]
        fp_xy = rng.uniform(0, 1, (n_fp, 2)) * (np.array([width, height]) - fp_wh)
        fp = np.hstack([fp_xy, fp_xy + fp_wh])
        fp_scores = np.where(rng.random(n_fp) < 0.7, rng.uniform(0.1, 0.5, n_fp),
                             rng.uniform(0.5, 0.8, n_fp))
        for b, s in zip(np.vstack([boxes, fp]), np.concatenate([scores, fp_scores])):
            rows.append([frame, *b, s])
    return np.array(rows).reshape(-1, 6)


def run_ours(dets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``frame, id, x1, y1, x2, y2``, each detection with a confirmed id: with the
    detection's box, and with the track's Kalman-updated box."""
    sys.path.insert(0, str(ROOT))
    from edgeinfer.analytics.tracker import ByteTracker
    from edgeinfer.config.analytics import TrackConfig

    tracker = ByteTracker(TrackConfig())
    raw, kf = [], []
    for frame in np.unique(dets[:, 0]):
        d = dets[dets[:, 0] == frame]
        update = tracker.update(d[:, 1:5], d[:, 5], np.zeros(len(d), dtype=np.int64))
        keep = update.ids > 0
        raw.extend([frame, i, *b] for i, b in zip(update.ids[keep], d[keep, 1:5]))
        kf.extend([frame, i, *b] for i, b in zip(update.ids[keep], update.boxes[keep]))
    return np.array(raw).reshape(-1, 6), np.array(kf).reshape(-1, 6)


def run_library(src: Path, dst: Path) -> None:
    """Under the library's venv: track ``src``'s detections with bytetracker into ``dst``."""
    import bytetracker
    import torch

    from_ours = np.load(src)
    dets, high, max_lost = from_ours["dets"], float(from_ours["high"]), int(from_ours["max_lost"])
    tracker = bytetracker.BYTETracker(track_thresh=high, track_buffer=max_lost, frame_rate=30)
    out = []
    for frame in np.unique(dets[:, 0]):
        d = dets[dets[:, 0] == frame]
        arr = np.hstack([d[:, 1:6], np.zeros((len(d), 1))]).astype(np.float32)
        tracks = np.asarray(tracker.update(torch.from_numpy(arr), None)).reshape(-1, 7)
        out.extend([frame, t[4], *t[:4]] for t in tracks)
    np.savez(dst, tracks=np.array(out).reshape(-1, 6),
             version=getattr(bytetracker, "__version__", "?"))


def evaluate(gt: np.ndarray, hyp: np.ndarray) -> dict[str, float]:
    """MOTA, IDF1, ID switches and more by motmetrics (IoU >= 0.5 matches)."""
    import motmetrics as mm

    acc = mm.MOTAccumulator(auto_id=True)
    for frame in np.unique(gt[:, 0]):
        g, h = gt[gt[:, 0] == frame], hyp[hyp[:, 0] == frame]
        acc.update(g[:, 1].astype(int), h[:, 1].astype(int), _iou_distance(g[:, 2:6], h[:, 2:6]))
    names = ["mota", "idf1", "num_switches", "precision", "recall", "num_fragmentations"]
    summary = mm.metrics.create().compute(acc, metrics=names)
    return {k: round(float(summary[k].iloc[0]), 4) for k in names}


def _iou_distance(a: np.ndarray, b: np.ndarray, max_d: float = 0.5) -> np.ndarray:
    """``1 - IoU``, NaN (no match) above ``max_d``: motmetrics' ``iou_matrix``, which calls
    ``np.asfarray`` (gone in numpy 2) in motmetrics 1.4.0."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])  # noqa: E731
    d = 1.0 - inter / (area(a)[:, None] + area(b)[None, :] - inter)
    d[d > max_d] = np.nan
    return d


TRACKERS = ("edgeinfer", "edgeinfer-kf", "bytetracker")
SHOWN = ("mota", "idf1", "num_switches")


def run_seed(seed: int, library_python: str, cfg: object) -> dict[str, dict[str, object]]:
    """Both sequences at one seed: sizes and each tracker's metrics."""
    out: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(SEQUENCES):
            gt = load_gt(name)
            dets = make_detections(gt, np.random.default_rng([seed, i]))
            src, dst = Path(tmp, f"{name}.in.npz"), Path(tmp, f"{name}.out.npz")
            np.savez(src, dets=dets, high=cfg.high_threshold,  # type: ignore[attr-defined]
                     max_lost=cfg.max_lost)  # type: ignore[attr-defined]
            subprocess.run([library_python, __file__, "--run-library", str(src), str(dst)],
                           check=True)
            lib = np.load(dst)
            raw, kf = run_ours(dets)
            out[name] = {"frames": int(len(np.unique(gt[:, 0]))), "gt_boxes": len(gt),
                         "detections": len(dets), "library": f"bytetracker {lib['version']}",
                         "edgeinfer": evaluate(gt, raw), "edgeinfer-kf": evaluate(gt, kf),
                         "bytetracker": evaluate(gt, lib["tracks"])}
    return out


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=_seeds, default=_seeds("0-7"), help="N or N-M (inclusive)")
    ap.add_argument("--library-python", default="/tmp/benchvenv/bin/python")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--run-library", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_library:
        run_library(Path(args.run_library[0]), Path(args.run_library[1]))
        return
    sys.path.insert(0, str(ROOT))
    from edgeinfer.config.analytics import TrackConfig

    cfg = TrackConfig()
    per_seed = {seed: run_seed(seed, args.library_python, cfg) for seed in args.seeds}
    mean = {name: {who: {k: round(float(np.mean([float(per_seed[s][name][who][k])  # type: ignore[index]
                                                 for s in args.seeds])), 4)
                         for k in ("mota", "idf1", "num_switches", "precision", "recall",
                                   "num_fragmentations")}
                   for who in TRACKERS} for name in SEQUENCES}
    if args.json:
        print(json.dumps({"seeds": args.seeds, "miss": MISS, "jitter": JITTER,
                          "low_share": LOW_SHARE, "fp_rate": FP_RATE,
                          "config": {f: getattr(cfg, f) for f in cfg.__struct_fields__},
                          "mean": mean, "per_seed": per_seed}, indent=1))
        return
    first = per_seed[args.seeds[0]][SEQUENCES[0]]
    print(f"library: {first['library']}; seeds {args.seeds[0]}-{args.seeds[-1]}; miss {MISS}, "
          f"jitter {JITTER}, low-score share {LOW_SHARE}, false positives {FP_RATE} per true box")
    print(f"{'sequence':16} {'tracker':13} {'MOTA':>7} {'IDF1':>7} {'IDsw':>6}   per seed "
          "(MOTA IDF1 IDsw)")
    for name in SEQUENCES:
        for who in TRACKERS:
            m = mean[name][who]
            runs = [[per_seed[s][name][who][k] for k in SHOWN] for s in args.seeds]  # type: ignore[index]
            seeds = " ".join(f"{r[0]:.3f}/{r[1]:.3f}/{int(r[2])}" for r in runs)
            print(f"{name:16} {who:13} {m['mota']:7.3f} {m['idf1']:7.3f} "
                  f"{m['num_switches']:6.2f}   {seeds}")


if __name__ == "__main__":
    main()
