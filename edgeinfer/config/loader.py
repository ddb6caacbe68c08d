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
from pathlib import Path
from typing import Any

import msgspec

from ..errors import ConfigError
from ._yaml import YamlReader, format_path
from .schema import Config

__all__ = ["config_schema", "load_config", "parse_config"]

_Path = tuple[str | int, ...]

_MSGSPEC_AT = re.compile(
    r"^(?P<msg>.*) - at `(?:(?P<key>key)` in `)?(?P<path>\$[^`]*)`$", re.DOTALL
)
# msgspec speaks JSON; a YAML file has lists and mappings.
_YAML_WORDS = {"array": "list", "object": "mapping"}
_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[\.\.\.\]")


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file.

    Relative model paths (and ``runtime.state_dir``/``cache_dir``) are taken from the folder
    the file is in.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, or does not validate.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror or exc}") from exc
    return parse_config(text, source=str(file), base_dir=file.parent.absolute())


def parse_config(text: str, *, source: str = "<string>", base_dir: Path | None = None) -> Config:
    """Validate config text (YAML).

    Args:
        text: The YAML document.
        source: Names the text in error messages (a file name).
        base_dir: Folder relative paths are taken from; the working directory when ``None``.

    Raises:
        ConfigError: invalid YAML, a failed substitution, or a value that does not validate.
    """
    reader = YamlReader(source)
    try:
        data = reader.load(text)
    except RecursionError:
        raise ConfigError(f"{source}: config nested too deeply") from None
    _check_unique_names(reader, data)
    try:
        config = msgspec.convert(data, Config, strict=True)
    except msgspec.ValidationError as exc:
        error = _validation_error(reader, exc)
        if not reader.has_secrets:
            raise error from exc
    else:
        return _resolve_paths(config, base_dir if base_dir is not None else Path.cwd())
    # msgspec's own message may quote a credential's value: raised here, outside the handler,
    # the error carries no __context__ holding it.
    raise error


def config_schema() -> dict[str, Any]:
    """The JSON schema of `Config`, for documentation and editors."""
    return msgspec.json.schema(Config)


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
        replace(p, model=replace(p.model, path=absolute(p.model.path)))
        for p in config.pipelines
    ]
    return replace(config, runtime=runtime, pipelines=pipelines)


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


def _validation_error(reader: YamlReader, exc: msgspec.ValidationError) -> ConfigError:
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
        message = _unknown_field_message(field, _type_at(path))
        path += (field,)
        path_text += f".{field}" if field.isidentifier() else f"[{field!r}]"
    else:
        message = _plain_message(message)
        if message.startswith("invalid enum value"):
            choices = typing.get_args(_type_at(path))
            if choices:
                message += "; valid: " + ", ".join(map(str, choices))
    if match and match["key"]:
        message = f"mapping key: {message}"
    return reader.error(path_text, reader.line_of(path), message)


def _plain_message(message: str) -> str:
    """msgspec's wording, house style: "expected int, got str", field names quoted."""
    message = re.sub(r"field `([^`]*)`", r"field '\1'", message.removeprefix("Object "))
    message = message.replace(" | null`", "`")
    message = re.sub(
        r"`([^`]*)`",
        lambda m: " | ".join(_YAML_WORDS.get(t, t) for t in m[1].split(" | ")),
        message,
    )
    return message[:1].lower() + message[1:]


def _unknown_field_message(field: str, struct: Any) -> str:
    if not _is_struct(struct):
        return "unknown field"
    valid = list(struct.__struct_fields__)
    close = difflib.get_close_matches(field, valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "valid: " + ", ".join(valid)
    return f"unknown field; {hint}"


def _type_at(path: _Path) -> Any:
    """The type `Config` declares at ``path`` (``X | None`` unwrapped), or None."""
    tp: Any = Config
    for part in path:
        if isinstance(part, int) and typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        elif isinstance(part, str) and _is_struct(tp):
            tp = typing.get_type_hints(tp).get(part)
        else:
            return None
        tp = _unwrap(tp)
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
