"""The benchmark harness behind ``edgeinfer bench``.

Each configuration (one provider, one thread count) is measured in a fresh child process
(``python -m edgeinfer.bench SPEC.json``), so its load is cold and its peak resident memory is
its own: load, warm-up runs, then timed runs of ``Model.run`` on random inputs of each input's
shape and dtype. The child writes its result as JSON to a file named in the spec; an error in the
child comes back as the same ``edgeinfer.errors`` class.

    results = bench("model.onnx", providers="cpu", threads=[1, 2], runs=50)
    for r in results:
        r.latency_ms["p50"], r.throughput, r.peak_rss_mb

``providers="all"`` or ``"auto"`` is the measuring selector's table instead (``bench.table``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import errors
from ..model.catalog import resolve_model
from ..errors import ConfigError, EdgeInferError, ModelError
from ..model.load import load_model
from ..runtime import providers as prov
from ..runtime.modelfile import inspect_model
from ..tasks.vad import silero_load_options

__all__ = ["BenchResult", "bench", "child_main", "make_inputs", "parse_threads",
           "resolve_providers", "summarize"]

logger = logging.getLogger("edgeinfer.bench")

PERCENTILES = (50, 90, 99)
# Inputs that hold a setting rather than data: random values would be invalid (Silero's ``sr``).
_SILERO_INPUTS = {"input", "state", "sr"}


@dataclass(slots=True)
class BenchResult:
    """One configuration's measurement.

    Attributes:
        requested: the provider asked for (``auto`` or an onnxruntime/LiteRT name).
        provider: the provider that really ran (after verification); empty if it failed.
        threads: intra-op threads (``None``: the runtime's default).
        load_ms: ``load_model`` in the fresh process, without warm-up.
        warmup_ms: all warm-up runs together.
        runs: timed runs.
        latency_ms: ``p50``, ``p90``, ``p99``, ``mean``, ``min``, ``max``.
        throughput: timed runs per second of wall time.
        peak_rss_mb: the child process's peak resident memory (imports, load and runs).
        baseline_rss_mb: its resident memory after imports, before loading.
        latencies: every timed run, ms, in order.
        cache: the optimized-model cache outcome (``hit``, ``miss``, ``off``).
        error: why this configuration could not be measured, else ``None``.
    """

    requested: str
    threads: int | None
    provider: str = ""
    load_ms: float = 0.0
    warmup_ms: float = 0.0
    runs: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    throughput: float = 0.0
    peak_rss_mb: float = 0.0
    baseline_rss_mb: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cache: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``latencies`` included)."""
        return asdict(self)


def parse_threads(text: str | None) -> list[int | None]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; ``None`` or ``""`` -> ``[None]`` (the runtime's default).

    Raises:
        ConfigError: not a comma-separated list of positive integers.
    """
    if not text:
        return [None]
    out: list[int | None] = []
    for item in text.split(","):
        try:
            n = int(item)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--threads {text!r}: expected positive integers such as 1,2,4")
        out.append(n)
    return list(dict.fromkeys(out))


def resolve_providers(model_format: str, providers: str) -> list[str]:
    """The providers to measure: ``auto`` -> ``["auto"]``; ``all`` -> every available ONNX
    provider in ``auto`` order (CPU last; LiteRT: ``["auto"]``); else the normalized list
    (LiteRT: only ``cpu``, meaning no external delegate).

    Raises:
        ConfigError: an unknown provider name.
    """

    key = providers.strip().lower()
    if key == "auto":
        return ["auto"]
    if key == "all":
        if model_format != "onnx":
            return ["auto"]
        import onnxruntime as ort

        ranked = prov.rank_providers(ort.get_available_providers(), "auto", prov.detect_platform())
        return [c.name for c in ranked]
    names = list(prov.normalize(providers))
    if model_format != "onnx" and names != [prov.CPU]:
        raise ConfigError(f"--providers {providers!r}: a {model_format} model runs on LiteRT; "
                          "use auto (a delegate found on this system, else XNNPACK), all, or cpu")
    return names


def bench(
    model: str | os.PathLike[str],
    *,
    providers: str = "auto",
    threads: Sequence[int | None] = (None,),
    runs: int = 50,
    warmup: int = 5,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    timeout: float | None = None,
) -> list[BenchResult]:
    """Measure ``model`` once per (provider, thread count), each in a fresh child process.

    A configuration whose provider fails (not available, falls back, crashes) becomes a result
    with ``error`` set. An error about the model or the options (corrupt file, missing input
    shape) is raised at once; so is the first error when no configuration could be measured.

    Raises:
        ConfigError: bad options, or a dynamic input dimension with no ``input_shapes`` entry.
        ModelError: the model file is missing, corrupt or refused.
        EdgeInferError: every configuration failed (the first one's error).
    """

    if runs < 1 or warmup < 0:
        raise ConfigError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    path = resolve_model(model)
    info = inspect_model(path, max_model_mb=1 << 20)
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    results: list[BenchResult] = []
    first_error: EdgeInferError | None = None
    for provider in resolve_providers(info.format, providers):
        for n in threads:
            spec = {"model": str(path), "provider": provider, "threads": n, "runs": runs,
                    "warmup": warmup, "input_shapes": shapes}
            try:
                results.append(_measure_in_child(spec, timeout))
            except (ConfigError, ModelError):
                raise
            except EdgeInferError as exc:
                logger.info("bench %s threads=%s failed: %s", provider, n, exc)
                first_error = first_error or exc
                results.append(BenchResult(requested=provider, threads=n, error=str(exc)))
    if first_error is not None and all(r.error for r in results):
        raise first_error
    return results


def _measure_in_child(spec: dict[str, Any], timeout: float | None) -> BenchResult:
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-") as tmp:
        out = Path(tmp) / "result.json"
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps({**spec, "out": str(out)}))
        cmd = [sys.executable, "-m", "edgeinfer.bench", str(spec_file)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise errors.InferenceError(f"benchmark child timed out after {timeout} s") from exc
        if not out.exists():
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
            raise errors.WorkerCrashedError(
                f"benchmark child exited with {proc.returncode} and no result: {tail}")
        data = json.loads(out.read_text())
    if "error" in data:
        cls = getattr(errors, data["error"]["type"], EdgeInferError)
        if not (isinstance(cls, type) and issubclass(cls, EdgeInferError)):
            cls = EdgeInferError
        raise cls(data["error"]["message"])
    return BenchResult(**data["result"])


# -- the child side ----------------------------------------------------------------------------


def make_inputs(specs: Sequence[Any], fixed: Mapping[str, Sequence[int]] | None = None,
                values: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Random inputs for ``specs`` (``TensorSpec``): floats uniform in [0, 1) (quantized TFLite
    inputs, fed as float, in [-1, 1)), integers and booleans zero, inputs named in ``values``
    that value broadcast.

    Raises:
        ConfigError: an input has a dynamic dimension and ``fixed`` has no shape for it.
    """
    import numpy as np

    fixed = fixed or {}
    values = values or {}
    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    for spec in specs:
        shape = tuple(fixed.get(spec.name, spec.shape))
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            dims = ",".join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in spec.shape)
            example = ",".join(f"D{i + 1}" for i in range(len(spec.shape)))
            raise ConfigError(
                f"input {spec.name!r} has dynamic dimensions [{dims}]; give its shape with "
                f"--input-shape {spec.name}={example} (input_shapes= in the Python API)")
        dtype = np.dtype(spec.dtype)
        if spec.name in values:
            feeds[spec.name] = np.broadcast_to(np.asarray(values[spec.name], dtype), shape).copy()
        elif getattr(spec, "quantization", None) is not None:
            feeds[spec.name] = rng.uniform(-1, 1, shape).astype(np.float32)
        elif dtype.kind == "f":
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype)
    return feeds


def _known_options(input_names: set[str], shapes: dict[str, list[int]]) -> dict[str, Any]:
    """Shapes and values that make a known model valid (Silero VAD's ``sr``, its window)."""
    if input_names != _SILERO_INPUTS:
        return {"input_shapes": shapes, "values": {}}

    opts = silero_load_options()
    return {"input_shapes": {**opts["input_shapes"], **shapes}, "values": opts["warmup_inputs"]}


def _rss_mb(field_name: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def summarize(latencies: Sequence[float]) -> dict[str, float]:
    """``p50``/``p90``/``p99`` (linear interpolation), ``mean``, ``min``, ``max`` of ``latencies``."""
    import numpy as np

    a = np.asarray(latencies, dtype=np.float64)
    stats = {f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}
    stats.update(mean=float(a.mean()), min=float(a.min()), max=float(a.max()))
    return stats


def _child_measure(spec: dict[str, Any]) -> BenchResult:
    import numpy as np  # noqa: F401  (imported before the baseline so it is part of it)


    path = Path(spec["model"])
    info = inspect_model(path, max_model_mb=1 << 20)
    names = set(info.onnx.inputs) if info.onnx is not None else set()
    known = _known_options(names, spec["input_shapes"])
    baseline = _rss_mb("VmRSS")
    start = time.perf_counter()
    model = load_model(path, providers=spec["provider"], threads=spec["threads"],
                       strict_providers=spec["provider"] != "auto", warmup=False,
                       input_shapes=known["input_shapes"] or None)
    load_ms = (time.perf_counter() - start) * 1000
    with model:
        feeds = make_inputs(model.inputs, known["input_shapes"], known["values"])
        start = time.perf_counter()
        for _ in range(spec["warmup"]):
            model.run(feeds)
        warmup_ms = (time.perf_counter() - start) * 1000
        lat: list[float] = []
        clock = time.perf_counter
        wall = clock()
        for _ in range(spec["runs"]):
            t0 = clock()
            model.run(feeds)
            lat.append((clock() - t0) * 1000)
        wall = clock() - wall
        provider, cache = model.provider, model.report.cache
    return BenchResult(
        requested=spec["provider"], threads=spec["threads"], provider=provider, load_ms=load_ms,
        warmup_ms=warmup_ms, runs=len(lat), latency_ms=summarize(lat),
        throughput=len(lat) / wall if wall > 0 else 0.0, peak_rss_mb=_rss_mb("VmHWM"),
        baseline_rss_mb=baseline, latencies=lat, cache=cache,
    )


def child_main(argv: Sequence[str]) -> int:
    """``python -m edgeinfer.bench SPEC.json``: measure one configuration, write the result."""
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(spec["out"])
    try:
        data: dict[str, Any] = {"result": _child_measure(spec).to_dict()}
        code = 0
    except EdgeInferError as exc:
        data = {"error": {"type": type(exc).__name__, "message": str(exc)}}
        code = exc.exit_code
    except Exception as exc:  # reported to the parent as a crash of this configuration
        data = {"error": {"type": "InferenceError", "message": f"{type(exc).__name__}: {exc}"}}
        code = 70
    out.write_text(json.dumps(data))
    return code
