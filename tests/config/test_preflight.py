"""`validate-config` and `run` share one check (`edgeinfer.daemon.startable.start_problems`):
everything `run` refuses before it opens a device, `validate-config` reports the same way.

Before, they disagreed (issue 30, item 10): docs/analytics.md's example (an mqtt sink, no
`mqtt:` section) was "valid" and `run` exited 78 after loading the model;
configs/audio-vad.yaml was "OK" and `run` failed (`arecord is not installed`); configs/demo.yaml
and the README's config warned about a missing `demo.mp4` (and `--strict` exited 78) while
`run` played the demo clip.
"""

from __future__ import annotations

import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from edgeinfer.cli import main
from edgeinfer.sources.cameras import pyav_available

ROOT = Path(__file__).resolve().parents[2]


def _validate(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    code = main(["validate-config", *flags, str(path)])
    out, err = capsys.readouterr()
    return code, out + err


def _run(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", "-c", str(path)])
    out, err = capsys.readouterr()
    return code, out + err


def _refusal(text: str) -> str:
    """The problem `run` names in ``edgeinfer: error: FILE: cannot start: <problem>``."""
    match = re.search(r"cannot start: (.*)", text)
    assert match, f"`run` did not refuse before it opened anything:\n{text}"
    return match[1]


def _no_path_for(program: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH on which ``program`` is not, whether or not this machine has it."""
    bare = tmp_path / "bin"
    bare.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(bare))
    assert shutil.which(program) is None


def test_the_analytics_docs_example_without_an_mqtt_section_is_refused_by_both(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The block as it was: `validate-config` said "valid", `run` exited 78 after loading the
    model (`an mqtt sink needs the mqtt: section`). Now both refuse it, before any model."""
    text = (ROOT / "docs" / "analytics.md").read_text()
    block = re.findall(r"^```yaml\n(.*?)^```$", text, re.M | re.S)[0]
    assert "sinks: [{type: mqtt}]" in block and block.startswith("mqtt:")  # the doc shows it
    path = tmp_path / "door.yaml"
    path.write_text(block.split("\n", 1)[1])  # without its mqtt: line, as it was
    code, said = _validate(path, capsys)
    words = ("$.pipelines[0].sinks[0]: pipeline 'door': the mqtt sink needs the mqtt: section: "
             "add one at the top level (`mqtt: {host: 127.0.0.1}`")
    assert code == 78 and words in said, said
    code, ran = _run(path, capsys)
    assert code == 78 and words in _refusal(ran), ran
    assert "loaded" not in ran, ran  # refused before the model loads


def test_audio_vad_without_its_recorder_is_refused_by_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """configs/audio-vad.yaml was "OK" where `arecord` is missing, and `run` failed on it."""
    _no_path_for("arecord", tmp_path, monkeypatch)
    path = ROOT / "configs" / "audio-vad.yaml"
    words = ("$.pipelines[0].source.command: pipeline 'voice': arecord is not installed or not "
             "on PATH (apt install alsa-utils)")
    code, said = _validate(path, capsys)
    assert code == 0 and "OK" not in said and f"warning: {words}" in said, said
    code, said = _validate(path, capsys, "--strict")
    assert code == 78 and f"error: {words}" in said, said
    code, ran = _run(path, capsys)
    assert code == 78 and _refusal(ran) == words, ran


@pytest.mark.parametrize("where", ["configs/demo.yaml", "README.md"])
def test_a_missing_demo_mp4_is_the_demo_clip_for_both(
        where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`run` plays the demo clip for a missing `demo.mp4` (tests/test_demo_config.py runs it);
    `validate-config` warned that the file is missing and `--strict` exited 78."""
    if where == "README.md":
        text = (ROOT / "README.md").read_text()
        config = next(b for b in re.findall(r"^```yaml\n(.*?)^```$", text, re.M | re.S)
                      if "uri: demo.mp4" in b and "pipelines:" in b)
    else:
        config = (ROOT / where).read_text()
    path = tmp_path / "config.yaml"  # no demo.mp4 beside it
    path.write_text(config)
    assert not (tmp_path / "demo.mp4").exists()
    code, said = _validate(path, capsys, "--strict")
    assert code == 0 and "OK" in said and "demo.mp4" not in said, said


PIPELINE = ("  - name: a\n    source: SOURCE\n    model: {path: MODEL}\n"
            "    task: TASK\n    sinks: SINKS\n")


def _bad_configs(tmp_path: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """Configs `run` refuses before it opens anything: (top-level text, pipeline fields)."""
    return {
        "mqtt sink without an mqtt section": ("", {"SINKS": "[{type: mqtt}]"}),
        "mqtt source without an mqtt section": (
            "", {"SOURCE": "{type: mqtt, topic: sensors/x}", "TASK": "{type: raw}"}),
        "unknown decoder": ("", {"TASK": "{type: detect, decoder: yolo}"}),
        "a zone outside the frame the source delivers": (
            "", {"SOURCE": "{type: synthetic, width: 320, height: 240}",
                 "TASK": "{type: detect}\n    zones: [{name: z, coordinates: pixels, "
                         "points: [[0, 0], [400, 0], [400, 200]]}]"}),
        "audio recorder not installed": (
            "", {"SOURCE": "{type: audio, command: arecord -q -t raw -f S16_LE -r 16000}"}),
        "picamera2 not installed": ("", {"SOURCE": "{type: picamera2}"}),
        "PyAV not installed for a camera that needs it": (
            "", {"SOURCE": "{type: camera, uri: 'rtsp://127.0.0.1:9/main', "
                           "detect_uri: 'rtsp://127.0.0.1:9/sub'}"}),
        "missing video file": ("", {"SOURCE": f"{{type: video, uri: {tmp_path}/gone.mp4}}"}),
        "missing model file": ("", {"MODEL": f"{tmp_path}/gone.onnx"}),
        "missing labels file": ("", {"TASK": f"{{type: detect, labels: {tmp_path}/gone.txt}}"}),
        "missing OTA key": ("mqtt: {host: 127.0.0.1, port: 9}\n"
                            f"ota: {{trusted_keys: [{tmp_path}/gone.pub]}}\n", {}),
        "missing TLS file": (f"mqtt: {{host: 127.0.0.1, port: 9, tls: {{ca_file: "
                             f"{tmp_path}/gone.pem}}}}\n", {}),
        "no pipelines": ("", {"NONE": ""}),
        "embedded broker with TLS": (f"mqtt: {{embedded: true, port: 9, tls: {{ca_file: "
                                     f"{ROOT}/README.md}}}}\n", {}),
        "embedded broker off loopback without a password": (
            "mqtt: {embedded: true, host: 0.0.0.0, port: 9}\n", {}),
        "signed commands without OTA keys": (
            "mqtt: {host: 127.0.0.1, port: 9, commands: {signed: [reload]}}\n", {}),
    }


@pytest.mark.parametrize("case", [
    "mqtt sink without an mqtt section", "mqtt source without an mqtt section", "unknown decoder",
    "a zone outside the frame the source delivers", "audio recorder not installed",
    "picamera2 not installed", "PyAV not installed for a camera that needs it",
    "missing video file", "missing model file", "missing labels file",
    "missing OTA key",
    "missing TLS file", "no pipelines", "embedded broker with TLS",
    "embedded broker off loopback without a password", "signed commands without OTA keys"])
def test_every_refusal_of_run_is_made_by_validate_config_in_the_same_words(
        case: str, tmp_path: Path, yolo_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> None:
    """The guard of the shared path: over a table of configs `run` cannot start, `run` refuses
    each before it opens anything (no model loaded), and `validate-config --strict` refuses it
    with the same words (without `--strict` too, when it is wrong on any machine)."""
    if case == "picamera2 not installed" and find_spec("picamera2") is not None:
        pytest.skip("picamera2 is installed here")
    _no_path_for("arecord", tmp_path, monkeypatch)
    if case.startswith("PyAV"):  # as if not installed (how tests/mqtt/test_embedded.py does it)
        monkeypatch.setitem(sys.modules, "av", None)
        pyav_available.cache_clear()
        request.addfinalizer(pyav_available.cache_clear)
    top, fields = _bad_configs(tmp_path)[case]
    pipeline = PIPELINE
    for key, default in {"SOURCE": "{type: synthetic, frames: 3}", "MODEL": str(yolo_path),
                         "TASK": "{type: detect}", "SINKS": "[{type: stdout}]"}.items():
        pipeline = pipeline.replace(key, fields.get(key, default))
    path = tmp_path / "c.yaml"
    path.write_text(top + ("pipelines: []\n" if "NONE" in fields else "pipelines:\n" + pipeline))
    code, ran = _run(path, capsys)
    assert code == 78, ran
    refused = _refusal(ran)
    assert "loaded" not in ran, ran  # before any model
    code, said = _validate(path, capsys, "--strict")
    assert code == 78 and refused in said, (refused, said)
    code, said = _validate(path, capsys)
    if code == 78:  # wrong on any machine
        assert f"{path}: {refused}" in said, said
    else:  # only here: a warning, never "OK"
        assert code == 0 and f"warning: {refused}" in said and "OK" not in said, said


def test_the_daemon_leaves_a_pipeline_out_with_validate_configs_words(
        tmp_path: Path, yolo_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Of two pipelines, the one `validate-config` refuses is left out by `run` with the same
    words, before its model loads (it said `an mqtt sink needs the mqtt: section` after
    loading it); the other runs to its end."""
    path = tmp_path / "two.yaml"
    path.write_text("pipelines:\n" + "".join(
        PIPELINE.replace("name: a", f"name: {name}").replace("SOURCE", "{type: synthetic, "
                                                                       "frames: 3}")
        .replace("MODEL", str(yolo_path)).replace("TASK", "{type: detect}")
        .replace("SINKS", sinks) for name, sinks in (("good", "[]"), ("bad", "[{type: mqtt}]"))))
    code, said = _validate(path, capsys)
    words = "$.pipelines[1].sinks[0]: pipeline 'bad': the mqtt sink needs the mqtt: section"
    assert code == 78 and words in said, said
    code, ran = _run(path, capsys)
    assert code == 0, ran
    assert re.search(r"good: 3 frames", ran), ran
    assert f"bad: not started: {words}" in ran, ran
