"""edgeinfer.config: typed structs, the YAML loader, substitution and error messages."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import msgspec
import pytest

from edgeinfer import paths
from edgeinfer.config import (
    Config,
    DelegateConfig,
    LoggingConfig,
    ModelConfig,
    PipelineConfig,
    RuntimeConfig,
    config_schema,
    load_config,
    parse_config,
)
from edgeinfer.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
pipelines:
  - name: cam
    model:
      path: models/320n.onnx
"""


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    file = tmp_path / name
    file.write_text(textwrap.dedent(text), encoding="utf-8")
    return file


def config_error(tmp_path: Path, text: str) -> str:
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    return str(info.value)


# --- valid configs ----------------------------------------------------------------------------


def test_minimal_config_gets_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))

    assert config.device_id is None
    assert config.runtime == RuntimeConfig()
    assert config.runtime.max_model_mb == 512.0
    assert config.runtime.memory_budget_mb is None
    assert config.runtime.optimized_model_cache is True
    assert config.logging == LoggingConfig(level="info")
    (pipeline,) = config.pipelines
    assert isinstance(pipeline, PipelineConfig)
    assert pipeline.name == "cam"
    assert (pipeline.source, pipeline.task, pipeline.sinks) == (None, None, [])
    model = pipeline.model
    assert isinstance(model, ModelConfig)
    assert model.providers == "auto"
    assert model.threads is None
    assert model.isolation == "none"
    assert model.arena == "bounded"
    assert model.input_shapes == {} and model.delegates == []
    assert model.warmup is True and model.probe is False and model.strict_providers is False


def test_full_config_round_trips_into_typed_structs(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """\
            device_id: pi-kitchen.01
            runtime:
              memory_budget_mb: 768
              max_model_mb: 64.5
              state_dir: /var/lib/edgeinfer
              cache_dir: cache
              optimized_model_cache: false
            pipelines:
              - name: front_door
                model:
                  path: /opt/models/det.onnx
                  name: det
                  version: "2.1"
                  providers: [tensorrt, cuda, cpu]
                  threads: 4
                  memory_limit_mb: 256
                  isolation: process
                  strict_providers: true
                  probe: true
                  input_shapes: {images: [1, 3, 320, 320]}
                  arena: "off"
                  delegates:
                    - library: libedgetpu.so.1
                      options: {device: usb}
                  warmup: false
                  max_model_mb: 32
                source: {type: camera, device: 0}
                task: {type: detect}
                sinks: [{type: mqtt}, {type: stdout}]
            logging:
              level: debug
            """,
        )
    )

    assert config.device_id == "pi-kitchen.01"
    assert config.resolved_device_id() == "pi-kitchen.01"
    assert config.runtime == RuntimeConfig(
        memory_budget_mb=768.0,
        max_model_mb=64.5,
        state_dir="/var/lib/edgeinfer",
        cache_dir=str(tmp_path / "cache"),
        optimized_model_cache=False,
    )
    assert isinstance(config.runtime.memory_budget_mb, float)
    model = config.pipelines[0].model
    assert model.providers == ["tensorrt", "cuda", "cpu"]
    assert model.delegates == [DelegateConfig(library="libedgetpu.so.1", options={"device": "usb"})]
    assert config.pipelines[0].sinks == [{"type": "mqtt"}, {"type": "stdout"}]
    assert config.logging.level == "debug"
    assert model.load_kwargs() == {
        "providers": ["tensorrt", "cuda", "cpu"],
        "threads": 4,
        "memory_limit_mb": 256.0,
        "isolation": "process",
        "strict_providers": True,
        "probe": True,
        "input_shapes": {"images": [1, 3, 320, 320]},
        "arena": "off",
        "delegates": [{"library": "libedgetpu.so.1", "options": {"device": "usb"}}],
        "warmup": False,
        "warmup_inputs": None,
        "max_model_mb": 32.0,
        "name": "det",
        "version": "2.1",
    }


def test_load_kwargs_defaults_and_runtime_max_model_mb() -> None:
    kwargs = ModelConfig(path="/m.onnx").load_kwargs(default_max_model_mb=512.0)

    assert kwargs["input_shapes"] is None
    assert kwargs["delegates"] == []
    assert kwargs["max_model_mb"] == 512.0
    assert kwargs["providers"] == "auto"
    assert "path" not in kwargs


def test_default_device_id_and_directories() -> None:
    config = Config()

    device = config.resolved_device_id()
    assert device and set(device) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
    )
    assert config.runtime.resolved_state_dir() == paths.state_dir()
    assert config.runtime.resolved_cache_dir() == paths.cache_dir()


def test_relative_model_path_resolves_against_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "etc" / "edgeinfer"
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # not the config's folder
    config = load_config(write(folder, MINIMAL))

    assert config.pipelines[0].model.path == str(folder / "models" / "320n.onnx")


def test_model_path_behind_a_link_is_not_resolved(tmp_path: Path) -> None:
    # The model store swaps models by re-pointing a `current` link; the config must keep it.
    (tmp_path / "v1").mkdir()
    (tmp_path / "current").symlink_to(tmp_path / "v1")
    config = load_config(write(tmp_path, MINIMAL.replace("models/320n.onnx", "current/m.onnx")))

    assert config.pipelines[0].model.path == str(tmp_path / "current" / "m.onnx")


def test_parse_config_without_base_dir_uses_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    config = parse_config(MINIMAL)

    assert config.pipelines[0].model.path == str(tmp_path / "models" / "320n.onnx")


def test_yaml_merge_keys_share_model_settings(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """\
            pipelines:
              - name: a
                model: &model {path: m.onnx, threads: 2, warmup: false}
              - name: b
                model:
                  <<: *model
                  threads: 3
            """,
        )
    )

    a, b = (p.model for p in config.pipelines)
    assert (a.threads, b.threads) == (2, 3)
    assert b.warmup is False


def test_example_config_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEINFER_DEVICE_ID", raising=False)
    monkeypatch.delenv("INFER_THREADS", raising=False)

    config = load_config(REPO / "configs" / "example.yaml")

    assert config.device_id is None
    (pipeline,) = config.pipelines
    assert pipeline.model.path == str(REPO / "configs" / "models" / "320n.onnx")
    assert pipeline.model.threads == 2
    assert pipeline.model.input_shapes == {"images": [1, 3, 320, 320]}


def test_config_schema_describes_the_tree() -> None:
    schema = config_schema()

    defs = schema["$defs"]
    assert set(defs["Config"]["properties"]) == {"device_id", "runtime", "pipelines", "logging"}
    assert defs["ModelConfig"]["required"] == ["path"]
    assert defs["ModelConfig"]["additionalProperties"] is False


# --- validation errors ------------------------------------------------------------------------


def test_wrong_type_names_the_path_and_the_line(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        """\
        # comment
        pipelines:
          - name: cam
            model:
              path: m.onnx
              threads: "2"
        """,
    )
    with pytest.raises(ConfigError) as info:
        load_config(file)

    assert str(info.value) == f"{file}:6: $.pipelines[0].model.threads: expected int, got str"
    assert info.value.exit_code == 78


def test_unknown_key_is_rejected_with_its_path(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        """\
        pipelines:
          - name: cam
            model:
              path: m.onnx
              thread: 2
        """,
    )

    assert ":5: $.pipelines[0].model.thread: unknown field" in message
    assert "did you mean 'threads'?" in message


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = config_error(tmp_path, "pipelines: []\nmqtt_host: x\n")

    valid = "device_id, runtime, pipelines, logging"
    assert message.endswith(f":2: $.mqtt_host: unknown field; valid: {valid}")


@pytest.mark.parametrize(("threads", "problem"), [(0, "expected int >= 1"), (65, "<= 64")])
def test_threads_out_of_range(tmp_path: Path, threads: int, problem: str) -> None:
    message = config_error(tmp_path, MINIMAL + f"      threads: {threads}\n")

    assert ":5: $.pipelines[0].model.threads: " in message
    assert problem in message


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("memory_limit_mb", "0", "memory_limit_mb: expected float > 0.0"),
        ("max_model_mb", "-1", "max_model_mb: expected float > 0.0"),
        ("isolation", "thread", "isolation: invalid enum value 'thread'; valid: none, process"),
        ("arena", "big", "arena: invalid enum value 'big'; valid: bounded, off, default"),
        ("warmup", "'yes'", "warmup: expected bool, got str"),
        ("providers", "[cuda, 1]", "providers[1]: expected str, got int"),
        ("providers", "{a: 1}", "providers: expected str | list, got mapping"),
        ("input_shapes", "{images: [1, 0]}", "input_shapes[...][1]: expected int >= 1"),
        ("delegates", "[{options: {}}]", "delegates[0]: missing required field 'library'"),
    ],
)
def test_model_field_errors(tmp_path: Path, field: str, value: str, problem: str) -> None:
    message = config_error(tmp_path, MINIMAL + f"      {field}: {value}\n")

    assert message == f"{tmp_path / 'config.yaml'}:5: $.pipelines[0].model.{problem}"


def test_missing_required_field_points_at_the_mapping(tmp_path: Path) -> None:
    message = config_error(tmp_path, "pipelines:\n  - name: cam\n    model:\n      threads: 2\n")

    assert message.endswith(":3: $.pipelines[0].model: missing required field 'path'")


@pytest.mark.parametrize("name", ["cam 1", "a/b", "front+door", "", "x" * 65, "caméra"])
def test_bad_pipeline_name(tmp_path: Path, name: str) -> None:
    message = config_error(tmp_path, MINIMAL.replace("name: cam", f"name: '{name}'"))

    assert ":2: $.pipelines[0].name: expected str matching regex" in message


def test_pipeline_name_with_trailing_newline(tmp_path: Path) -> None:
    text = "pipelines:\n  - name: |\n      cam\n    model: {path: m.onnx}\n"

    message = config_error(tmp_path, text)

    assert ":2: $.pipelines[0]: name must not contain a newline" in message


def test_bad_device_id(tmp_path: Path) -> None:
    message = config_error(tmp_path, "device_id: kitchen/pi\n")

    assert ":1: $.device_id: expected str matching regex" in message


def test_duplicate_pipeline_names(tmp_path: Path) -> None:
    message = config_error(tmp_path, MINIMAL + MINIMAL.removeprefix("pipelines:\n"))

    assert message.endswith(
        ":5: $.pipelines[1].name: duplicate pipeline name 'cam'"
        " (first at $.pipelines[0].name, line 2)"
    )


def test_duplicate_pipeline_names_in_python() -> None:
    model = ModelConfig(path="m.onnx")
    with pytest.raises(msgspec.ValidationError, match="duplicate pipeline name 'cam'"):
        msgspec.convert(
            {"pipelines": [{"name": "cam", "model": {"path": "a"}}] * 2}, Config, strict=True
        )
    with pytest.raises(ValueError, match="duplicate"):
        Config(pipelines=[PipelineConfig(name="cam", model=model)] * 2)


def test_duplicate_yaml_keys(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        """\
        pipelines:
          - name: cam
            model:
              path: m.onnx
              threads: 2
              warmup: false
              threads: 4
        """,
    )

    assert message.endswith(":7: $.pipelines[0].model.threads: duplicate key (first at line 5)")


# --- substitution -----------------------------------------------------------------------------


def test_env_substitution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EI_DEVICE", "pi-7")
    monkeypatch.setenv("EI_THREADS", "3")
    monkeypatch.setenv("EI_EMPTY", "")
    monkeypatch.delenv("EI_UNSET", raising=False)
    config = load_config(
        write(
            tmp_path,
            """\
            device_id: ${EI_DEVICE}
            pipelines:
              - name: cam-${EI_DEVICE}
                model:
                  path: ${EI_UNSET:-models}/${EI_EMPTY:-m}.onnx
                  threads: ${EI_THREADS}
                  version: "${EI_THREADS}"
                  memory_limit_mb: ${EI_UNSET:-1.5}
                  warmup: ${EI_UNSET:-false}
                  name: ${EI_EMPTY}
            """,
        )
    )

    assert config.device_id == "pi-7"
    (pipeline,) = config.pipelines
    assert pipeline.name == "cam-pi-7"
    assert pipeline.model.path == str(tmp_path / "models" / "m.onnx")
    assert pipeline.model.threads == 3  # unquoted: typed as YAML would
    assert pipeline.model.version == "3"  # quoted: stays a string
    assert pipeline.model.memory_limit_mb == 1.5
    assert pipeline.model.warmup is False
    assert pipeline.model.name is None  # an empty unquoted value is null, as in YAML


def test_missing_env_var_names_variable_and_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EI_NOT_SET", raising=False)

    message = config_error(tmp_path, MINIMAL + "      name: ${EI_NOT_SET}\n")

    assert message.endswith(
        ":5: $.pipelines[0].model.name: environment variable EI_NOT_SET is not set"
    )


@pytest.mark.parametrize(
    ("value", "problem"),
    [("${}", "invalid substitution '${}'"), ("${1X}", "invalid"), ("'a${B'", "unclosed '${'")],
)
def test_bad_substitution(tmp_path: Path, value: str, problem: str) -> None:
    message = config_error(tmp_path, f"device_id: {value}\n")

    assert ":1: $.device_id: " in message and problem in message


def test_dollar_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EI_X", "expanded")
    task = "    task: {a: '$${EI_X}', b: 'cost: 5$$', c: 'lone $ kept', d: $$$$}\n"
    config = load_config(write(tmp_path, MINIMAL + task))

    assert config.pipelines[0].task == {
        "a": "${EI_X}",
        "b": "cost: 5$",
        "c": "lone $ kept",
        "d": "$$",
    }


def test_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mqtt_password").write_text("hunter2 secret\n\n", encoding="utf-8")
    (creds / "pin").write_text("1234", encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))

    config = load_config(
        write(
            tmp_path,
            MINIMAL
            + "    sinks:\n"
            + "      - type: mqtt\n"
            + "        password: ${credential:mqtt_password}\n"
            + "        pin: ${credential:pin}\n",
        )
    )

    # One trailing newline stripped, no more; a credential is always a string.
    (sink,) = config.pipelines[0].sinks
    assert sink == {"type": "mqtt", "password": "hunter2 secret\n", "pin": "1234"}


def test_credential_value_never_appears_in_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    secret = "s3cr3t-Value"
    (creds / "level").write_text(secret + "\n", encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))

    file = write(tmp_path, "logging:\n  level: ${credential:level}\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)

    assert ":2: $.logging.level: invalid enum value" in str(info.value)
    exc: BaseException | None = info.value
    while exc is not None:  # nor in anything chained to it
        assert secret not in str(exc)
        exc = exc.__cause__ or exc.__context__


def test_missing_credentials_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)

    message = config_error(tmp_path, "device_id: ${credential:dev}\n")

    assert ":1: $.device_id: credential 'dev' needs $CREDENTIALS_DIRECTORY" in message


def test_missing_credential_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))

    message = config_error(tmp_path, "device_id: ${credential:nope}\n")

    assert f":1: $.device_id: cannot read credential file {tmp_path / 'nope'}" in message


def test_credential_name_cannot_leave_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path / "creds"))

    message = config_error(tmp_path, "device_id: ${credential:../config.yaml}\n")

    assert "invalid credential name '../config.yaml'" in message


# --- files and YAML ---------------------------------------------------------------------------


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    file = write(tmp_path, "runtime:\n  max_model_mb: 5\n   bad: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)

    assert str(info.value).startswith(f"{file}:3:")
    assert "invalid YAML" in str(info.value)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    assert "empty config" in config_error(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "kind"), [("- a\n- b\n", "a list"), ("just text\n", "a single value")]
)
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    message = config_error(tmp_path, text)

    assert message.endswith(f":1: $: the top level must be a mapping of settings, not {kind}")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path)
    (tmp_path / "latin1.yaml").write_bytes(b"device_id: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path / "latin1.yaml")
    if os.geteuid() != 0:  # root reads anything
        locked = write(tmp_path, MINIMAL, "locked.yaml")
        locked.chmod(0)
        with pytest.raises(ConfigError, match="cannot read config"):
            load_config(locked)


@pytest.mark.parametrize(
    "text",
    [
        "a: [\n",
        "device_id: !!python/object/apply:os.system [echo hi]\n",
        "device_id: !custom x\n",
        "? [a, b]\n: c\n",
        "a: &x [*x]\n",
        "a: 1\n---\nb: 2\n",
        "device_id: \x07\n",
        "pipelines: !!set {a, b}\n",
        "pipelines:\n  - <<: 5\n",
        "[" * 5000,
    ],
)
def test_bad_input_is_always_a_config_error(tmp_path: Path, text: str) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(text, encoding="utf-8")

    with pytest.raises(ConfigError) as info:
        load_config(file)

    assert str(info.value).startswith(str(file))


def test_merge_keys_do_not_disturb_shared_anchors(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            """\
            pipelines:
              - name: a
                model: &base {path: base.onnx, threads: 1, probe: true}
              - name: b
                model: &tuned
                  <<: *base
                  threads: 2
              - name: c
                model: *tuned
              - name: d
                model:
                  <<: [*tuned, {path: other.onnx, warmup: false}]
                  path: d.onnx
            """,
        )
    )

    models = {p.name: p.model for p in config.pipelines}
    assert [models[n].threads for n in "abcd"] == [1, 2, 2, 2]
    assert all(m.probe for m in models.values())
    assert models["c"].path == str(tmp_path / "base.onnx")
    assert models["d"].path == str(tmp_path / "d.onnx")
    assert models["d"].warmup is False


def test_alias_expansion_is_bounded(tmp_path: Path) -> None:
    # "Billion laughs": each level doubles what the aliases expand to (2**20 values here).
    levels = "abcdefghijklmnopqrst"
    text = "a: &a [x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}]\n" for p, c in zip(levels, levels[1:])
    )

    assert "config too large" in config_error(tmp_path, text)
