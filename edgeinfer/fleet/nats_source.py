"""The collector's NATS source: a JetStream durable pull consumer on the stream where
nats-server keeps its MQTT clients' QoS 1 messages (``$MQTT_msgs``, subjects
``$MQTT.msgs.<topic with / as .>``).

Devices publish over MQTT (3.1.1) to any node of a NATS cluster. Every collector binds the same
durable consumer (filter ``$MQTT.msgs.<prefix>.>``, explicit acks, ``ack_wait_s``): JetStream
splits the messages between them, and redelivers a message not acknowledged within
``ack_wait_s`` (a collector that died, a database that is down) to whichever asks next. A
message is acknowledged only after the collector committed it.

``$MQTT_msgs`` has *interest* retention: nats-server keeps a message only when a consumer's
filter matches it. The durable is created at the first start and outlives every collector, so
messages are kept while all collectors are down; messages published before the durable ever
existed are not kept (run ``edgeinfer collect`` once before the devices start).

Statuses: a device publishes its status retained with QoS 1, so those published while the
durable exists come through it like results. Those retained before it existed are read once at
`start` from ``$MQTT_rmsgs`` (nats-server's store of retained MQTT messages: one JSON document
per topic with the topic and the base64 payload) and delivered with no token (nothing to ack;
a status write is an idempotent "newest wins").

Topics: a NATS subject separates levels with ``.``, so ``.`` in an MQTT topic is ambiguous
(nats-server 2.9 refuses such topics and disconnects the publisher); a subject that does not
turn back into a device topic is delivered as rejected (acknowledged, never written). The
prefix itself must not contain ``.``.

A message that does not parse (anything it raises) is delivered as rejected, exactly as from
the MQTT source: the collector parks it and acknowledges it. If the loop thread ends while the
collector runs, `NatsSource.failure` says why and the collector stops: never up but deaf.

The nats-py client runs its asyncio loop in a thread of its own. `deliver` runs on a second
thread, one fetched batch at a time, so a blocked `deliver` (the collector's queue is full)
stops the fetching but not the connection's pings or the acks.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, SourceError
from .records import Delivery, Rejected, parse, rejection, source_of

if TYPE_CHECKING:
    from ..config.collect import NatsSourceConfig

__all__ = ["NatsSource", "subject_to_topic"]

logger = logging.getLogger(__name__)

MSGS_SUBJECT = "$MQTT.msgs."
RETAINED_STREAM = "$MQTT_rmsgs"
RETAINED_SUBJECT = "$MQTT.rmsgs"


def subject_to_topic(subject: str) -> str:
    """The MQTT topic of a ``$MQTT.msgs.`` subject (``.`` back to ``/``).

    Raises:
        Rejected: not a subject of nats-server's MQTT messages.
    """
    if not subject.startswith(MSGS_SUBJECT):
        raise Rejected("not an MQTT message subject")
    return subject[len(MSGS_SUBJECT):].replace(".", "/")


class NatsSource:
    """Reads device messages from a NATS JetStream cluster for a `Collector`.

    Args:
        config: The ``source:`` section (``type: nats``).
        fetch_batch: Messages asked for per pull request.
        max_ack_pending: Delivered and unacknowledged messages the durable allows, all
            collectors together (set when the durable is created).
        connect_timeout_s: How long `start` waits for the first connection and the durable.
        retained: Read the retained statuses from ``$MQTT_rmsgs`` at `start`.

    Raises:
        ConfigError: the prefix holds a ``.`` (ambiguous in a NATS subject).
    """

    def __init__(self, config: NatsSourceConfig, *, fetch_batch: int = 500,
                 max_ack_pending: int = 20_000, connect_timeout_s: float = 15.0,
                 retained: bool = True) -> None:
        if "." in config.prefix:
            raise ConfigError(f"$.source.prefix: {config.prefix!r} holds a '.', which NATS "
                              "subjects use between levels")
        self.config = config
        self.fetch_batch = fetch_batch
        self.max_ack_pending = max_ack_pending
        self.connect_timeout_s = connect_timeout_s
        self.retained = retained
        self.filter_subject = MSGS_SUBJECT + config.prefix.replace("/", ".") + ".>"
        self._deliver: Callable[[Delivery], None] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._bound = threading.Event()
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._acks: asyncio.Queue[Sequence[Any] | None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "nats-deliver")
        self._lock = threading.Lock()
        self._counts = {"fetched": 0, "redelivered": 0, "rejected": 0, "retained": 0,
                        "acks": 0, "ack_errors": 0, "fetch_errors": 0, "connects": 0,
                        "disconnects": 0}
        self._server = ""
        self._connected = False
        self.last_reject = ""
        self._failure: str | None = None

    def start(self, deliver: Callable[[Delivery], None]) -> None:
        """Connect, create or bind the durable, deliver the retained statuses, then fetch in
        the background until `stop` (nats-py reconnects to any node on its own).

        Raises:
            ConfigError: nats-py is not installed, already started, or the durable exists
                with another filter.
            SourceError: no server answered within ``connect_timeout_s``.
        """
        if self._thread is not None:
            raise ConfigError("NatsSource.start: already started")
        try:
            import nats  # noqa: F401
        except ImportError as exc:
            raise ConfigError("source.type nats needs nats-py; install it with "
                              "pip install 'edgeinfer[collect]'") from exc
        self._deliver = deliver
        self._thread = threading.Thread(target=self._run, name="nats-source", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.connect_timeout_s) and self._error is None:
            self._error = SourceError(f"no NATS server of {self.config.servers} answered "
                                      f"within {self.connect_timeout_s:.0f} s")
        if self._error is not None:
            self.stop()
            if isinstance(self._error, (ConfigError, SourceError)):
                raise self._error
            raise SourceError(f"NATS source: {self._error}") from self._error

    def wait_bound(self, timeout: float | None = None) -> bool:
        """Whether the durable consumer exists and is bound (within ``timeout`` s): from then
        on the stream keeps every device message for the collectors."""
        return self._bound.wait(timeout)

    def ack(self, tokens: Sequence[Any]) -> None:
        """Acknowledge delivered messages (after the commit), in the order given; ``None``
        tokens (retained statuses) are skipped. Returns at once: the loop thread sends them."""
        loop, acks = self._loop, self._acks
        if loop is None or acks is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(acks.put_nowait, tokens)
        except RuntimeError:  # the loop closed meanwhile: JetStream redelivers
            pass

    def stop(self) -> None:
        """Stop fetching, send the acknowledgements in hand, close the connection."""
        self._stopping.set()
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(3 if self._ready.is_set() else 0.1)
            task = self._task
            if thread.is_alive() and loop is not None and task is not None:
                # Still connecting (every server down): nothing to flush, give up on it.
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:
                    pass
                thread.join(5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        """Counters (fetched, redelivered, rejected, retained statuses read, acks sent, fetch
        errors, connects, disconnects), the server connected to, whether connected now and
        whether the durable is bound."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
        out["server"] = self._server
        out["connected"] = self._connected and self._failure is None
        out["bound"] = self._bound.is_set()
        out["durable"] = self.config.durable
        return out

    def failure(self) -> str | None:
        """Why the loop thread ended while not stopping, or ``None``."""
        return self._failure

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self._main())
            loop.run_until_complete(self._task)
        except BaseException as exc:  # handed to start(), or logged: the thread ends here
            if not self._ready.is_set():
                self._error = exc
            else:
                logger.error("NATS source stopped: %s", exc)
                self._failure = f"{type(exc).__name__}: {exc}"
        finally:
            loop.close()
            if self._ready.is_set() and not self._stopping.is_set() and self._failure is None:
                self._failure = "the NATS loop thread ended"

    async def _main(self) -> None:
        self._wake = asyncio.Event()
        self._acks = asyncio.Queue()
        nc = await self._connect()
        try:
            js = nc.jetstream()
            await self._bind(js)
            if self._stopping.is_set():
                return
            sub = await js.pull_subscribe_bind(self.config.durable, self.config.stream)
            self._bound.set()
            if self.retained:
                await self._read_retained(js)
            self._ready.set()
            acker = asyncio.ensure_future(self._ack_loop())
            await self._fetch_loop(js, sub)
            self._acks.put_nowait(None)
            await acker
        finally:
            await self._close(nc)

    async def _connect(self) -> Any:
        import nats

        c = self.config

        async def connected() -> None:
            self._count("connects")
            self._connected = True
            self._server = str(nc.connected_url.netloc if nc.connected_url else "")
            logger.info("NATS connected to %s", self._server)

        async def disconnected() -> None:
            self._count("disconnects")
            self._connected = False
            logger.warning("NATS disconnected from %s", self._server)

        async def error(exc: Exception) -> None:
            logger.debug("NATS client error: %s", exc)

        nc = await nats.connect(servers=list(c.servers), user=c.user, password=c.password,
                                token=c.token, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                connect_timeout=2, allow_reconnect=True, name="edgeinfer-collect",
                                reconnected_cb=connected, disconnected_cb=disconnected,
                                error_cb=error)
        await connected()
        return nc

    async def _bind(self, js: Any) -> None:
        """Create or check the durable; while the stream is missing (nats-server makes it when
        the first MQTT client connects) `start` returns and this waits for it."""
        from nats.js.errors import NotFoundError

        while not self._stopping.is_set():
            try:
                await self._ensure_durable(js)
                return
            except NotFoundError:
                if not self._ready.is_set():
                    logger.info("waiting for the stream %s (nats-server creates it when the "
                                "first MQTT client connects)", self.config.stream)
                    self._ready.set()
                await self._pause(0.5)

    async def _ensure_durable(self, js: Any) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        c = self.config
        try:
            info = await js.consumer_info(c.stream, c.durable)
        except NotFoundError:
            config = ConsumerConfig(durable_name=c.durable, ack_policy=AckPolicy.EXPLICIT,
                                    deliver_policy=DeliverPolicy.ALL, ack_wait=c.ack_wait_s,
                                    filter_subject=self.filter_subject, max_deliver=-1,
                                    max_ack_pending=self.max_ack_pending)
            info = await js.add_consumer(c.stream, config)
            logger.info("created the durable consumer %s on %s (filter %s)", c.durable, c.stream,
                        self.filter_subject)
        if info.config.filter_subject != self.filter_subject:
            raise ConfigError(f"$.source.durable: the durable {c.durable!r} on {c.stream} "
                              f"filters {info.config.filter_subject!r}, not "
                              f"{self.filter_subject!r}; give this prefix another durable")

    async def _read_retained(self, js: Any) -> None:
        from nats.js.errors import NotFoundError

        try:
            info = await js.stream_info(RETAINED_STREAM)
        except NotFoundError:
            return  # no MQTT client has retained anything yet
        left = info.state.messages
        if not left:
            return
        sub = await js.subscribe(RETAINED_SUBJECT, stream=RETAINED_STREAM, ordered_consumer=True)
        try:
            while left > 0:
                msg = await sub.next_msg(timeout=5)
                left = msg.metadata.num_pending
                delivery = self._retained(msg.data)
                if delivery is not None:
                    await self._hand_over([delivery])
        finally:
            await sub.unsubscribe()

    def _retained(self, data: bytes) -> Delivery | None:
        try:
            doc = json.loads(data)
            topic, payload = doc["topic"], base64.b64decode(doc.get("msg") or "")
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None  # another nats-server version's format: statuses come through the durable
        if not isinstance(topic, str) or not payload:
            return None
        levels = topic.split("/")
        if len(levels) < 2 or levels[-1] != "status" or not topic.startswith(self.config.prefix
                                                                               + "/"):
            return None
        try:
            record = parse(topic, payload, self.config.prefix, time.time())
        except Exception:  # a retained status that is no status: no token, nothing to park
            return None
        self._count("retained")
        return Delivery(record, None)

    async def _fetch_loop(self, js: Any, sub: Any) -> None:
        import nats.errors
        import nats.js.errors

        assert self._wake is not None
        while not self._stopping.is_set():
            try:
                msgs = await sub.fetch(self.fetch_batch, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                self._count("fetch_errors")
                logger.debug("NATS fetch failed (%s); trying again", exc)
                if isinstance(exc, nats.js.errors.NotFoundError):
                    await self._rebind(js)
                await self._pause(0.5)
                continue
            if msgs:
                await self._hand_over([self._delivery(m) for m in msgs])

    async def _rebind(self, js: Any) -> None:
        # The durable was deleted (a stream recreated): make it again; fetch uses its name.
        try:
            await self._ensure_durable(js)
        except Exception as exc:  # tried again at the next failed fetch
            logger.warning("NATS durable %s not recreated: %s", self.config.durable, exc)

    async def _pause(self, seconds: float) -> None:
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            pass

    def _delivery(self, msg: Any) -> Delivery:
        received = time.time()
        redelivered = msg.metadata.num_delivered > 1
        self._count("fetched")
        if redelivered:
            self._count("redelivered")
        try:
            record = parse(subject_to_topic(msg.subject), msg.data, self.config.prefix, received)
        except Exception as exc:  # whatever one message makes parse raise: that message's fault
            self._count("rejected")
            parked = rejection(str(msg.subject), msg.data or b"", exc, received,
                               source_of(str(msg.subject).removeprefix(MSGS_SUBJECT)
                                         .replace(".", "/"), self.config.prefix))
            self.last_reject = f"{msg.subject}: {parked.reason}"
            return Delivery(None, msg, redelivered, parked)
        return Delivery(record, msg, redelivered)

    async def _hand_over(self, deliveries: list[Delivery]) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._deliver_all, deliveries)
        except RuntimeError:  # executor shut down by stop(): JetStream redelivers
            pass

    def _deliver_all(self, deliveries: list[Delivery]) -> None:
        deliver = self._deliver
        assert deliver is not None
        for delivery in deliveries:
            if self._stopping.is_set():
                return
            deliver(delivery)

    async def _ack_loop(self) -> None:
        assert self._acks is not None
        while True:
            tokens = await self._acks.get()
            if tokens is None:
                return
            sent = 0
            for token in tokens:
                if token is None:
                    continue
                try:
                    await token.ack()
                    sent += 1
                except Exception as exc:  # left unacked: JetStream redelivers it
                    self._count("ack_errors")
                    logger.debug("NATS ack failed: %s", exc)
            self._count("acks", sent)

    async def _close(self, nc: Any) -> None:
        try:
            await nc.flush(timeout=2)
        except Exception:
            pass
        try:
            await nc.close()
        except Exception:
            pass
