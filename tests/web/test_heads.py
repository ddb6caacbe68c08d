"""Half-sent request heads (issue 31 item 8): clients that send large headers and never finish
the head must not grow the web server's memory, per connection, per address or in total, and
a legitimate request is still answered. A real `WebServer` (aiohttp) in this process, raw
sockets from other loopback addresses (127.0.0.0/8), RSS read from /proc/self."""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from webclient import Client, Host

from edgeinfer._net import free_port
from edgeinfer.config.http import HttpConfig
from edgeinfer.web import WebServer

LEGIT_S = 1.5  # a legitimate request during the attack is answered within this


@pytest.fixture
def start() -> Iterator[Any]:
    started: list[WebServer] = []

    def make(**options: Any) -> WebServer:
        config = msgspec.convert({"port": free_port(), "header_timeout_s": 60, **options},
                                 HttpConfig)
        server = WebServer(config, Host([]))
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def _kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/self/status")


def _open(server: WebServer, count: int, addresses: int, prefix: str) -> list[socket.socket]:
    port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5,
                                        source_address=(f"{prefix}.{i % addresses + 1}", 0))
        sock.setblocking(False)
        socks.append(sock)
    return socks


def _send_heads(socks: list[socket.socket], size: int, within: float) -> int:
    """Send each socket ``size`` bytes of a request head that never ends (8,000-byte header
    lines), round robin, until all is sent or the server closed it; bytes sent in all."""
    head = b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    line = b"X-Pad-%04d: " + b"a" * 7984 + b"\r\n"
    while len(head) < size:
        head += line % (len(head) // 8000)
    whole = memoryview(head)[:size]  # one copy for all sockets: this process is measured
    todo = {sock: whole for sock in socks}
    sent = 0
    deadline = time.monotonic() + within
    while todo and time.monotonic() < deadline:
        for sock, rest in list(todo.items()):
            try:
                n = sock.send(rest[:65536])
            except BlockingIOError:
                continue
            except OSError:  # closed by the server
                del todo[sock]
                continue
            sent += n
            if n == len(rest):
                del todo[sock]
            else:
                todo[sock] = rest[n:]
        time.sleep(0.001)
    return sent


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b"" or _answered(sock)
    except BlockingIOError:
        return False
    except OSError:
        return True


def _answered(sock: socket.socket) -> bool:
    return sock.recv(65536, socket.MSG_PEEK).startswith((b"HTTP/1.1 431", b"HTTP/1.1 503"))


def _settled(within: float) -> int:
    """The peak RSS (KiB) once it has stopped growing for 1 s (or ``within`` passed)."""
    deadline = time.monotonic() + within
    peak, since = _kib("VmHWM"), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < 1.0:
        time.sleep(0.1)
        now = _kib("VmHWM")
        if now > peak:
            peak, since = now, time.monotonic()
    return peak


def _legit(server: WebServer) -> float:
    started = time.monotonic()
    reply = Client(server).get("/v1/status")
    assert reply.status == 200, reply.body[:200]
    return time.monotonic() - started


def test_a_megabyte_of_headers_per_connection_does_not_grow_memory(start: Any) -> None:
    """The issue's attack scaled to 100 connections from 20 addresses, 1 MiB of headers each
    (aiohttp's own caps let 128 lines of 8 KiB through: about 1 MiB a head)."""
    server = start(max_connections=400)  # the head limits are the defaults
    _legit(server)
    gc.collect()
    idle = _kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    socks = _open(server, 100, 20, "127.31.0")
    try:
        sent = _send_heads(socks, 1 << 20, 20)
        peak = _settled(10)
        took = _legit(server)
        closed = sum(_closed(s) for s in socks)
        stats = server.stats()["connections"]
    finally:
        for sock in socks:
            sock.close()
    grown = peak - idle
    print(f"RSS idle {idle} KiB, peak {peak} KiB (+{grown}); {sent >> 10} KiB sent; "
          f"{closed}/100 closed; legitimate request {took:.3f} s; {stats}")
    # Each head is refused at 32 KiB: 100 of them hold at most 3.2 MiB (a few copies of it in
    # the parser); the old server took the whole megabyte of each, several copies over.
    assert grown < 24 * 1024, f"RSS grew {grown} KiB under 100 half-sent 1 MiB heads"
    assert closed == 100 and stats["heads_too_large"] == 100
    assert stats["head_bytes"] == 0 and stats["head_bytes_peak"] <= 4 << 20
    assert took < LEGIT_S


def test_half_sent_heads_are_bounded_per_address_and_in_total(start: Any) -> None:
    """Heads under the per-connection limit, many of them: the oldest go, first those of an
    address past its share, then any past the total, and a new request finds room."""
    server = start(max_connections=400, max_header_bytes=16 << 10,
                   max_header_bytes_per_client=64 << 10, max_header_bytes_total=512 << 10)
    greedy = _open(server, 10, 1, "127.32.0")  # one address, 10 x 12 KiB > 64 KiB
    many = _open(server, 120, 60, "127.33.0")  # 60 addresses, 120 x 12 KiB = 1.4 MiB
    fits = (512 << 10) // (12 << 10)  # 42 heads of 12 KiB in the total
    try:
        _send_heads(greedy, 12 << 10, 10)
        _wait(server, "heads_closed_per_client", 5)  # 5 fit in 64 KiB
        assert sum(_closed(s) for s in greedy) == 5
        _send_heads(many[:100], 12 << 10, 10)
        _wait(server, "heads_closed_total", 105 - fits)
        _send_heads(many[100:], 12 << 10, 10)  # the newest 20: room is made for them
        _wait(server, "heads_closed_total", 125 - fits)
        took = _legit(server)
        stats = server.stats()["connections"]
        print(f"legitimate request {took:.3f} s; {stats}")
        assert stats["head_bytes"] <= 512 << 10 and stats["head_bytes_peak"] <= 512 << 10
        assert not any(_closed(s) for s in many[100:])
        assert took < LEGIT_S
    finally:
        for sock in greedy + many:
            sock.close()


def _wait(server: WebServer, count: str, at_least: int) -> None:
    deadline = time.monotonic() + 10
    while server.stats()["connections"][count] < at_least:
        assert time.monotonic() < deadline, (count, at_least, server.stats()["connections"])
        time.sleep(0.05)


def test_a_head_limit_never_passes_the_one_outside_it(start: Any) -> None:
    server = start(max_header_bytes=65536, max_header_bytes_per_client=4096,
                   max_header_bytes_total=2048)
    stats = server.stats()["connections"]
    assert (stats["max_header_bytes"], stats["max_header_bytes_per_client"],
            stats["max_header_bytes_total"]) == (2048, 2048, 2048)
    socks = _open(server, 1, 1, "127.34.0")
    try:
        _send_heads(socks, 4096, 5)
        _wait(server, "heads_too_large", 1)
    finally:
        socks[0].close()
