"""The mqtt source against a real mosquitto on loopback, through a paho-mqtt subscriber."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest

from edgeinfer.config.pipeline import MqttSource as MqttConfig
from edgeinfer.errors import SourceError
from edgeinfer.frames import Frame
from edgeinfer.sources import open_source
from edgeinfer.sources.mqtt import MqttSource
from edgeinfer.testing.sensors import paho_subscriber, take


def test_readings_from_the_broker_become_windows(mqtt_broker: tuple[str, int]) -> None:
    host, port = mqtt_broker
    topic = f"test/{uuid.uuid4().hex}/env"
    payloads = [b'{"temp": 20.5, "hum": 40}', b"{not json", b'{"temp": 21}', b'{"temp": 22, "hum": 41}',
                b'{"temp": "warm", "hum": 1}', b"true", b"25", b"[23, 42]",
                b'{"hum": 43, "temp": 24, "x": 1}']
    with paho_subscriber(host, port) as client:
        config = MqttConfig(topic=topic, fields=["temp", "hum"], window=2, hop=1)
        with open_source(config, subscribe=client, camera="ignored") as src:
            frames: list[Frame] = []
            reader = threading.Thread(target=lambda: frames.extend(take(src, 3, timeout_s=10)))
            reader.start()
            for p in payloads:
                client.publish(topic, p, qos=1)
            reader.join(10)
    rows = [f.data.tolist() for f in frames]
    assert rows == [[[20.5, 40], [22, 41]], [[22, 41], [23, 42]], [[23, 42], [24, 43]]]
    assert all(f.kind == "series" and f.fields == ("temp", "hum") for f in frames)
    assert [f.index for f in frames] == [0, 1, 2] and frames[0].data.dtype == np.float32
    assert frames[0].start is not None and frames[0].start <= frames[1].start
    # not JSON, a missing key, a string, a bool, one value for two fields
    assert src.stats.corrupt == 5 and src.stats.skipped == 0


def test_an_mqtt_source_needs_a_subscribe_callable() -> None:
    with pytest.raises(SourceError, match="needs the mqtt: section"):
        open_source(MqttConfig(topic="a/b")).__enter__()


class _Subscription:
    """What a client hands the source: records calls, delivers payloads on demand."""

    def __init__(self) -> None:
        self.on_payload: Callable[[bytes], None] | None = None
        self.unsubscribed = False
        self.calls: list[tuple[str, int]] = []

    def __call__(self, topic: str, qos: int, on_payload: Callable[[bytes], None]
                 ) -> Callable[[], None]:
        self.calls.append((topic, qos))
        self.on_payload = on_payload
        return self.unsubscribe

    def unsubscribe(self) -> None:
        self.unsubscribed = True


def test_a_full_queue_drops_the_oldest_readings() -> None:
    sub = _Subscription()
    src = MqttSource(MqttConfig(topic="s/t", qos=0, window=2), subscribe=sub, queue_size=4)
    with src:
        assert sub.calls == [("s/t", 0)]
        assert sub.on_payload is not None
        for i in range(10):
            sub.on_payload(str(i).encode())
        frames = take(src, 2, timeout_s=5)
    assert [f.data[:, 0].tolist() for f in frames] == [[6, 7], [8, 9]]
    assert frames[0].fields == ("c0",)
    assert src.stats.skipped == 6 and sub.unsubscribed


def test_stop_ends_a_quiet_source_promptly() -> None:
    src = MqttSource(MqttConfig(topic="quiet"), subscribe=_Subscription())
    with src:
        threading.Timer(0.1, src.stop).start()
        t0 = time.monotonic()
        assert list(src) == []
    assert time.monotonic() - t0 < 20.0  # a quiet source never ends by itself: stop() ended it
