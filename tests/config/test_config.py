"""edgeinfer.config: typed structs, the YAML loader, substitution and error messages."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import msgspec
import pytest

from edgeinfer import paths
import edgeinfer.config
from edgeinfer.config.recheck import RecheckConfig
from edgeinfer.config import (
    AudioSource,
    CameraSource,
    ClassifyTask,
    Config,
    DelegateConfig,
    DetectTask,
    EmitConfig,
    ImagesSource,
    JsonlSink,
    LoggingConfig,
    ModelConfig,
    MqttSink,
    MqttSource,
    Picamera2Source,
    PipelineConfig,
    PreprocessConfig,
    RawTask,
    ReconnectConfig,
    RuntimeConfig,
    SerialSource,
    StdoutSink,
    SyntheticSource,
    VadTask,
    VideoSource,
    config_schema,
    load_config,
    parse_config,
)
from edgeinfer.config import pipeline as pipeline_module
from edgeinfer.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# Model keys appended to MINIMAL land in `model:`, on line 6.
MINIMAL = """\
pipelines:
  - name: cam
    source: {type: synthetic}
    model:
      path: models/320n.onnx
"""

SOURCE_TYPES = "audio, camera, images, mqtt, picamera2, serial, synthetic, video"


def pipeline_yaml(*parts: str) -> str:
    """One pipeline "cam" (model m.onnx on line 3), then ``parts``: lines of its own keys."""
    return "pipelines:\n  - name: cam\n    model: {path: m.onnx}\n" + "".join(
        f"    {part}\n" for part in parts
    )


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
    assert pipeline.source == SyntheticSource()
    assert pipeline.task == RawTask(preprocess=None)
    assert pipeline.sinks == [StdoutSink(format="text")]
    assert pipeline.emit == EmitConfig(mode="every", min_interval_s=0.0)
    assert (pipeline.queue_size, pipeline.required) == (2, False)
    model = pipeline.model
    assert isinstance(model, ModelConfig)
    assert model.providers == "auto"
    assert model.threads is None
    assert model.isolation == "none"
    assert model.arena == "bounded"
    assert model.input_shapes == {} and model.delegates == []
    assert model.warmup is True and model.probe is True and model.strict_providers is False
    assert (model.precision, model.probe_budget_s) == ("fp16", 15.0)


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
                source: {type: camera, uri: /dev/video0, width: 640, height: 480, fourcc: MJPG}
                task: {type: detect, decoder: yolov8, classes: [person, 2]}
                sinks: [{type: mqtt}, {type: stdout, format: json}]
                emit: {mode: change, min_interval_s: 1}
                queue_size: 4
                required: true
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
    pipeline = config.pipelines[0]
    assert pipeline.source == CameraSource(uri="/dev/video0", width=640, height=480, fourcc="MJPG")
    assert pipeline.task == DetectTask(decoder="yolov8", classes=["person", 2])
    assert pipeline.sinks == [MqttSink(), StdoutSink(format="json")]
    assert pipeline.emit == EmitConfig(mode="change", min_interval_s=1.0)
    assert (pipeline.queue_size, pipeline.required) == (4, True)
    assert config.logging.level == "debug"
    assert model.load_kwargs() == {
        "providers": ["tensorrt", "cuda", "cpu"],
        "threads": 4,
        "memory_limit_mb": 256.0,
        "isolation": "process",
        "strict_providers": True,
        "probe": True,
        "precision": "fp16",
        "probe_budget_s": 15.0,
        "recheck": RecheckConfig().to_dict(),
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
                source: &source {type: video, uri: in.mp4, loop: true}
                model: &model {path: m.onnx, threads: 2, warmup: false}
              - name: b
                source: {<<: *source, fps: 5}
                model:
                  <<: *model
                  threads: 3
            """,
        )
    )

    a, b = (p.model for p in config.pipelines)
    assert (a.threads, b.threads) == (2, 3)
    assert b.warmup is False
    video = str(tmp_path / "in.mp4")
    assert [p.source for p in config.pipelines] == [
        VideoSource(uri=video, loop=True),
        VideoSource(uri=video, loop=True, fps=5.0),
    ]


def test_example_config_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEINFER_DEVICE_ID", raising=False)
    monkeypatch.delenv("INFER_THREADS", raising=False)

    config = load_config(REPO / "configs" / "example.yaml")

    assert config.device_id is None
    (pipeline,) = config.pipelines
    assert pipeline.model.path == str(REPO / "configs" / "models" / "320n.onnx")
    assert pipeline.model.threads == 2
    assert pipeline.model.input_shapes == {"images": [1, 3, 320, 320]}
    assert isinstance(pipeline.source, SyntheticSource)
    assert isinstance(pipeline.task, DetectTask)
    assert pipeline.task.decoder == "yolov8"
    assert (pipeline.task.score_threshold, pipeline.task.iou_threshold) == (0.4, 0.5)
    assert pipeline.task.preprocess == PreprocessConfig(resize="letterbox", size=[320, 320])
    assert pipeline.sinks == [
        StdoutSink(),
        JsonlSink(path=str(REPO / "configs" / "results" / "detect.jsonl")),
    ]
    assert pipeline.emit.mode == "change"


def test_config_schema_describes_the_tree() -> None:
    schema = config_schema()

    defs = schema["$defs"]
    assert set(defs["Config"]["properties"]) == {"device_id", "runtime", "pipelines", "logging",
                                                 "mqtt", "metrics", "ota", "http"}
    assert defs["ModelConfig"]["required"] == ["path"]
    assert defs["ModelConfig"]["additionalProperties"] is False
    assert defs["PipelineConfig"]["required"] == ["name", "model", "source"]
    source = defs["PipelineConfig"]["properties"]["source"]
    assert source["discriminator"]["propertyName"] == "type"
    assert set(source["discriminator"]["mapping"]) == set(SOURCE_TYPES.split(", "))
    assert defs["VideoSource"]["required"] == ["type", "uri"]


def test_package_exports_every_pipeline_struct() -> None:
    for name in pipeline_module.__all__:
        assert name in edgeinfer.config.__all__
        assert getattr(edgeinfer.config, name) is getattr(pipeline_module, name)


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
            source: {type: synthetic}
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
            source: {type: synthetic}
        """,
    )

    assert ":5: $.pipelines[0].model.thread: unknown field" in message
    assert "did you mean 'threads'?" in message


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = config_error(tmp_path, "pipelines: []\nmqtt_host: x\n")
    assert message.endswith(":2: $.mqtt_host: unknown field; did you mean 'mqtt'?")

    message = config_error(tmp_path, "pipelines: []\nbroker: x\n")
    valid = "device_id, runtime, pipelines, logging, mqtt, metrics, ota, http"
    assert message.endswith(f":2: $.broker: unknown field; valid: {valid}")


@pytest.mark.parametrize(("threads", "problem"), [(0, "expected int >= 1"), (65, "<= 64")])
def test_threads_out_of_range(tmp_path: Path, threads: int, problem: str) -> None:
    message = config_error(tmp_path, MINIMAL + f"      threads: {threads}\n")

    assert ":6: $.pipelines[0].model.threads: " in message
    assert problem in message


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("memory_limit_mb", "0", "memory_limit_mb: expected float >= 0.01"),
        ("max_model_mb", "-1", "max_model_mb: expected float >= 0.01"),
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

    assert message == f"{tmp_path / 'config.yaml'}:6: $.pipelines[0].model.{problem}"


def test_missing_required_field_points_at_the_mapping(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, "pipelines:\n  - name: cam\n    model:\n      threads: 2\n    source: {type: synthetic}\n"
    )

    assert message.endswith(":3: $.pipelines[0].model: missing required field 'path'")


@pytest.mark.parametrize("name", ["cam 1", "a/b", "front+door", "", "x" * 65, "caméra"])
def test_bad_pipeline_name(tmp_path: Path, name: str) -> None:
    message = config_error(tmp_path, MINIMAL.replace("name: cam", f"name: '{name}'"))

    assert message.endswith(
        ":2: $.pipelines[0].name: expected a name of 1 to 64 characters A-Z a-z 0-9 _ -"
    )


def test_pipeline_name_with_trailing_newline(tmp_path: Path) -> None:
    text = "pipelines:\n  - name: |\n      cam\n    model: {path: m.onnx}\n    source: {type: synthetic}\n"

    message = config_error(tmp_path, text)

    assert ":2: $.pipelines[0].name: expected a name of 1 to 64 characters" in message


def test_bad_device_id(tmp_path: Path) -> None:
    message = config_error(tmp_path, "device_id: kitchen/pi\n")

    assert message.endswith(
        ":1: $.device_id: expected a name of 1 to 64 characters A-Z a-z 0-9 _ . -, "
        "not '.', '..', 'group' or 'reply' (topic levels of their own)"
    )


def test_duplicate_pipeline_names(tmp_path: Path) -> None:
    message = config_error(tmp_path, MINIMAL + MINIMAL.removeprefix("pipelines:\n"))

    assert message.endswith(
        ":6: $.pipelines[1].name: duplicate pipeline name 'cam'"
        " (first at $.pipelines[0].name, line 2)"
    )


def test_duplicate_pipeline_names_in_python() -> None:
    model = ModelConfig(path="m.onnx")
    pipeline = {"name": "cam", "model": {"path": "a"}, "source": {"type": "synthetic"}}
    with pytest.raises(msgspec.ValidationError, match="duplicate pipeline name 'cam'"):
        msgspec.convert({"pipelines": [pipeline] * 2}, Config, strict=True)
    with pytest.raises(ValueError, match="duplicate"):
        Config(pipelines=[PipelineConfig(name="cam", model=model, source=SyntheticSource())] * 2)


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
            source: {type: synthetic}
        """,
    )

    assert message.endswith(":7: $.pipelines[0].model.threads: duplicate key (first at line 5)")


# --- sources, tasks, sinks --------------------------------------------------------------------

RECONNECT = ReconnectConfig(initial_s=0.5, max_s=30.0, max_attempts=None)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "{type: camera}",
            CameraSource(
                uri=0, width=None, height=None, fps=None, max_fps=None, backend="auto",
                fourcc=None, open_timeout_s=10.0, reconnect=RECONNECT,
            ),
        ),
        (
            "{type: picamera2}",
            Picamera2Source(width=640, height=480, fps=None, max_fps=None, camera=0),
        ),
        ("{type: video, uri: /data/in.mp4}", VideoSource(uri="/data/in.mp4", fps=None, loop=False)),
        ("{type: images, uri: /data/frames}", ImagesSource(uri="/data/frames", fps=None, loop=False)),
        ("{type: synthetic}", SyntheticSource(width=640, height=480, fps=15.0, frames=None)),
        (
            "{type: audio, command: arecord -f S16_LE -r 16000 -c 1 -t raw}",
            AudioSource(
                command="arecord -f S16_LE -r 16000 -c 1 -t raw", path=None, sample_rate=16000,
                channels=1, sample_format="s16le", window=512, hop=None, reconnect=RECONNECT,
                realtime=False,
            ),
        ),
        (
            "{type: serial, port: /dev/ttyUSB0}",
            SerialSource(
                port="/dev/ttyUSB0", baudrate=115200, format="csv", fields=[], window=1, hop=None,
                reconnect=RECONNECT,
            ),
        ),
        (
            "{type: mqtt, topic: sensors/+/temp}",
            MqttSource(topic="sensors/+/temp", fields=[], window=1, hop=None, qos=1),
        ),
    ],
)
def test_every_source_type_parses_with_defaults(source: str, expected: object) -> None:
    config = parse_config(pipeline_yaml(f"source: {source}"), base_dir=Path("/etc/edgeinfer"))

    assert config.pipelines[0].source == expected


def test_the_source_types_tested_are_all_there_are() -> None:
    tags = {cls.__struct_config__.tag for cls in pipeline_module.SourceConfig.__args__}

    assert tags == set(SOURCE_TYPES.split(", "))


PREPROCESS = PreprocessConfig(
    resize="letterbox", size=None, color="rgb", layout=None, scale=None, mean=None, std=None,
    pad_value=114,
)


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        (
            "{type: classify}",
            ClassifyTask(
                labels=None, top_k=5, softmax="auto", score_threshold=0.0, preprocess=PREPROCESS
            ),
        ),
        (
            "{type: detect, decoder: yolov8}",
            DetectTask(
                decoder="yolov8", score_threshold=0.25, iou_threshold=0.45, max_detections=100,
                classes=None, labels=None, preprocess=PREPROCESS,
            ),
        ),
        ("{type: vad}", VadTask(threshold=0.5, min_speech_ms=250.0, min_silence_ms=300.0)),
        ("{type: raw}", RawTask(preprocess=None)),
        ("{type: raw, preprocess: {}}", RawTask(preprocess=PREPROCESS)),
    ],
)
def test_every_task_type_parses_with_defaults(task: str, expected: object) -> None:
    config = parse_config(pipeline_yaml("source: {type: synthetic}", f"task: {task}"))

    assert config.pipelines[0].task == expected


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        ("{type: stdout}", StdoutSink(format="text")),
        ("{type: jsonl, path: /var/log/r.jsonl}", JsonlSink(path="/var/log/r.jsonl")),
        ("{type: mqtt}", MqttSink(qos=1)),
    ],
)
def test_every_sink_type_parses_with_defaults(sink: str, expected: object) -> None:
    config = parse_config(pipeline_yaml("source: {type: synthetic}", f"sinks: [{sink}]"))

    assert config.pipelines[0].sinks == [expected]


def test_pipeline_defaults_and_fresh_sink_lists() -> None:
    config = parse_config(pipeline_yaml("source: {type: synthetic}"))

    (pipeline,) = config.pipelines
    assert pipeline.task == RawTask()
    assert pipeline.sinks == [StdoutSink(format="text")]
    assert pipeline.emit == EmitConfig(mode="every", min_interval_s=0.0)
    assert pipeline.queue_size == 2
    assert pipeline.required is False
    a = PipelineConfig(name="a", model=ModelConfig(path="m"), source=SyntheticSource())
    b = PipelineConfig(name="b", model=ModelConfig(path="m"), source=SyntheticSource())
    assert a.sinks == b.sinks and a.sinks is not b.sinks


def test_pipeline_needs_a_source(tmp_path: Path) -> None:
    message = config_error(tmp_path, "pipelines:\n  - name: cam\n    model: {path: m.onnx}\n")

    assert message.endswith(":2: $.pipelines[0]: missing required field 'source'")


def test_unknown_source_type_lists_the_valid_ones(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, pipeline_yaml("source:", "  uri: /dev/video0", "  type: webcam")
    )

    assert message == (
        f"{tmp_path / 'config.yaml'}:6: $.pipelines[0].source.type: unknown type 'webcam';"
        f" valid: {SOURCE_TYPES}"
    )


@pytest.mark.parametrize(
    ("part", "problem"),
    [
        (
            "task: {type: segmentation}",
            "task.type: unknown type 'segmentation'; valid: classify, detect, pose, raw, segment,"
            " vad",
        ),
        (
            "sinks: [{type: stdout}, {type: file}]",
            "sinks[1].type: unknown type 'file'; valid: jsonl, mqtt, stdout",
        ),
        ("source: {type: 5}", f"source.type: expected str, got int; valid: {SOURCE_TYPES}"),
        ("source: {type: [video]}", f"source.type: expected str, got list; valid: {SOURCE_TYPES}"),
        ("source: {type: }", f"source.type: expected str, got null; valid: {SOURCE_TYPES}"),
        (
            "source: camera",
            f"source: expected mapping, got str; give a mapping with type: one of {SOURCE_TYPES}",
        ),
        (
            "sinks: [stdout]",
            "sinks[0]: expected mapping, got str; give a mapping with type: one of jsonl, mqtt,"
            " stdout",
        ),
    ],
)
def test_bad_type_tags(tmp_path: Path, part: str, problem: str) -> None:
    source = [] if part.startswith("source") else ["source: {type: synthetic}"]

    message = config_error(tmp_path, pipeline_yaml(*source, part))

    assert message == f"{tmp_path / 'config.yaml'}:{4 + len(source)}: $.pipelines[0].{problem}"


@pytest.mark.parametrize(
    ("part", "problem"),
    [
        ("source: {uri: x.mp4}", f"source: missing required field 'type'; valid: {SOURCE_TYPES}"),
        (
            "sinks: [{path: r.jsonl}]",
            "sinks[0]: missing required field 'type'; valid: jsonl, mqtt, stdout",
        ),
        ("source: {type: video}", "source: missing required field 'uri'"),
        ("source: {type: serial}", "source: missing required field 'port'"),
        ("source: {type: mqtt}", "source: missing required field 'topic'"),
        ("sinks: [{type: jsonl}]", "sinks[0]: missing required field 'path'"),
    ],
)
def test_missing_type_or_required_field(tmp_path: Path, part: str, problem: str) -> None:
    message = config_error(tmp_path, pipeline_yaml(part))

    assert message == f"{tmp_path / 'config.yaml'}:4: $.pipelines[0].{problem}"


@pytest.mark.parametrize(
    ("part", "problem"),
    [
        ("source: {type: video, url: x.mp4}", "source.url: unknown field; did you mean 'uri'?"),
        (
            "source: {type: camera, reconnect: {max: 5}}",
            "source.reconnect.max: unknown field; did you mean 'max_s'?",
        ),
        (
            "source: {type: video, uri: x.mp4, qqq: 1}",
            "source.qqq: unknown field; valid: type, uri, fps, loop, isolation",
        ),
        (
            "task: {type: detect, decoder: ssd, iou_treshold: 0.5}",
            "task.iou_treshold: unknown field; did you mean 'iou_threshold'?",
        ),
        (
            "task: {type: classify, preprocess: {sise: [224, 224]}}",
            "task.preprocess.sise: unknown field; did you mean 'size'?",
        ),
        (
            "task: {type: raw, labels: l.txt}",
            "task.labels: unknown field; valid: type, preprocess",
        ),
        (
            "sinks: [{type: stdout}, {type: jsonl, pth: r.jsonl}]",
            "sinks[1].pth: unknown field; did you mean 'path'?",
        ),
        ("emit: {mod: change}", "emit.mod: unknown field; did you mean 'mode'?"),
    ],
)
def test_typo_inside_a_part_suggests_the_field(tmp_path: Path, part: str, problem: str) -> None:
    source = [] if part.startswith("source") else ["source: {type: synthetic}"]

    message = config_error(tmp_path, pipeline_yaml(*source, part))

    assert message == f"{tmp_path / 'config.yaml'}:{4 + len(source)}: $.pipelines[0].{problem}"


@pytest.mark.parametrize(
    ("part", "problem"),
    [
        (
            "task: {type: detect, decoder: ssd, score_threshold: 1.5}",
            "task.score_threshold: expected float <= 1.0",
        ),
        (
            "task: {type: classify, preprocess: {size: [320]}}",
            "task.preprocess.size: expected list of length >= 2",
        ),
        (
            "task: {type: classify, preprocess: {size: [320, 320, 3]}}",
            "task.preprocess.size: expected list of length <= 2",
        ),
        ("task: {type: classify, labels: ''}", "task.labels: expected str of length >= 1"),
        (
            "sinks: [{type: stdout, format: yaml}]",
            "sinks[0].format: invalid enum value 'yaml'; valid: text, json",
        ),
        ("sinks: [{type: mqtt, qos: 2}]", "sinks[0].qos: invalid enum value 2; valid: 0, 1"),
        ("emit: {mode: always}", "emit.mode: invalid enum value 'always'; valid: every, change"),
        ("emit: {min_interval_s: -1}", "emit.min_interval_s: expected float >= 0.0"),
        ("queue_size: 0", "queue_size: expected int >= 1"),
        ("queue_size: 65", "queue_size: expected int <= 64"),
        ("required: 'yes'", "required: expected bool, got str"),
    ],
)
def test_part_field_errors(tmp_path: Path, part: str, problem: str) -> None:
    message = config_error(tmp_path, pipeline_yaml("source: {type: synthetic}", part))

    assert message == f"{tmp_path / 'config.yaml'}:5: $.pipelines[0].{problem}"


def test_detect_decoder_defaults_to_auto_and_builtin_labels_stay_names(tmp_path: Path) -> None:
    """The decoder is picked (and a configured name checked) when the task is built, where the
    registry and the model are known; ``coco`` is the built-in list, not a file beside it."""
    file = write(tmp_path, pipeline_yaml("source: {type: synthetic}",
                                         "task: {type: detect, labels: coco, decoder: anything}"))
    task = load_config(file).pipelines[0].task
    assert task == DetectTask(decoder="anything", labels="coco")
    file = write(tmp_path, pipeline_yaml("source: {type: synthetic}",
                                         "task: {type: detect, labels: coco.txt}"))
    task = load_config(file).pipelines[0].task
    assert task == DetectTask(decoder="auto", labels=str(tmp_path / "coco.txt"))


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("{type: video, uri: ''}", "source.uri: expected str of length >= 1"),
        ("{type: camera, uri: 1.5}", "source.uri: expected int | str, got float"),
        ("{type: camera, fourcc: MJPEG}", "source.fourcc: expected str of length <= 4"),
        ("{type: camera, fps: 0}", "source.fps: expected float >= 0.01"),
        (
            "{type: camera, reconnect: {max_attempts: 0}}",
            "source.reconnect.max_attempts: expected int >= 1",
        ),
        (
            "{type: serial, port: /dev/ttyS0, format: xml}",
            "source.format: invalid enum value 'xml'; valid: csv, json",
        ),
        (
            "{type: audio, command: arecord, sample_format: s24le}",
            "source.sample_format: invalid enum value 's24le'; valid: s16le, s32le, f32le, u8",
        ),
    ],
)
def test_source_field_errors(tmp_path: Path, source: str, problem: str) -> None:
    message = config_error(tmp_path, pipeline_yaml(f"source: {source}"))

    assert message == f"{tmp_path / 'config.yaml'}:4: $.pipelines[0].{problem}"


@pytest.mark.parametrize(
    "source", ["{type: audio}", "{type: audio, command: [arecord, -t, raw], path: in.wav}"]
)
def test_audio_takes_a_command_or_a_path(tmp_path: Path, source: str) -> None:
    message = config_error(tmp_path, pipeline_yaml(f"source: {source}"))

    assert message.endswith(":4: $.pipelines[0].source: give exactly one of 'command' or 'path'")
    with pytest.raises(ValueError, match="exactly one"):
        AudioSource()


def test_audio_command_may_be_a_list(tmp_path: Path) -> None:
    config = parse_config(pipeline_yaml("source: {type: audio, command: [arecord, -t, raw]}"))

    assert config.pipelines[0].source == AudioSource(command=["arecord", "-t", "raw"])


def test_credential_in_a_bad_type_tag_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kind").write_text("hush-hush\n", encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))

    message = config_error(tmp_path, pipeline_yaml("source:", "  type: ${credential:kind}"))

    assert message.endswith(
        f":5: $.pipelines[0].source.type: unknown type '<redacted>'; valid: {SOURCE_TYPES}"
    )
    assert "hush" not in message


def test_relative_part_paths_resolve_against_the_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)  # not the config's folder
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = load_config(
        write(
            folder,
            """\
            pipelines:
              - name: video
                model: {path: m.onnx}
                source: {type: video, uri: media/in.mp4}
                task: {type: classify, labels: labels.txt}
                sinks: [{type: jsonl, path: ../out/r.jsonl}, {type: stdout}]
              - name: images
                model: {path: m.onnx}
                source: {type: images, uri: "frames/*.jpg"}
                task: {type: detect, decoder: ssd, labels: [cat, dog]}
              - name: audio
                model: {path: m.onnx}
                source: {type: audio, path: ~/clip.wav}
                task: {type: detect, decoder: ssd, labels: /usr/share/coco.txt}
              - name: url
                model: {path: m.onnx}
                source: {type: video, uri: "https://example.com/in.mp4"}
            """,
        )
    )

    video, images, audio, url = config.pipelines
    assert video.source == VideoSource(uri=str(folder / "media" / "in.mp4"))
    assert video.task == ClassifyTask(labels=str(folder / "labels.txt"))
    assert video.sinks == [JsonlSink(path=str(tmp_path / "out" / "r.jsonl")), StdoutSink()]
    assert images.source == ImagesSource(uri=str(folder / "frames" / "*.jpg"))
    assert images.task == DetectTask(decoder="ssd", labels=["cat", "dog"])
    assert audio.source == AudioSource(path=str(tmp_path / "home" / "clip.wav"))
    assert audio.task == DetectTask(decoder="ssd", labels="/usr/share/coco.txt")
    assert url.source == VideoSource(uri="https://example.com/in.mp4")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("0", 0),
        ("2", 2),
        ("/dev/video0", "/dev/video0"),
        ("video0", "video0"),
        ("rtsp://cam.local:554/stream", "rtsp://cam.local:554/stream"),
        ("'0'", "0"),
    ],
)
def test_camera_uri_is_left_as_written(tmp_path: Path, uri: str, expected: object) -> None:
    config = load_config(write(tmp_path, pipeline_yaml(f"source: {{type: camera, uri: {uri}}}")))

    assert config.pipelines[0].source == CameraSource(uri=expected)
    assert type(config.pipelines[0].source.uri) is type(expected)


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
                source:
                  type: video
                  uri: ${EI_UNSET:-media}/${EI_DEVICE}.mp4
                  loop: ${EI_UNSET:-true}
                  fps: ${EI_THREADS}
                sinks:
                  - type: mqtt
                    qos: ${EI_UNSET:-0}
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
    assert pipeline.source == VideoSource(uri=str(tmp_path / "media" / "pi-7.mp4"), loop=True, fps=3)
    assert pipeline.sinks == [MqttSink(qos=0)]


def test_missing_env_var_names_variable_and_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EI_NOT_SET", raising=False)

    message = config_error(tmp_path, MINIMAL + "      name: ${EI_NOT_SET}\n")

    assert message.endswith(
        ":6: $.pipelines[0].model.name: environment variable EI_NOT_SET is not set"
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
    task = "    task: {type: classify, labels: ['$${EI_X}', 'cost: 5$$', 'lone $ kept', $$$$]}\n"
    config = load_config(write(tmp_path, MINIMAL + task))

    assert config.pipelines[0].task == ClassifyTask(
        labels=["${EI_X}", "cost: 5$", "lone $ kept", "$$"]
    )


def test_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mqtt_password").write_text("hunter2 secret\n\n", encoding="utf-8")
    (creds / "pin").write_text("1234", encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))

    config = load_config(
        write(
            tmp_path,
            pipeline_yaml(
                "source:",
                "  type: camera",
                "  uri: ${credential:pin}",
                "task:",
                "  type: classify",
                "  labels:",
                "    - ${credential:mqtt_password}",
            ),
        )
    )

    # One trailing newline stripped, no more; a credential is always a string (a camera's uri
    # may be an int, a device index: "1234" stays a str all the same).
    (pipeline,) = config.pipelines
    assert pipeline.source == CameraSource(uri="1234")
    assert pipeline.task == ClassifyTask(labels=["hunter2 secret\n"])


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
                source: &cam {type: camera, uri: 0}
              - name: b
                model: &tuned
                  <<: *base
                  threads: 2
                source: *cam
              - name: c
                model: *tuned
                source: *cam
              - name: d
                model:
                  <<: [*tuned, {path: other.onnx, warmup: false}]
                  path: d.onnx
                source: {<<: *cam, uri: 1}
            """,
        )
    )

    models = {p.name: p.model for p in config.pipelines}
    assert [models[n].threads for n in "abcd"] == [1, 2, 2, 2]
    assert all(m.probe for m in models.values())
    assert models["c"].path == str(tmp_path / "base.onnx")
    assert models["d"].path == str(tmp_path / "d.onnx")
    assert models["d"].warmup is False
    assert [p.source for p in config.pipelines] == [CameraSource(uri=0)] * 3 + [CameraSource(uri=1)]


def test_alias_expansion_is_bounded(tmp_path: Path) -> None:
    # "Billion laughs": each level doubles what the aliases expand to (2**20 values here).
    levels = "abcdefghijklmnopqrst"
    text = "a: &a [x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}]\n" for p, c in zip(levels, levels[1:])
    )

    assert "config too large" in config_error(tmp_path, text)


# --- ota ----------------------------------------------------------------------------------------


def test_ota_section_resolves_key_files_and_keeps_inline_keys(tmp_path: Path) -> None:
    file = write(tmp_path, """\
        mqtt: {host: 127.0.0.1}
        ota:
          trusted_keys: [keys/ota.pub, "ed25519:AAAA key"]
          groups: [line-3]
          health: {min_inferences: 3}
        pipelines: []
        """)
    config = load_config(file)
    assert config.ota is not None
    assert config.ota.trusted_keys == [str(tmp_path / "keys" / "ota.pub"), "ed25519:AAAA key"]
    assert config.ota.groups == ["line-3"] and config.ota.health.min_inferences == 3
    assert config.ota.verify.max_slowdown == 2.0 and config.ota.keep_versions == 3


@pytest.mark.parametrize("text, problem", [
    ("mqtt: {host: h}\nota: {}\n", "$.ota: ota: list the public keys to trust"),
    ("ota: {allow_unsigned: true}\n", "ota: model updates arrive over MQTT; add an mqtt: section"),
    ("mqtt: {host: h}\nota: {allow_unsigned: true, groups: [a/b]}\n", "$.ota.groups[0]"),
    ("mqtt: {host: h}\nota: {allow_unsigned: true, verify: {max_slowdown: 0.5}}\n",
     "$.ota.verify.max_slowdown: expected float >= 1.0"),
    ("mqtt: {host: h}\nota: {allow_unsigned: true, health: {max_error_rate: 2}}\n",
     "$.ota.health.max_error_rate"),
])
def test_ota_section_errors_name_the_path(tmp_path: Path, text: str, problem: str) -> None:
    assert problem in config_error(tmp_path, "pipelines: []\n" + text)


def test_http_needs_a_token_beyond_loopback(tmp_path: Path) -> None:
    message = config_error(tmp_path, "pipelines: []\nhttp: {bind: 0.0.0.0}\n")
    assert "$.http: binding 0.0.0.0 (not loopback) needs a token" in message
    message = config_error(tmp_path, "pipelines: []\nhttp: {bind: 0.0.0.0, token: short}\n")
    assert "$.http: http.token must be 16 to 512 printable" in message and "regex" not in message
    for bind in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        write(tmp_path, f"pipelines: []\nhttp: {{bind: '{bind}'}}\n")
        assert load_config(tmp_path / "config.yaml").http is not None
    write(tmp_path, "pipelines: []\nhttp: {bind: 0.0.0.0, token: 0123456789abcdef0123}\n")
    assert load_config(tmp_path / "config.yaml").http.token == "0123456789abcdef0123"  # type: ignore[union-attr]
