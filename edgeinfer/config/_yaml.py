"""YAML text to plain data, with the line of every key and ``${...}`` substitution.

The YAML is composed into a node tree and built into plain data by hand, which gives, in one
walk: the line of every key (for error messages), duplicate-key detection (PyYAML silently keeps
the last one), and substitution in string values:

- ``${VAR}``: the environment variable (a ConfigError when it is unset);
- ``${VAR:-default}``: the default when VAR is unset or empty;
- ``${credential:NAME}``: the file ``$CREDENTIALS_DIRECTORY/NAME`` (systemd ``LoadCredential=``)
  less one trailing newline; its value never appears in an error message. Only a regular file
  of at most 64 KiB is read (a FIFO or a device would block or never end);
- ``$$``: a literal ``$``. Any other ``$`` is kept as it is.

An unquoted value that is only a number, ``true``/``false`` or ``null`` after an environment
substitution takes that type, as YAML would have read it (``threads: ${THREADS:-2}`` is an int);
quote it to keep a string. Credential values are always strings.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

from ..errors import ConfigError

__all__ = ["YamlReader", "format_path"]

_Path = tuple[str | int, ...]

_STR, _SEQ, _MAP, _MERGE, _NULL = (
    f"tag:yaml.org,2002:{t}" for t in ("str", "seq", "map", "merge", "null")
)
_SUBST = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<body>[^}]*)(?P<close>\})?)")
_ENV_BODY = re.compile(r"(?P<var>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?", re.DOTALL)
# `${...}` on one line, not after a `$` (`$${` is a literal), and the private-use characters
# that stand in for one while YAML parses (printable, so YAML takes them in plain scalars)
_FLOW_SUBST = re.compile(r"(?<!\$)\$\{[^}\n]*\}")
_STAND_IN = ("\ue000", "\ue001")
_STAND_IN_RE = re.compile("\ue000([0-9]+)\ue001")
_CRED_NAME = re.compile(r"[A-Za-z0-9_.@-]+")
MAX_CREDENTIAL_BYTES = 64 * 1024
# Aliases are expanded while building: a few nested ones could otherwise make millions of nodes.
_MAX_NODES = 100_000
_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?")


def format_path(path: _Path) -> str:
    """``("pipelines", 0, "name")`` -> ``$.pipelines[0].name``, as msgspec writes paths."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", part):
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


# What an unreadable credential reads as with ``stand_in_credentials`` (a value every secret
# field accepts: printable, no spaces, 16+ characters).
CREDENTIAL_STAND_IN = "credential-not-read-here"

class YamlReader:
    """Builds plain data from one YAML text, remembering lines and credential values.

    Attributes:
        source: Names the text in messages.
        lines: 1-based line of every path that was read (of the key, for a mapping entry).
    """

    def __init__(self, source: str, *, stand_in_credentials: bool = False) -> None:
        self.source = source
        self.stand_in_credentials = stand_in_credentials
        self.lines: dict[_Path, int] = {}
        self._secrets: set[str] = set()
        self._active: set[int] = set()
        self._nodes = 0
        self._constructor = SafeConstructor()
        self._stand_ins: list[str] = []

    @property
    def has_secrets(self) -> bool:
        """Whether a credential was read (its value may be in a third-party message)."""
        return bool(self._secrets)

    def error(self, path: _Path | str, line: int | None, message: str) -> ConfigError:
        """A ConfigError "<source>:<line>: <path>: <message>", credential values redacted."""
        where = f"{self.source}:{line}" if line is not None else self.source
        text = path if isinstance(path, str) else format_path(path)
        return ConfigError(self._redact(f"{where}: {text}: {message}"))

    def load(self, text: str) -> Any:
        """Parse ``text`` into dicts, lists and scalars; the top level must be a mapping."""
        try:
            root = self._compose(text)
        except yaml.MarkedYAMLError as exc:
            raise self._yaml_error(exc) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{self.source}: invalid YAML: {exc}") from None
        if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL):
            raise ConfigError(f"{self.source}: empty config (expected a mapping of settings)")
        if not isinstance(root, yaml.MappingNode):
            kind = "list" if isinstance(root, yaml.SequenceNode) else "single value"
            line = root.start_mark.line + 1
            raise self.error((), line, f"the top level must be a mapping of settings, not a {kind}")
        self.lines[()] = root.start_mark.line + 1
        return self._build(root, ())

    def _compose(self, text: str) -> yaml.Node | None:
        """``yaml.compose``; when that fails on a text with ``${...}``, again with each one
        stood in for by a token YAML takes in any context: in a flow mapping or sequence
        (``source: {type: camera, uri: ${CAMERA}}``) ``{`` and ``}`` are YAML's own, so a
        plain ``${X}`` there is a syntax error. `_construct` puts them back."""
        try:
            return yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError:
            if "${" not in text:
                raise
        self._stand_ins = []

        def stand_in(match: re.Match[str]) -> str:
            self._stand_ins.append(match[0])
            return f"{_STAND_IN[0]}{len(self._stand_ins) - 1}{_STAND_IN[1]}"

        return yaml.compose(_FLOW_SUBST.sub(stand_in, text), Loader=yaml.SafeLoader)

    def line_of(self, path: _Path) -> int | None:
        """The line of ``path``, or of its nearest parent that was read."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None

    def _yaml_error(self, exc: yaml.MarkedYAMLError) -> ConfigError:
        mark = exc.problem_mark or exc.context_mark
        where = f"{self.source}:{mark.line + 1}:{mark.column + 1}" if mark else self.source
        message = exc.problem or exc.context or "invalid YAML"
        if exc.problem and exc.context:
            context = exc.context
            if exc.context_mark and (not mark or exc.context_mark.line != mark.line):
                context += f" at line {exc.context_mark.line + 1}"
            message += f" ({context})"
        return ConfigError(f"{where}: invalid YAML: {message}")

    def _build(self, node: yaml.Node, path: _Path) -> Any:
        self._nodes += 1
        if self._nodes > _MAX_NODES:
            raise self.error(path, None, f"config too large (over {_MAX_NODES} values)")
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        line = node.start_mark.line + 1
        if id(node) in self._active:
            raise self.error(path, line, "recursive YAML alias")
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ:
                return self._sequence(node, path)
            if isinstance(node, yaml.MappingNode) and node.tag == _MAP:
                return self._mapping(node, path)
            raise self.error(path, line, f"unsupported YAML tag {node.tag}")
        finally:
            self._active.discard(id(node))

    def _sequence(self, node: yaml.SequenceNode, path: _Path) -> list[Any]:
        items = []
        for i, item in enumerate(node.value):
            self.lines[(*path, i)] = item.start_mark.line + 1
            items.append(self._build(item, (*path, i)))
        return items

    def _mapping(self, node: yaml.MappingNode, path: _Path) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                result.update(self._merged(value_node, path))
            else:
                own.append((key_node, value_node))
        seen: dict[Any, int] = {}
        for key_node, value_node in own:
            key, line = self._key(key_node, path), key_node.start_mark.line + 1
            if key in seen:
                raise self.error((*path, key), line, f"duplicate key (first at line {seen[key]})")
            seen[key] = line
            self.lines[(*path, key)] = line
            result[key] = self._build(value_node, (*path, key))
        return result

    def _merged(self, node: yaml.Node, path: _Path) -> dict[Any, Any]:
        # `<<: *defaults` or `<<: [*a, *b]` (earlier ones win); the mapping's own keys override.
        # Built here rather than by PyYAML's flatten_mapping, which rewrites the shared nodes.
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        merged: dict[Any, Any] = {}
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                line = source.start_mark.line + 1
                raise self.error(path, line, "'<<' takes a mapping or a list of mappings")
            merged.update(self._build(source, path))
        return merged

    def _key(self, node: yaml.Node, path: _Path) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(path, node.start_mark.line + 1, "mapping keys must be plain values")
        return self._construct(node, path)

    def _construct(self, node: yaml.ScalarNode, path: _Path) -> Any:
        if self._stand_ins and _STAND_IN[0] in node.value:
            node.value = _STAND_IN_RE.sub(lambda m: self._stand_ins[int(m[1])], node.value)
        try:
            return self._constructor.construct_object(node)
        except ConstructorError as exc:
            raise self._yaml_error(exc) from None
        except ValueError as exc:  # int() past its digit limit, an impossible date
            line = node.start_mark.line + 1
            if "digits" in str(exc):
                raise self._too_long(path, line) from None
            raise self.error(path, line, f"invalid value {node.value!r}: {exc}") from None

    def _too_long(self, path: _Path, line: int) -> ConfigError:
        limit = sys.get_int_max_str_digits()
        return self.error(path, line, f"number too long (more than {limit} digits)")

    def _scalar(self, node: yaml.ScalarNode, path: _Path) -> Any:
        value = self._construct(node, path)
        if node.tag != _STR or not isinstance(value, str) or "$" not in value:
            return value
        line = node.start_mark.line + 1
        used_credential = False

        def replace(match: re.Match[str]) -> str:
            nonlocal used_credential
            if match["dollar"]:
                return "$"
            body = match["body"]
            if match["close"] is None:
                raise self.error(path, line, "unclosed '${' (write '$$' for a literal '$')")
            if body.startswith("credential:"):
                used_credential = True
                return self._credential(body.removeprefix("credential:"), path, line)
            env = _ENV_BODY.fullmatch(body)
            if env is None:
                raise self.error(path, line, f"invalid substitution '${{{body}}}'")
            env_value = os.environ.get(env["var"])
            if env["default"] is not None:
                return env_value or env["default"]
            if env_value is None:
                raise self.error(path, line, f"environment variable {env['var']} is not set")
            return env_value

        result = _SUBST.sub(replace, value)
        if node.style is not None or used_credential:
            return result
        try:
            return _plain_type(result)
        except ValueError:
            raise self._too_long(path, line) from None

    def _credential(self, name: str, path: _Path, line: int) -> str:
        if not _CRED_NAME.fullmatch(name) or name in (".", ".."):
            raise self.error(path, line, f"invalid credential name {name!r}")
        directory = os.environ.get("CREDENTIALS_DIRECTORY")
        if self.stand_in_credentials and not (directory and (Path(directory) / name).is_file()):
            return CREDENTIAL_STAND_IN
        if not directory:
            raise self.error(
                path, line, f"credential {name!r} needs $CREDENTIALS_DIRECTORY (systemd "
                "LoadCredential=), which is not set"
            )
        file = Path(directory) / name
        try:
            value = _read_credential(file).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(path, line, f"credential file {file} is not UTF-8 text") from None
        except _Unreadable as exc:
            raise self.error(path, line, f"credential file {file} {exc}") from None
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise self.error(path, line, f"cannot read credential file {file}: {reason}") from None
        value = value.removesuffix("\n")
        if value:
            self._secrets.add(value)
        return value

    def _redact(self, message: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            message = message.replace(secret, "<redacted>")
            message = message.replace(repr(secret)[1:-1], "<redacted>")
        return message


class _Unreadable(Exception):
    """A credential file edgeinfer will not read; the message says why."""


_KINDS = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
)


def _read_credential(file: Path) -> bytes:
    """The bytes of a regular file of at most `MAX_CREDENTIAL_BYTES`.

    Opened without blocking (a FIFO with no writer would wait forever) and checked on the open
    descriptor, so the file read is the file checked.
    """
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((k for test, k in _KINDS if test(mode)), "a special file")
            raise _Unreadable(f"is {kind}; a credential must be a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_CREDENTIAL_BYTES:  # the size now, not as fstat saw it
            chunk = os.read(fd, MAX_CREDENTIAL_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_CREDENTIAL_BYTES:
        raise _Unreadable(f"is larger than {MAX_CREDENTIAL_BYTES // 1024} KiB")
    return b"".join(chunks)


def _plain_type(text: str) -> Any:
    """Type an unquoted value after substitution, as YAML 1.2 (core schema) would."""
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text
