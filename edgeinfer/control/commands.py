"""Commands on ``<prefix>/<dev>/cmd/<verb>``, answered on ``.../cmd/<verb>/reply``.

A request is a JSON object; its ``id`` comes back in the reply. When an MQTT 5 requester sets a
response topic and correlation data, the reply goes there with the same correlation data, if
that topic is in the reply namespace (``mqtt.topics.check_response_topic``); otherwise the
command is refused on the default reply topic. Every reply is ``{"id", "ok": true, "result":
{...}}`` or ``{"id", "ok": false, "error": "..."}``.

Each message is handled in isolation: malformed or too deeply nested JSON, an oversize payload,
an invalid verb, a verb the policy does not allow, an unsigned or replayed command where a
signature is required, and any exception of a handler get an error reply, a (rate-limited) log
line and a count; the worker thread lives on. Retained messages and empty payloads are never
run: a retained command would run again at every start and reconnect, and clearing it (an
empty retained payload) is not a request. Handlers run on one worker thread, never on the MQTT
client's network thread; if that thread ever ends, `CommandServer.problem` says why.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import msgspec

from .. import _json
from ..config.commands import CommandsConfig
from ..config.mqtt import MqttConfig
from ..errors import EdgeInferError
from ..mqtt.client import Message, MqttClient
from ..mqtt.topics import check_response_topic, is_verb
from ..queues import Closed, DropOldestQueue

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]

MAX_DEPTH = 16  # JSON nesting a request may have; deeper is refused before it is parsed
_LOG_BURST = 10  # failures logged per _LOG_WINDOW_S; the rest are counted, then summed up
_LOG_WINDOW_S = 60.0
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


class CommandError(EdgeInferError):
    """A command that cannot be carried out; its message is the error reply."""


class Opener(Protocol):
    """Checks the signature of a signed command (see ``control.signed.SignedCommands``)."""

    def open(self, verb: str, request: dict[str, Any]) -> dict[str, Any]: ...


class CommandServer:
    """Subscribes to the command topics of ``client`` and answers with ``handlers``.

    Args:
        client: An ``edgeinfer.mqtt.client.MqttClient`` (or anything with its ``subscribe``,
            ``publish`` and ``topics``).
        handlers: verb -> handler taking the request object and returning the result object.
        max_bytes: Larger payloads are refused unread.
        allow: The verbs answered (default: every handler).
        signed: Verbs that run only when ``opener`` accepts their signature.
        opener: Checks signed commands; required when ``signed`` is not empty.
    """

    def __init__(self, client: MqttClient, handlers: Mapping[str, Handler], *,
                 max_bytes: int = 65536, allow: Collection[str] | None = None,
                 signed: Collection[str] = (), opener: Opener | None = None) -> None:
        if signed and opener is None:
            raise ValueError("signed verbs need an opener to check their signatures")
        self.client = client
        self.handlers = dict(handlers)
        self.max_bytes = max_bytes
        self.allow = frozenset(self.handlers if allow is None else allow)
        self.signed = frozenset(signed)
        self.opener = opener
        self.received = 0
        self.errors = 0
        self.ignored = 0  # retained messages, never run
        self.died: str | None = None
        self._queue: DropOldestQueue = DropOldestQueue(32, drop=True)
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._log = _Throttle()

    def listen(self) -> None:
        """Subscribe: commands from now on are queued (up to 32), answered once `start` runs.

        The daemon listens before its pipelines start and serves after: a client that sends a
        command on seeing the first result (published before the birth) is answered, not lost.
        """
        if self._unsubscribe is None:
            self._unsubscribe = self.client.subscribe(self.client.topics.commands, 1,
                                                      self._enqueue)

    def start(self) -> None:
        """Answer commands (the queued ones first); subscribes if `listen` did not."""
        self._thread = threading.Thread(target=self._work, name="edgeinfer-commands",
                                        daemon=True)
        self._thread.start()
        self.listen()

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._queue.close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def problem(self) -> str | None:
        """Why commands are no longer answered (the worker thread ended), or ``None``."""
        if self.died is None and self._thread is not None and not self._thread.is_alive():
            self.died = "ended"
        return None if self.died is None else f"command thread died: {self.died}"

    def stats(self) -> dict[str, Any]:
        state = ("dead" if self.problem() else "starting" if self._thread is None
                 else "running")
        return {"received": self.received, "errors": self.errors, "ignored": self.ignored,
                "state": state, "waiting": len(self._queue)}

    # -- network thread: keep it short ---------------------------------------------------------
    def _enqueue(self, message: Message) -> None:
        if message.retain:  # a stored command: it would act again at every (re)connect
            self.ignored += 1
            self._log.warn("ignored a retained command on %s (commands are never retained; "
                           "clear it with an empty retained message)", message.topic[:200])
            return
        size = len(message.payload)
        kept: Message | _Oversize = message
        if size > self.max_bytes:  # keep the size, not the bytes
            kept = _Oversize(message.topic, message.response_topic, message.correlation_data,
                             size)
        try:
            if self._queue.put(kept):
                self.errors += 1  # the oldest pending command was dropped: a flood
        except Closed:
            pass

    # -- worker thread --------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            while True:
                try:
                    message = self._queue.get()
                except Closed:
                    return
                self._serve(message)
        except BaseException as exc:  # _serve catches every Exception; this is the last word
            self.died = f"{type(exc).__name__}: {exc}"
            logger.critical("the command thread died (%s); commands are no longer answered",
                            self.died, exc_info=True)

    def _serve(self, message: Message | _Oversize) -> None:
        self.received += 1
        verb = message.topic.rsplit("/", 1)[-1]
        topics = self.client.topics
        topic, reply = (topics.reply(verb) if is_verb(verb) else topics.invalid_reply), None
        try:
            topic, reply = self._answer(verb, message)
        except Exception as exc:  # a bug anywhere in answering must not end the thread
            logger.exception("command %s failed", verb[:40])
            reply = _error(None, f"internal error: {type(exc).__name__}")
        if not reply.get("ok"):
            self.errors += 1
            self._log.warn("command %s refused: %s", verb[:40], str(reply.get("error"))[:300])
        try:
            self._reply(topic, message, reply)
        except Exception:
            logger.exception("reply to command %s on %s failed", verb[:40], topic[:200])

    def _answer(self, verb: str, message: Message | _Oversize) -> tuple[str, dict[str, Any]]:
        """``(reply topic, reply)`` of one message."""
        topics = self.client.topics
        if not is_verb(verb):
            return topics.invalid_reply, _error(
                None, f"invalid command verb {verb[:40]!r}: a verb is [a-z0-9_-], 1 to 32 long")
        topic = topics.reply(verb)
        if message.response_topic is not None:
            try:
                topic = check_response_topic(message.response_topic)
            except ValueError as exc:
                return topic, _error(None, f"command not run: {exc}")
        if isinstance(message, _Oversize):
            return topic, _error(None, f"payload of {message.size} bytes is over the "
                                       f"{self.max_bytes}-byte limit")
        return topic, self.handle(verb, message.payload)[1]

    def handle(self, verb: str, payload: bytes) -> tuple[Any, dict[str, Any]]:
        """Answer one request; returns ``(id, reply)``. Never raises for a bad request."""
        if len(payload) > self.max_bytes:
            return None, _error(None, f"payload of {len(payload)} bytes is over the "
                                      f"{self.max_bytes}-byte limit")
        try:
            request = decode_request(payload)
        except CommandError as exc:
            return None, _error(None, str(exc))
        request_id = request.pop("id", None)
        try:
            result = self._run(verb, request)
        except EdgeInferError as exc:
            return request_id, _error(request_id, str(exc))
        except Exception as exc:  # a handler bug must not take the command thread down
            logger.exception("command %s failed", verb)
            return request_id, _error(request_id, f"internal error: {type(exc).__name__}: {exc}")
        return request_id, {"id": request_id, "ok": True, "result": result}

    def _run(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        handler = admit(verb, self.handlers, self.allow)
        if verb in self.signed or "signature" in request:
            if self.opener is None:
                raise CommandError(f"command {verb!r} is signed, but this device takes no "
                                   "signed commands (mqtt.commands.signed)")
            request = self.opener.open(verb, request)
        return handler(request)

    def _reply(self, topic: str, message: Message | _Oversize, reply: dict[str, Any]) -> None:
        properties = None
        if message.correlation_data is not None:
            properties = {"correlation_data": message.correlation_data}
        self.client.publish(topic, json.dumps(reply, default=str), qos=1,
                            properties=properties)


def command_policy(mqtt: MqttConfig | None) -> CommandsConfig | None:
    """The command policy in force: ``mqtt.commands`` (``true``: all defaults), every verb
    when there is no ``mqtt:`` section; ``None`` when commands are off."""
    commands = mqtt.commands if mqtt is not None else True
    if commands is False:
        return None
    return CommandsConfig() if commands is True else commands


def admit(verb: str, handlers: Mapping[str, Handler], allow: Collection[str]) -> Handler:
    """The handler of ``verb`` when the policy lets it run (its signature aside).

    Raises:
        CommandError: an unknown verb, or one not in ``allow``.
    """
    handler = handlers.get(verb)
    if handler is None:
        raise CommandError(f"unknown command {verb!r}; valid: {', '.join(sorted(allow)) or 'none'}")
    if verb not in allow:
        raise CommandError(f"command {verb!r} is not allowed on this device "
                           f"(mqtt.commands.allow: {', '.join(sorted(allow)) or 'none'})")
    return handler


def run_unsigned(handlers: Mapping[str, Handler], policy: CommandsConfig | None, verb: str,
                 request: dict[str, Any]) -> dict[str, Any]:
    """Run a command that arrived without a way to check a signature (the web view): the
    MQTT policy applies, and the verbs it wants signed are refused.

    Raises:
        CommandError: an unknown, disallowed or signed-only verb, or a bad request.
    """
    handler = admit(verb, handlers, policy.allow if policy is not None else ())
    if policy is not None and verb in policy.signed:
        raise CommandError(f"command {verb!r} must be signed on this device "
                           "(mqtt.commands.signed): send it over MQTT")
    return handler(dict(request))


def decode_request(payload: bytes | str) -> dict[str, Any]:
    """A request's JSON object, refused before parsing if nested deeper than `MAX_DEPTH`.

    Raises:
        CommandError: empty, malformed, too deep, or not an object.
    """
    data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
    if not data.strip():
        raise CommandError("an empty payload is not a command: send a JSON object, e.g. {}")
    if too_deep(data, MAX_DEPTH):
        raise CommandError(f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        request = _json.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise CommandError(f"malformed JSON: {exc}") from None
    if not isinstance(request, dict):
        raise CommandError(f"expected a JSON object, got {type(request).__name__}")
    return request


def too_deep(data: bytes, limit: int) -> bool:
    """Whether the arrays and objects of JSON text ``data`` nest deeper than ``limit`` (brackets
    inside strings do not count). A linear scan that never recurses."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    depth = 0
    for match in _JSON_TOKENS.finditer(data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


class _Oversize:
    """A message whose payload was too large to keep: what is needed to refuse it."""

    __slots__ = ("topic", "response_topic", "correlation_data", "size")

    def __init__(self, topic: str, response_topic: str | None, correlation_data: bytes | None,
                 size: int) -> None:
        self.topic = topic
        self.response_topic = response_topic
        self.correlation_data = correlation_data
        self.size = size


class _Throttle:
    """Warnings about refused commands, at most `_LOG_BURST` per window: any client on the
    broker can send them, and a flood must not flood the journal."""

    def __init__(self) -> None:
        self._window = 0.0
        self._logged = 0
        self._skipped = 0

    def warn(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window > _LOG_WINDOW_S:
            if self._skipped:
                logger.warning("%d more command warnings were not logged", self._skipped)
            self._window, self._logged, self._skipped = now, 0, 0
        if self._logged < _LOG_BURST:
            self._logged += 1
            logger.warning(msg, *args)
        else:
            self._skipped += 1


def _error(request_id: Any, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": message}


def no_other_args(request: dict[str, Any], verb: str) -> None:
    """Refuse a request that still holds fields ``verb`` does not take (a typo is no default).

    Raises:
        CommandError: naming them.
    """
    if request:
        names = ", ".join(sorted(str(k)[:40] for k in request)[:10])
        raise CommandError(f"{verb} does not take {names}")


def pipeline_arg(request: dict[str, Any], names: list[str], *, required: bool) -> str | None:
    """The request's ``pipeline`` checked against ``names`` (``None``: all, when allowed)."""
    name = request.pop("pipeline", None)
    if name is None:
        if required and len(names) != 1:
            raise CommandError(f"give a pipeline: one of {', '.join(names)}")
        return names[0] if required else None
    if not isinstance(name, str):
        raise CommandError(f"pipeline: expected a string, got {type(name).__name__}")
    if name not in names:
        raise CommandError(f"no pipeline {name!r}; running: {', '.join(names) or 'none'}")
    return name
