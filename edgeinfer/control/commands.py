"""Commands on ``<prefix>/<dev>/cmd/<verb>``, answered on ``.../cmd/<verb>/reply``.

A request is a JSON object (an empty payload counts as ``{}``); its ``id`` comes back in the
reply. When an MQTT 5 requester sets a response topic and correlation data, the reply goes
there with the same correlation data. Every reply is ``{"id", "ok": true, "result": {...}}`` or
``{"id", "ok": false, "error": "..."}``. Malformed JSON, unknown verbs, wrong types and oversize
payloads get an error reply and are counted; the daemon is unaffected. Handlers run on one
worker thread, never on the MQTT client's network thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import EdgeInferError
from ..queues import Closed, DropOldestQueue

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class CommandError(EdgeInferError):
    """A command that cannot be carried out; its message is the error reply."""


class CommandServer:
    """Subscribes to the command topics of ``client`` and answers with ``handlers``.

    Args:
        client: An ``edgeinfer.mqtt.client.MqttClient`` (or anything with its ``subscribe``,
            ``publish`` and ``topics``).
        handlers: verb -> handler taking the request object and returning the result object.
        max_bytes: Larger payloads are refused unread.
    """

    def __init__(self, client: Any, handlers: Mapping[str, Handler], *,
                 max_bytes: int = 65536) -> None:
        self.client = client
        self.handlers = dict(handlers)
        self.max_bytes = max_bytes
        self.received = 0
        self.errors = 0
        self._queue: DropOldestQueue = DropOldestQueue(32, drop=True)
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="edgeinfer-commands",
                                        daemon=True)
        self._thread.start()
        self._unsubscribe = self.client.subscribe(self.client.topics.commands, 1, self._enqueue)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._queue.close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def stats(self) -> dict[str, int]:
        return {"received": self.received, "errors": self.errors}

    def _enqueue(self, message: Any) -> None:
        try:
            if self._queue.put(message):
                self.errors += 1  # the oldest pending command was dropped: a flood
        except Closed:
            pass

    def _work(self) -> None:
        while True:
            try:
                message = self._queue.get()
            except Closed:
                return
            self.received += 1
            verb = message.topic.rsplit("/", 1)[-1]
            request_id, reply = self.handle(verb, message.payload)
            if not reply.get("ok"):
                self.errors += 1
            self._reply(verb, message, request_id, reply)

    def handle(self, verb: str, payload: bytes) -> tuple[Any, dict[str, Any]]:
        """Answer one request; returns ``(id, reply)``. Never raises."""
        if len(payload) > self.max_bytes:
            return None, _error(None, f"payload of {len(payload)} bytes is over the "
                                      f"{self.max_bytes}-byte limit")
        try:
            request = json.loads(payload) if payload.strip() else {}
        except (ValueError, UnicodeDecodeError) as exc:
            return None, _error(None, f"malformed JSON: {exc}")
        if not isinstance(request, dict):
            return None, _error(None, f"expected a JSON object, got {type(request).__name__}")
        request_id = request.pop("id", None)
        handler = self.handlers.get(verb)
        if handler is None:
            return request_id, _error(request_id, f"unknown command {verb!r}; valid: "
                                                  f"{', '.join(sorted(self.handlers))}")
        try:
            result = handler(request)
        except EdgeInferError as exc:
            return request_id, _error(request_id, str(exc))
        except Exception as exc:  # a handler bug must not take the command thread down
            logger.exception("command %s failed", verb)
            return request_id, _error(request_id, f"internal error: {type(exc).__name__}: {exc}")
        return request_id, {"id": request_id, "ok": True, "result": result}

    def _reply(self, verb: str, message: Any, request_id: Any, reply: dict[str, Any]) -> None:
        topic = getattr(message, "response_topic", None) or self.client.topics.reply(verb)
        properties = None
        correlation = getattr(message, "correlation_data", None)
        if correlation is not None:
            properties = {"correlation_data": correlation}
        self.client.publish(topic, json.dumps(reply, default=str), qos=1,
                            properties=properties)


def _error(request_id: Any, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": message}


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
