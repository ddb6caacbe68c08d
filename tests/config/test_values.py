"""Config values that reach topics, files and the OS: names, huge numbers, credential files."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest
import yaml

from edgeinfer.config import Config, load_config, parse_config
from edgeinfer.config._yaml import MAX_CREDENTIAL_BYTES
from edgeinfer.errors import ConfigError

PIPELINE = "pipelines:\n  - name: cam\n    model: {path: m.onnx}\n    source: {type: synthetic}\n"
TOPIC_WORDS = "expected MQTT topic levels joined by '/'"
LEVEL_WORDS = "expected a name of 1 to 64 characters A-Z a-z 0-9 _ . -, not '.' or '..'"
DEVICE_WORDS = ("expected a name of 1 to 64 characters A-Z a-z 0-9 _ . -, not '.', '..', "
                "'group' or 'reply' (topic levels of their own)")
NUL_WORDS = "expected str without NUL characters"
HOST_WORDS = "expected a host name or address (no spaces or control characters)"


def refused(data: dict[str, object], path: str) -> str:
    """The loader's message for ``data`` (as YAML), checked to name ``path`` as msgspec does."""
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert(data, Config, strict=True)
    assert str(info.value).endswith(f" - at `{path}`")
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(data), source="c.yaml")
    message = str(err.value)
    assert f": {path}: " in message
    return message.split(f"{path}: ", 1)[1]


@pytest.mark.parametrize(("data", "path", "problem"), [
    ({"mqtt": {"client_id": "dev\x00ice"}}, "$.mqtt.client_id",
     "expected str without control characters"),
    ({"mqtt": {"client_id": "dev\n"}}, "$.mqtt.client_id",
     "expected str without control characters"),
    ({"mqtt": {"client_id": ""}}, "$.mqtt.client_id", "expected str of length >= 1"),
    ({"mqtt": {"client_id": "x" * 129}}, "$.mqtt.client_id", "expected str of length <= 128"),
    ({"mqtt": {"username": "a\x00"}}, "$.mqtt.username", "expected str without control"),
    ({"mqtt": {"prefix": "edge\ninfer"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "edgeinfer\n"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "a\x00b"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "site/"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "/site"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "a//b"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "a/+/b"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "#"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": "$SYS"}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"prefix": ""}}, "$.mqtt.prefix", TOPIC_WORDS),
    ({"mqtt": {"homeassistant": {"prefix": "ha\n"}}}, "$.mqtt.homeassistant.prefix", TOPIC_WORDS),
    ({"device_id": ".."}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "group"}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "reply"}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "."}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "a/b"}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "a+"}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "pi\n"}, "$.device_id", DEVICE_WORDS),
    ({"device_id": ""}, "$.device_id", DEVICE_WORDS),
    ({"device_id": "x" * 65}, "$.device_id", DEVICE_WORDS),
    ({"mqtt": {"host": ""}}, "$.mqtt.host", HOST_WORDS),
    ({"mqtt": {"host": "broker local"}}, "$.mqtt.host", HOST_WORDS),
    ({"mqtt": {"host": "broker\n"}}, "$.mqtt.host", HOST_WORDS),
    ({"mqtt": {"host": "b\x00"}}, "$.mqtt.host", HOST_WORDS),
    ({"metrics": {"host": ""}}, "$.metrics.host", HOST_WORDS),
    ({"mqtt": {}, "ota": {"allow_unsigned": True, "groups": [".."]}}, "$.ota.groups[0]",
     LEVEL_WORDS),
    ({"pipelines": [{"name": "cam\n", "model": {"path": "m"}, "source": {"type": "synthetic"}}]},
     "$.pipelines[0].name", "expected a name of 1 to 64 characters A-Z a-z 0-9 _ -"),
    ({"pipelines": [{"name": "c", "model": {"path": "m"},
                     "source": {"type": "mqtt", "topic": "s/\x00"}}]},
     "$.pipelines[0].source.topic", "expected str without control characters"),
    # The OS takes no NUL in a path or an argument ("embedded null byte" at run time).
    ({"pipelines": [{"name": "c", "model": {"path": "m\x00.onnx"},
                     "source": {"type": "synthetic"}}]},
     "$.pipelines[0].model.path", NUL_WORDS),
    ({"pipelines": [{"name": "c", "model": {"path": "m"},
                     "source": {"type": "audio", "command": ["arecord", "-D\x00"]}}]},
     "$.pipelines[0].source.command[1]", NUL_WORDS),
    ({"pipelines": [{"name": "c", "model": {"path": "m"},
                     "source": {"type": "camera", "uri": "/dev/video0\x00"}}]},
     "$.pipelines[0].source.uri", NUL_WORDS),
    ({"pipelines": [{"name": "c", "model": {"path": "m"}, "source": {"type": "synthetic"},
                     "sinks": [{"type": "jsonl", "path": "r\x00.jsonl"}]}]},
     "$.pipelines[0].sinks[0].path", NUL_WORDS),
    ({"runtime": {"state_dir": "/var/lib/\x00"}}, "$.runtime.state_dir", NUL_WORDS),
    ({"mqtt": {"tls": {"ca_file": "ca\x00.pem"}}}, "$.mqtt.tls.ca_file", NUL_WORDS),
    ({"mqtt": {"outbox": {"path": "o\x00.db"}}}, "$.mqtt.outbox.path", NUL_WORDS),
    ({"mqtt": {"tls": {"ca_file": ""}}}, "$.mqtt.tls.ca_file", "expected str of length >= 1"),
])
def test_unsafe_strings_are_refused_in_words(data: dict[str, object], path: str,
                                             problem: str) -> None:
    assert refused(data, path).startswith(problem)


@pytest.mark.parametrize("data", [
    {"device_id": "cam-01.local"},
    {"device_id": "..."},
    {"mqtt": {"prefix": "site a/edgeinfer", "client_id": "capteur-é", "host": "::1"}},
    {"mqtt": {"host": "broker.example.com", "homeassistant": {"prefix": "homeassistant"}}},
    {"mqtt": {"username": ""}},
    {"pipelines": [{"name": "c", "model": {"path": "m"},
                    "source": {"type": "mqtt", "topic": "sensors/+/temp"}}]},
])
def test_ordinary_strings_pass(data: dict[str, object]) -> None:
    msgspec.convert(data, Config, strict=True)
    parse_config(yaml.safe_dump(data))


def test_device_id_from_an_odd_hostname_is_still_a_safe_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "..")
    assert Config().resolved_device_id() == "edgeinfer"
    monkeypatch.setattr(socket, "gethostname", lambda: "pi-kitchen.lan")  # no dot in topics
    assert Config().resolved_device_id() == "pi-kitchen"
    monkeypatch.setattr(socket, "gethostname", lambda: "reply")
    assert Config().resolved_device_id() == "edgeinfer"
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 100)
    assert Config().resolved_device_id() == "h" * 64


# --- numbers too long for int() ---------------------------------------------------------------

DIGITS = "9" * 5000


def test_a_5000_digit_integer_is_a_config_error_with_its_line() -> None:
    text = PIPELINE + f"    queue_size: {DIGITS}\n"

    with pytest.raises(ConfigError) as info:
        parse_config(text, source="c.yaml")

    assert str(info.value) == (
        f"c.yaml:5: $.pipelines[0].queue_size: number too long "
        f"(more than {sys.get_int_max_str_digits()} digits)"
    )


def test_a_5000_digit_mapping_key_is_a_config_error() -> None:
    # Explicit ("? key"): YAML allows an implicit key of at most 1024 characters.
    text = PIPELINE + f"    sinks:\n      - type: stdout\n        ? {DIGITS}\n        : 1\n"

    with pytest.raises(ConfigError, match=r"^c.yaml:7: \$.pipelines\[0\].sinks\[0\]: "
                                          r"number too long"):
        parse_config(text, source="c.yaml")


def test_a_5000_digit_integer_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EI_QUEUE", DIGITS)

    with pytest.raises(ConfigError) as info:
        parse_config(PIPELINE + "    queue_size: ${EI_QUEUE}\n", source="c.yaml")

    assert str(info.value).startswith("c.yaml:5: $.pipelines[0].queue_size: number too long")


@pytest.mark.parametrize(("value", "problem"), [
    ("-1e-300", "expected float >= 0.0"),  # typed as YAML would after substitution
    ("inf", "expected float, got str"),  # not a YAML 1.2 float: stays a string
    ("1" + "0" * 400, ""),  # an int too large for a float (msgspec's words vary by version)
])
def test_numbers_from_the_environment_are_range_checked(
    monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("EI_FPS", value)
    text = PIPELINE + "    emit:\n      min_interval_s: ${EI_FPS}\n"

    with pytest.raises(ConfigError) as info:
        parse_config(text, source="c.yaml")

    assert str(info.value).startswith(f"c.yaml:6: $.pipelines[0].emit.min_interval_s: {problem}")


def test_an_impossible_yaml_date_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("device_id: 2020-13-45\n", source="c.yaml")

    assert str(info.value) == (
        "c.yaml:1: $.device_id: invalid value '2020-13-45': month must be in 1..12"
    )


def test_a_huge_hexadecimal_number_is_refused_by_its_range() -> None:
    text = PIPELINE + f"    queue_size: 0x{'f' * 5000}\n"

    with pytest.raises(ConfigError, match=r"^c.yaml:5: \$.pipelines\[0\].queue_size: expected "
                                          r"int <= 64$"):
        parse_config(text, source="c.yaml")


# --- credentials: regular files of bounded size only -------------------------------------------


def credential_error(creds: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Load a config reading ``${credential:pw}`` in a thread, so a blocking read fails the test
    instead of hanging it."""
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    outcome: list[BaseException | Config] = []

    def load() -> None:
        try:
            outcome.append(parse_config("mqtt: {password: '${credential:pw}'}\n", source="c.yaml"))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(60)
    assert outcome, "reading the credential blocked"
    (result,) = outcome
    assert isinstance(result, ConfigError), result
    return str(result)


def test_a_fifo_credential_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(tmp_path / "pw")

    message = credential_error(tmp_path, monkeypatch)

    assert message == (f"c.yaml:1: $.mqtt.password: credential file {tmp_path / 'pw'} is a FIFO; "
                       "a credential must be a regular file")


def test_a_directory_credential_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").mkdir()

    assert "is a directory; a credential must be a regular file" in credential_error(
        tmp_path, monkeypatch)


def test_a_device_credential_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").symlink_to("/dev/null")  # (/dev/zero would be an endless read)

    assert "is a character device; a credential must be a regular file" in credential_error(
        tmp_path, monkeypatch)


def test_a_credential_over_64_kib_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").write_bytes(b"x" * (MAX_CREDENTIAL_BYTES + 1))

    message = credential_error(tmp_path, monkeypatch)

    assert message.endswith(f"credential file {tmp_path / 'pw'} is larger than 64 KiB")


def test_a_credential_of_64_kib_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").write_bytes(b"x" * (MAX_CREDENTIAL_BYTES - 1) + b"\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))

    config = parse_config("mqtt: {password: '${credential:pw}'}\n")

    assert config.mqtt is not None and config.mqtt.password == "x" * (MAX_CREDENTIAL_BYTES - 1)


# --- the CLI verb ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("fps", "problem"), [
    ("1.0e-300", "expected float >= 0.01"),
    ("${EI_FPS}", "expected float >= 0.01"),
    (".inf", "expected float <= 1000.0"),
])
def test_validate_config_refuses_a_bad_fps_as_a_config_error(
    tmp_path: Path, fps: str, problem: str
) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(PIPELINE.replace("{type: synthetic}", f"\n      type: synthetic\n      fps: {fps}"))

    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(file)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EI_FPS": "1e-300"})

    assert proc.returncode == 78, proc.stderr  # EX_CONFIG, not 70 (an internal error)
    assert f"{file}:6: $.pipelines[0].source.fps: {problem}" in proc.stderr


def test_load_config_refuses_a_5000_digit_integer(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(PIPELINE + f"    queue_size: {DIGITS}\n")

    with pytest.raises(ConfigError, match="number too long"):
        load_config(file)
