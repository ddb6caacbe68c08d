"""At ``http.max_connections`` the guard makes room with a flooding address's connection, not
with a client's only one whose request is not read yet (``web/guard.py``)."""

from __future__ import annotations

from typing import Any

from edgeinfer.web.guard import ConnectionGuard


class _Conn:
    def __init__(self, guard: ConnectionGuard, client: str) -> None:
        self.guard, self.client, self.head_bytes, self.dropped = guard, client, 0, False

    def drop(self) -> None:
        self.dropped = True
        self.guard.gone(self)  # type: ignore[arg-type]


def _admit(guard: ConnectionGuard, client: str) -> Any:
    conn = _Conn(guard, client)
    assert guard.admit(conn)  # type: ignore[arg-type]
    return conn


def test_a_full_server_evicts_a_flooders_connection_before_a_lone_clients() -> None:
    guard = ConnectionGuard(4, 10, 10.0, 8192, 65536, 1 << 20)
    legit = _admit(guard, "10.0.0.1")  # the oldest, its request not read yet
    flood = [_admit(guard, "10.0.0.9") for _ in range(3)]
    newcomer = _admit(guard, "10.0.0.9")
    assert not legit.dropped and flood[0].dropped and not newcomer.dropped
    assert guard.counts["evicted_idle"] == 1


def test_with_one_connection_per_address_the_oldest_waiting_goes() -> None:
    guard = ConnectionGuard(3, 10, 10.0, 8192, 65536, 1 << 20)
    conns = [_admit(guard, f"10.0.0.{i}") for i in range(3)]
    _admit(guard, "10.0.0.99")
    assert [c.dropped for c in conns] == [True, False, False]
