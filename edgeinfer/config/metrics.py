"""Typed config of the ``metrics:`` section: the optional Prometheus endpoint. Field names are a
contract."""

from __future__ import annotations

from ._types import ConfigStruct, Host, Port

__all__ = ["MetricsConfig"]


class MetricsConfig(ConfigStruct, frozen=True):
    """A Prometheus ``/metrics`` endpoint (needs the ``metrics`` extra).

    Attributes:
        enabled: Serve the endpoint (``false`` keeps the section but serves nothing).
        host: Address to bind; loopback by default. Bind ``0.0.0.0`` only on a trusted network:
            the endpoint has no authentication.
        port: TCP port.
    """

    enabled: bool = True
    host: Host = "127.0.0.1"
    port: Port = 9108
