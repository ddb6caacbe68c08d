"""Load a YAML config file into the typed `Config`, with errors that name the path and the line.

Messages read ``<file>:<line>: <path>: <problem>``, the path as msgspec writes it::

    config.yaml:12: $.pipelines[0].model.threads: expected int, got str

See `edgeinfer.config._yaml` for ``${VAR}``, ``${VAR:-default}``, ``${credential:NAME}`` and
``$$`` in values.
"""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..errors import ConfigError
from ._types import PATTERN_HELP
from ._yaml import YamlReader, format_path
from .pipeline import (
    BUILT_IN_TASKS,
    BUILTIN_LABELS,
    TASK_CONFIGS,
    AudioSource,
    ImagesSource,
    JsonlSink,
    OpenUnion,
    PendingTask,
    SourceConfig,
    TaskOptions,
    VideoSource,
)
from .schema import Config

T = TypeVar("T")

__all__ = ["config_schema", "load_config", "parse_config"]

_Path = tuple[str | int, ...]

_MSGSPEC_AT = re.compile(
    r"^(?P<msg>.*) - at `(?:(?P<key>key)` in `)?(?P<path>\$[^`]*)`$", re.DOTALL
)
# msgspec speaks JSON; a YAML file has lists and mappings.
# (A tag of the wrong type is named by its Python type: "got `dict`".)
_YAML_WORDS = {"array": "list", "object": "mapping", "dict": "mapping", "NoneType": "null"}
_TYPE_NAMES = {
    "int", "float", "str", "bool", "null", "array", "object", "bytes", "datetime", "date",
    "time", "timedelta", "uuid", "decimal", "list", "dict", "NoneType",
}
_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\.\.\.\]")
# msgspec names a failed pattern by its regex; say in words what it asks for.
_PATTERN_MESSAGES = {
    f"Expected `str` matching regex {pattern!r}": f"expected {words}"
    for pattern, words in PATTERN_HELP.items()
}
# A video or images `uri` with a scheme (file://, http://) is not a path relative to the config.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def load_config(path: str | os.PathLike[str], *, stand_in_credentials: bool = False) -> Config:
    """Read and validate a config file.

    ``stand_in_credentials``: a ``${credential:NAME}`` that cannot be read here (outside the
    service, where ``$CREDENTIALS_DIRECTORY`` is not set) becomes a placeholder instead of an
    error; for reading what a config does without its secrets (``--systemd-dropin``).

    Relative paths are taken from the folder the file is in: model paths,
    ``runtime.state_dir``/``cache_dir``, a ``video``/``images`` source's ``uri`` (unless it is a
    URL), an ``audio`` source's ``path``, a ``jsonl`` sink's ``path``, a labels file,
    ``mqtt.tls``'s ``ca_file``/``cert_file``/``key_file`` and ``mqtt.outbox.path``. A
    ``camera`` source's ``uri`` is left as written.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, or does not validate.
    """
    file = Path(path)
    text = _read(file)
    return parse_config(text, source=str(file), base_dir=file.parent.absolute(),
                        stand_in_credentials=stand_in_credentials)


def parse_config(text: str, *, source: str = "<string>", base_dir: Path | None = None,
                 stand_in_credentials: bool = False) -> Config:
    """Validate config text (YAML).

    Args:
        text: The YAML document.
        source: Names the text in error messages (a file name).
        base_dir: Folder relative paths are taken from; the working directory when ``None``.

    Raises:
        ConfigError: invalid YAML, a failed substitution, or a value that does not validate.
    """
    reader = YamlReader(source, stand_in_credentials=stand_in_credentials)
    try:
        data = reader.load(text)
    except RecursionError:
        raise ConfigError(f"{source}: config nested too deeply") from None
    _check_unique_names(reader, data)
    try:
        config = _convert(data)
    except msgspec.ValidationError as exc:
        error = _validation_error(reader, exc, data)
        if not reader.has_secrets:
            raise error from exc
    else:
        return _resolve_paths(config, base_dir if base_dir is not None else Path.cwd())
    # msgspec's own message may quote a credential's value: raised here, outside the handler,
    # the error carries no __context__ holding it.
    raise error


def _convert(data: Any) -> Config:
    """``data`` as a `Config`: the registered (plug-in) tasks converted on their own around
    the tree, which msgspec decodes with the built-in ones (see `OpenUnion`)."""
    registered = _take_registered_tasks(data)
    config = msgspec.convert(data, Config, strict=True)
    if not registered:
        return config
    pipelines = list(config.pipelines)
    for i, task in registered.items():
        try:  # the pipeline's own checks run again, with its task
            pipelines[i] = msgspec.structs.replace(pipelines[i], task=task)
        except ValueError as exc:
            raise msgspec.ValidationError(f"{exc} - at `$.pipelines[{i}]`") from None
    return msgspec.structs.replace(config, pipelines=pipelines)


def _take_registered_tasks(data: Any) -> dict[int, TaskOptions]:
    """Convert each pipeline's ``task:`` of a type not built in against `TASK_CONFIGS` (an
    unknown type is refused there, naming the valid ones), leaving a `PendingTask` in the data.

    Raises:
        msgspec.ValidationError: a task does not validate; the path is the task's in the file.
    """
    pipelines = data.get("pipelines") if isinstance(data, dict) else None
    taken: dict[int, TaskOptions] = {}
    for i, pipeline in enumerate(pipelines if isinstance(pipelines, list) else []):
        task = pipeline.get("task") if isinstance(pipeline, dict) else None
        tag = task.get("type") if isinstance(task, dict) else None
        if not isinstance(tag, str) or tag in BUILT_IN_TASKS:
            continue  # msgspec decodes it in the tree, or says what is wrong with it
        try:
            taken[i] = msgspec.convert(task, TASK_CONFIGS.union(), strict=True)
        except msgspec.ValidationError as exc:
            raise _inside(exc, f"$.pipelines[{i}].task") from None
        pipeline["task"] = {"type": PendingTask.__struct_config__.tag}
    return taken


def _inside(exc: msgspec.ValidationError, at: str) -> msgspec.ValidationError:
    """``exc`` of a value converted on its own, with its path put inside ``at``."""
    match = _MSGSPEC_AT.match(str(exc))
    if match is None:  # the value itself
        return msgspec.ValidationError(f"{exc} - at `{at}`")
    key = "key` in `" if match["key"] else ""
    return msgspec.ValidationError(f"{match['msg']} - at `{key}{at}{match['path'][1:]}`")


def load_struct(path: str | os.PathLike[str], root: type[T]) -> T:
    """Read a YAML file of another config tree (``collect.yaml``: `CollectConfig`) with the
    same rules as the device config: substitutions, credentials, errors naming the line and
    the path.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, or does not validate.
    """
    file = Path(path)
    text = _read(file)
    reader = YamlReader(str(file))
    try:
        data = reader.load(text)
    except RecursionError:
        raise ConfigError(f"{file}: config nested too deeply") from None
    try:
        return msgspec.convert(data, root, strict=True)
    except msgspec.ValidationError as exc:
        error = _validation_error(reader, exc, data, root)
    raise error  # outside the handler: no __context__ holding a credential's value


_COLLECT_KEYS = re.compile(r"^(database|source)\s*:", re.M)
_DEVICE_KEYS = re.compile(r"^(pipelines|mqtt|device|runtime)\s*:", re.M)


def config_kind(path: str | os.PathLike[str]) -> str:
    """``collect`` for a collector config (top-level ``database:``/``source:`` and none of a
    device config's keys), else ``device``.

    Raises:
        ConfigError: the file cannot be read.
    """
    text = _read(Path(path))
    if _COLLECT_KEYS.search(text) and not _DEVICE_KEYS.search(text):
        return "collect"
    return "device"


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror or exc}") from exc


def config_schema() -> dict[str, Any]:
    """The JSON schema of `Config`, for documentation and editors (``task:`` with the task
    types registered now)."""
    tasks = TASK_CONFIGS.union()
    (root, task), defs = msgspec.json.schema_components([Config, tasks],
                                                        ref_template="#/$defs/{name}")
    defs["PipelineConfig"]["properties"]["task"] = task  # msgspec sees the open field as Any
    return {**root, "$defs": defs}


def _resolve_paths(config: Config, base: Path) -> Config:
    def absolute(p: str) -> str:
        # normpath, not resolve(): a model behind the store's `current` link must stay behind it.
        return os.path.normpath(os.path.join(base, os.path.expanduser(p)))

    replace = msgspec.structs.replace
    runtime = config.runtime
    runtime = replace(
        runtime,
        state_dir=absolute(runtime.state_dir) if runtime.state_dir else None,
        cache_dir=absolute(runtime.cache_dir) if runtime.cache_dir else None,
    )
    pipelines = [
        replace(
            p,
            model=replace(p.model, path=absolute(p.model.path)),
            source=_resolve_source(p.source, absolute),
            task=_resolve_task(p.task, absolute),
            sinks=[
                replace(s, path=absolute(s.path)) if isinstance(s, JsonlSink) else s
                for s in p.sinks
            ],
        )
        for p in config.pipelines
    ]
    mqtt = config.mqtt
    if mqtt is not None:
        tls = mqtt.tls
        if tls is not None:
            tls = replace(tls, **{name: absolute(getattr(tls, name))
                                  for name in ("ca_file", "cert_file", "key_file")
                                  if getattr(tls, name)})
        outbox = mqtt.outbox
        if outbox.path:
            outbox = replace(outbox, path=absolute(outbox.path))
        mqtt = replace(mqtt, tls=tls, outbox=outbox)
    ota = config.ota
    if ota is not None:  # key files relative to the config; inline "ed25519:..." keys as written
        ota = replace(ota, trusted_keys=[k if k.lstrip().startswith(("ed25519:", "-----"))
                                         else absolute(k) for k in ota.trusted_keys])
    http = config.http
    if http is not None and http.tls is not None:
        http = replace(http, tls=replace(http.tls, cert_file=absolute(http.tls.cert_file),
                                         key_file=absolute(http.tls.key_file)))
    return replace(config, runtime=runtime, pipelines=pipelines, mqtt=mqtt, ota=ota, http=http)


def _resolve_source(source: SourceConfig, absolute: Callable[[str], str]) -> SourceConfig:
    # Not a camera's uri: an index, a device path or a stream URL, each meant as written.
    if isinstance(source, (VideoSource, ImagesSource)) and not _URL.match(source.uri):
        return msgspec.structs.replace(source, uri=absolute(source.uri))
    if isinstance(source, AudioSource) and source.path is not None:
        return msgspec.structs.replace(source, path=absolute(source.path))
    return source


def _resolve_task(task: TaskOptions, absolute: Callable[[str], str]) -> TaskOptions:
    labels = getattr(task, "labels", None)  # any task's labels file (a list stays as it is)
    if isinstance(labels, str) and labels not in BUILTIN_LABELS:
        return msgspec.structs.replace(task, labels=absolute(labels))
    return task


def _check_unique_names(reader: YamlReader, data: Any) -> None:
    """Report a duplicate pipeline name at the second one (before msgspec, for the line)."""
    pipelines = data.get("pipelines") if isinstance(data, dict) else None
    first: dict[str, int] = {}
    for i, pipeline in enumerate(pipelines if isinstance(pipelines, list) else []):
        name = pipeline.get("name") if isinstance(pipeline, dict) else None
        if not isinstance(name, str):
            continue
        j = first.setdefault(name, i)
        if j != i:
            here: _Path = ("pipelines", i, "name")
            there: _Path = ("pipelines", j, "name")
            msg = f"duplicate pipeline name {name!r} (first at {format_path(there)}"
            msg += f", line {reader.lines[there]})" if there in reader.lines else ")"
            raise reader.error(here, reader.lines.get(here), msg)


def _validation_error(reader: YamlReader, exc: msgspec.ValidationError, data: Any,
                      root: Any = None) -> ConfigError:
    """Turn msgspec's "<message> - at `$.a.b`" into "<file>:<line>: $.a.b: <message>"."""
    text = str(exc)
    match = _MSGSPEC_AT.match(text)
    message, path_text = (match["msg"], match["path"]) if match else (text, "$")
    parts: list[str | int] = []
    for part in _PATH_PART.finditer(path_text):
        if part[0] == "[...]":
            break  # msgspec does not say which mapping key; point at the mapping
        parts.append(part[1] if part[1] is not None else int(part[2]))
    path = tuple(parts)
    unknown = re.fullmatch(r"Object contains unknown field `(.*)`", message)
    if unknown:
        field = unknown[1]
        message = _unknown_field_message(field, _type_at(path, data, root))
        path += (field,)
        path_text += f".{field}" if field.isidentifier() else f"[{field!r}]"
    else:
        message = _tagged_message(message, path, data, root) or _plain_message(message)
        if message.startswith("invalid enum value"):
            choices = typing.get_args(_type_at(path, data, root))
            if choices:
                message += "; valid: " + ", ".join(map(str, choices))
    if match and match["key"]:
        message = f"mapping key: {message}"
    return reader.error(path_text, reader.line_of(path), message)


def _tagged_message(message: str, path: _Path, data: Any, root: Any = None) -> str | None:
    """The message for a tagged union's missing, unknown or mistyped ``type:``, else None."""
    if path and isinstance(path[-1], str):  # at `$.source.type`: the union is at `$.source`
        tags = _tags(_walk(path[:-1], data, root)[0])
        if tags and path[-1] == tags[0]:
            valid = ", ".join(sorted(tags[1]))
            invalid = re.fullmatch(r"Invalid value (.*)", message, re.DOTALL)
            if invalid:
                return f"unknown type {invalid[1]}; valid: {valid}"
            return f"{_plain_message(message)}; valid: {valid}"
    tags = _tags(_walk(path, data, root)[0])  # at `$.source`: the union itself
    if not tags:
        return None
    valid = ", ".join(sorted(tags[1]))
    missing = re.fullmatch(r"Object missing required field `(.*)`", message)
    if missing and missing[1] == tags[0]:
        return f"missing required field {missing[1]!r}; valid: {valid}"
    if message.startswith("Expected `object`"):
        return f"{_plain_message(message)}; give a mapping with {tags[0]}: one of {valid}"
    return None


def _plain_message(message: str) -> str:
    """msgspec's wording, house style: "expected int, got str", field names quoted."""
    if message in _PATTERN_MESSAGES:
        return _PATTERN_MESSAGES[message]
    message = re.sub(r"field `([^`]*)`", r"field '\1'", message.removeprefix("Object "))
    message = message.replace(" | null`", "`")
    message = re.sub(r"`([^`]*)`", _backquoted, message)
    return message[:1].lower() + message[1:]


def _backquoted(match: re.Match[str]) -> str:
    # msgspec's type names (`int | str`, `object`) in YAML's words; anything else, such as a
    # field named in a struct's own check (`command`), quoted like the other field names.
    names = match[1].split(" | ")
    if all(name in _TYPE_NAMES for name in names):
        return " | ".join(_YAML_WORDS.get(name, name) for name in names)
    return f"'{match[1]}'"


def _unknown_field_message(field: str, struct: Any) -> str:
    if not _is_struct(struct):
        return "unknown field"
    tag_field = struct.__struct_config__.tag_field
    valid = ([tag_field] if tag_field else []) + list(struct.__struct_fields__)
    close = difflib.get_close_matches(field, valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "valid: " + ", ".join(valid)
    return f"unknown field; {hint}"


def _type_at(path: _Path, data: Any = None, root: Any = None) -> Any:
    """The type `Config` declares at ``path`` (``X | None`` unwrapped), or None.

    A tagged union (``source``, ``task``, ``sinks[i]``) is narrowed to the struct whose tag the
    YAML data at its path names; without a known tag it stays the union.
    """
    tp, here = _walk(path, data, root)
    return _member(tp, here)


def _walk(path: _Path, data: Any, root: Any = None) -> tuple[Any, Any]:
    """The declared type at ``path`` (not narrowed by its own tag) and the data there."""
    tp: Any = Config if root is None else root
    for part in path:
        tp = _member(tp, data)
        if isinstance(part, int) and typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
            data = data[part] if isinstance(data, list) and 0 <= part < len(data) else None
        elif isinstance(part, str) and _is_struct(tp):
            tp = _field_type(tp, part)
            data = data.get(part) if isinstance(data, dict) else None
        else:
            return None, None
        tp = _unwrap(tp)
    return tp, data


def _field_type(struct: Any, field: str) -> Any:
    """The type ``struct`` declares for ``field``; an open union's members known now."""
    declared = typing.get_type_hints(struct, include_extras=True).get(field)
    for extra in getattr(declared, "__metadata__", ()):
        if isinstance(extra, OpenUnion):
            return extra.union()
    return typing.get_type_hints(struct).get(field)


def _tags(tp: Any) -> tuple[str, dict[Any, Any]] | None:
    """A tagged union's tag field and its structs by tag; None for any other type."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    members = typing.get_args(tp)
    if not all(_is_struct(m) and m.__struct_config__.tag_field for m in members):
        return None
    fields = {m.__struct_config__.tag_field for m in members}
    if len(fields) != 1:
        return None
    return fields.pop(), {m.__struct_config__.tag: m for m in members}


def _member(tp: Any, data: Any) -> Any:
    """The struct of tagged union ``tp`` that ``data``'s tag names, else ``tp`` itself."""
    tags = _tags(tp)
    if tags is None or not isinstance(data, dict):
        return tp
    tag = data.get(tags[0])
    try:
        return tags[1].get(tag, tp)
    except TypeError:  # an unhashable tag value: a list or a mapping
        return tp


def _is_struct(tp: Any) -> bool:
    # list[X] passes isinstance(..., type) on 3.11; get_origin tells it apart.
    return isinstance(tp, type) and typing.get_origin(tp) is None and issubclass(tp, msgspec.Struct)


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp
