"""The command line as a user runs it: real subprocesses, exit codes per error class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.testing import onnx_models as om


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())


@pytest.mark.arm64
def test_help_imports_no_runtime() -> None:
    code = ("import sys\nfrom edgeinfer.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('onnxruntime', 'cv2', 'ai_edge_litert', 'tflite_runtime', "
            "'numpy', 'msgspec') if m in sys.modules]\nprint('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "usage: edgeinfer" in out.stdout
    assert "HEAVY []" in out.stdout


def test_every_verbs_help_imports_no_runtime() -> None:
    # Each verb's options are described next to its handler, in modules `--help` imports: every
    # verb's help works and, like the top one, loads no runtime (handlers import those).
    code = ("import contextlib, io, sys\nfrom edgeinfer.cli import VERBS, main\n"
            "argvs = [[v, '--help'] for v in VERBS] + [['models', a, '--help'] for a in "
            "('list', 'pull')]\n"
            "for argv in argvs:\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        try:\n            main(argv)\n"
            "        except SystemExit as exc:\n            assert exc.code == 0, (argv, exc.code)\n"
            "    usage = 'usage: edgeinfer ' + ' '.join(argv[:-1]) + ' [-h]'\n"
            "    assert out.getvalue().startswith(usage), (usage, out.getvalue()[:80])\n"
            "print('HELPS', len(argvs))\n"
            "heavy = [m for m in ('onnxruntime', 'cv2', 'ai_edge_litert', 'tflite_runtime', "
            "'openvino', 'numpy', 'msgspec', 'aiohttp', 'psycopg') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HELPS 17" in out.stdout  # the 15 verbs and `models list`/`models pull`
    assert "HEAVY []" in out.stdout


def test_no_verb_prints_help_and_exits_2() -> None:
    r = cli()
    assert r.returncode == 2 and "COMMAND" in r.stdout


def test_info_json_on_a_real_model(yolo_path: Path) -> None:
    r = cli("info", str(yolo_path), "--json", "--threads", "1",
            "--input-shape", "images=1,3,320,320")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    selection = info["session"]["selection"]  # measured (or the run's cached decision)
    assert info["provider"] == selection["provider"] and info["fallbacks"] == []
    assert [c for c in selection["candidates"] if c["status"] == "picked"][0]["label"] == \
        selection["picked"]
    assert all(c["choice"]["threads"] == 1 for c in selection["candidates"])  # --threads caps
    assert info["inputs"][0] == {"name": "images", "shape": [1, 3, 320, 320], "dtype": "float32"}
    assert info["outputs"][0]["shape"] == [1, 22, 2100]
    assert info["opset"] == 17 and info["quantization"] == "float"
    assert info["sha256"] == "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"
    assert info["session"]["warmed_up"] is True


def test_info_human_output_names_fallbacks(tmp_path: Path) -> None:
    r = cli("info", str(om.qdq_matmul_model(tmp_path / "q.onnx")), "--providers", "cuda,cpu")
    assert r.returncode == 0, r.stderr
    assert "int8-qdq" in r.stdout
    assert "fallback      CUDAExecutionProvider: not available" in r.stdout


@pytest.mark.parametrize(
    ("setup", "code", "phrase"),
    [
        (lambda d: d / "absent.onnx", 66, "model file not found"),
        (lambda d: (d / "t.onnx").write_text("hello") and d / "t.onnx", 65, "text file"),
        (lambda d: d, 66, "not a file"),
    ],
)
def test_bad_models_exit_with_their_code_and_one_line(tmp_path: Path, setup, code, phrase) -> None:
    r = cli("info", str(setup(tmp_path)))
    assert r.returncode == code
    assert phrase in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.startswith("edgeinfer: error: ")


def test_strict_provider_fallback_exit_code(tmp_path: Path) -> None:
    r = cli("info", str(om.add_model(tmp_path / "a.onnx")), "--providers", "tensorrt",
            "--strict-providers")
    assert r.returncode == 69 and "strict_providers" in r.stderr


def test_bad_input_shape_option(tmp_path: Path) -> None:
    r = cli("info", str(om.add_model(tmp_path / "a.onnx")), "--input-shape", "x:1,4")
    assert r.returncode == 78 and "NAME=D1,D2" in r.stderr


def test_memory_limit_exit_code(yolo_path: Path) -> None:
    r = cli("info", str(yolo_path), "--memory-limit-mb", "1", "--input-shape",
            "images=1,3,320,320")
    assert r.returncode == 71 and "memory_limit_mb=1" in r.stderr


def test_providers_json_and_table() -> None:
    r = cli("providers", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "CPUExecutionProvider" in data["onnxruntime"]["available"]
    assert data["onnxruntime"]["auto_order"][-1] == "CPUExecutionProvider"
    assert data["platform"]["machine"]
    assert data["litert"]["installed"] is True
    table = cli("providers")
    assert table.returncode == 0 and "auto order" in table.stdout


def test_models_list_names_every_example() -> None:
    r = cli("models", "list")
    assert r.returncode == 0
    for name in ("nudenet-320n", "blazeface", "silero-vad"):
        assert name in r.stdout


def test_validate_config_ok_and_error_with_path_and_line(tmp_path: Path) -> None:
    ok = cli("validate-config", "configs/example.yaml")
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelines:\n  - name: cam\n    model:\n      path: m.onnx\n      threads: two\n")
    r = cli("validate-config", str(bad))
    assert r.returncode == 78
    assert "bad.yaml:5: $.pipelines[0].model.threads: expected int, got str" in r.stderr
    assert "Traceback" not in r.stderr


def test_validate_config_recognizes_a_collector_config(tmp_path: Path) -> None:
    # It read collect.yaml as a device config: "$.database: unknown field".
    ok = cli("validate-config", "configs/collect.yaml")
    assert ok.returncode == 0 and "OK (collector: mqtt" in ok.stdout, ok.stderr
    secret = tmp_path / "c.yaml"
    secret.write_text("source: {type: nats, servers: [nats://127.0.0.1:4222], password: s3}\n"
                      "database: {dsn: 'postgresql://x@db/fleet', password: pw}\n")
    shown = cli("validate-config", "--json", str(secret))
    assert shown.returncode == 0 and "s3" not in shown.stdout and "pw" not in shown.stdout
    assert json.loads(shown.stdout)["source"]["servers"] == ["nats://127.0.0.1:4222"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("database: {dsn: x}\nsource: {type: mqtt, tls: {ca: /ca.crt}}\n")
    r = cli("validate-config", str(bad))
    assert r.returncode == 78 and "$.source.tls.ca: unknown field" in r.stderr, r.stderr
    forced = cli("validate-config", "--kind", "collect", "configs/example.yaml")
    assert forced.returncode == 78 and "valid: database, source" in forced.stderr


def test_the_public_api_names_of_the_readme_and_architecture_resolve_lazily() -> None:
    """README's tour calls ``edgeinfer.Pipeline.from_config(...)``; it was missing from the
    package (``module 'edgeinfer' has no attribute 'Pipeline'``). Still nothing heavy is
    imported until a name is used."""
    code = ("import sys, edgeinfer\n"
            "heavy = [m for m in ('onnxruntime', 'cv2', 'numpy') if m in sys.modules]\n"
            "names = [n for n in ('load_model', 'Model', 'Pipeline', 'load_config', "
            "'ConfigError') if not hasattr(edgeinfer, n)]\n"
            "print('HEAVY', heavy, 'MISSING', names, callable(edgeinfer.Pipeline.from_config))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip() == "HEAVY [] MISSING [] True", proc.stdout + proc.stderr


def test_validate_config_refuses_an_unknown_decoder_without_a_model(tmp_path: Path) -> None:
    """A misspelt decoder is a config error (exit 78 naming the path and the valid names), not
    a config that "validates" and fails when the device starts it."""
    config = tmp_path / "p.yaml"
    config.write_text("pipelines:\n  - name: a\n    source: {type: synthetic}\n"
                      "    model: {path: nowhere.onnx}\n    task: {type: detect, decoder: yolo}\n")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 78, done
    assert "$.pipelines[0].task.decoder: unknown decoder 'yolo'; valid: auto," in done.stderr


def test_info_task_says_which_decoder_reads_the_model_and_why(yolo_path: Path) -> None:
    """`info --task detect` names the decoder auto picks, why, and where the labels come from;
    a task the model does not fit is refused with the reason (exit 65)."""
    run = [sys.executable, "-m", "edgeinfer", "info", str(yolo_path), "--no-probe", "--json"]
    done = subprocess.run([*run, "--task", "detect"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    task = json.loads(done.stdout)["task"]
    assert (task["type"], task["decoder"], task["classes"]) == ("detect", "yolov8", 18)
    assert "metadata" in task["labels_from"] and "fits output0 [1, 22, 2100]" in task["why"]
    done = subprocess.run([*run, "--task", "pose"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 65, done
    assert "use task: {type: detect}, not pose" in json.loads(done.stdout)["task"]["refused"]
