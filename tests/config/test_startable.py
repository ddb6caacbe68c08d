"""validate-config reports configs that cannot start; `run` refuses them with the same words.

Before, `validate-config` said OK for a missing model, a directory as the model, a missing OTA
key file and `pipelines: []`, and only `run` failed (on the model, with another message).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.cli import main

PIPELINE = ("pipelines:\n  - name: a\n    source: {type: synthetic}\n"
            "    model: {path: MODEL}\n    task: {type: classify}\n    sinks: [{type: stdout}]\n")


def _config(tmp_path: Path, model: str, extra: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(extra + PIPELINE.replace("MODEL", model))
    return path


def _cases(tmp_path: Path, yolo_path: Path) -> dict[str, tuple[Path, str]]:
    empty = tmp_path / "empty.yaml"
    empty.write_text("pipelines: []\n")
    (tmp_path / "o").mkdir()
    ota = _config(tmp_path / "o", str(yolo_path),
                  "mqtt: {host: 127.0.0.1, port: 9}\nota: {trusted_keys: [missing.pub]}\n")
    return {
        "missing": (_config(tmp_path, "nope.onnx"), f"model file not found: {tmp_path}/nope.onnx"),
        "empty": (empty, "$.pipelines: no pipelines"),
        "ota": (ota, f"$.ota.trusted_keys[0]: key file not found: {tmp_path}/o/missing.pub"),
    }


@pytest.mark.parametrize("case", ["missing", "empty", "ota", "directory"])
def test_validate_config_warns_by_default_and_fails_with_strict(
        case: str, tmp_path: Path, yolo_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if case == "directory":
        (tmp_path / "adir").mkdir()
        path, words = _config(tmp_path, "adir"), f"{tmp_path}/adir is a directory"
    else:
        path, words = _cases(tmp_path, yolo_path)[case]
    assert main(["validate-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "OK" not in out and "not startable here" in out
    assert "cannot start here" in err and "warning: " in err and words in err, err
    assert main(["validate-config", "--strict", str(path)]) == 78
    _, err = capsys.readouterr()
    assert "error: " in err and words in err, err


def test_validate_config_strict_passes_a_startable_config(
        tmp_path: Path, yolo_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate-config", "--strict", str(_config(tmp_path, str(yolo_path)))]) == 0
    assert "OK" in capsys.readouterr().out


def test_an_example_model_name_not_yet_fetched_is_no_problem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `run` pulls it: an empty models cache is no reason to refuse the config
    monkeypatch.setenv("EDGEINFER_MODELS", str(tmp_path / "no-models"))
    assert main(["validate-config", "--strict", str(_config(tmp_path, "nudenet-320n"))]) == 0


def test_run_refuses_with_the_same_message_and_exit_78(tmp_path: Path, yolo_path: Path) -> None:
    path, words = _cases(tmp_path, yolo_path)["ota"]
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "run", "-c", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 78, proc.stderr
    assert "cannot start" in proc.stderr and words in proc.stderr, proc.stderr


@pytest.mark.parametrize(("source", "words", "waits"), [
    ("{type: camera, uri: /dev/video9}", "$.pipelines[0].source.uri: pipeline 'a': no such "
     "device /dev/video9: is the camera plugged in? `ls /dev/video*`", True),
    ("{type: camera, uri: '9'}", "no such device /dev/video9: is the camera plugged in?", True),
    ("{type: serial, port: /dev/ttyNOPE0}", "$.pipelines[0].source.port: pipeline 'a': no such "
     "device /dev/ttyNOPE0: is the sensor plugged in?", True),
    ("{type: video, uri: DIR/gone.mp4}", "$.pipelines[0].source.uri: pipeline 'a': no such "
     "video file: DIR/gone.mp4", False),
    ("{type: images, uri: DIR/nothing}", "no such folder or image file: DIR/nothing", False),
])
def test_validate_config_warns_about_a_source_that_is_not_here(
        source: str, words: str, waits: bool, tmp_path: Path, yolo_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """As for a model: a video file or a device path that does not exist is named. A device is
    only waited for (the pipeline starts and retries), so `run` starts; a missing file keeps
    its pipeline from starting, and with it the only pipeline, `run` (which exits 78 then)."""
    path = _config(tmp_path, str(yolo_path))
    path.write_text(path.read_text().replace("{type: synthetic}",
                                             source.replace("DIR", str(tmp_path))))
    assert main(["validate-config", str(path)]) == 0
    out, err = capsys.readouterr()
    words = words.replace("DIR", str(tmp_path))
    assert "OK" not in out and words in err and "warning: $.pipelines[0].source." in err, err
    head = "some devices it reads are missing here" if waits else "cannot start here"
    assert head in err, err
    assert main(["validate-config", "--strict", str(path)]) == 78
    from edgeinfer.config import load_config
    from edgeinfer.daemon.startable import start_problems

    assert [p.fatal for p in start_problems(load_config(str(path)))] == [not waits]
