"""The messages of an invalid config: msgspec's "<message> - at `$.a.b`" turned into
"<file>:<line>: $.a.b: <message>" in YAML's words, with the valid choices of a tagged union, an
enum or a misspelt field (``did you mean``)."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any

import msgspec

from ..errors import ConfigError
from ._types import PATTERN_HELP
from ._yaml import YamlReader
from .pipeline import OpenUnion
from .schema import Config

__all__ = ["MSGSPEC_AT", "validation_error"]

_Path = tuple[str | int, ...]

MSGSPEC_AT = re.compile(
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

def validation_error(reader: YamlReader, exc: msgspec.ValidationError, data: Any,
                      root: Any = None) -> ConfigError:
    """Turn msgspec's "<message> - at `$.a.b`" into "<file>:<line>: $.a.b: <message>"."""
    text = str(exc)
    match = MSGSPEC_AT.match(text)
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
