"""The systemd sandbox's network side, made from the config: which ports the daemon binds.

The unit (``systemd/edgeinfer.service``) cannot know the ports a config listens on (the web
view, the metrics endpoint, an embedded broker), so ``edgeinfer validate-config
--systemd-dropin CONFIG`` writes a drop-in that allows binding exactly those and denies every
other port (``SocketBindDeny=any``: systemd 249+ with cgroup v2). ``scripts/install.sh``
installs it as ``edgeinfer.service.d/50-listen.conf``; run it again after changing a port.
Outgoing connections (the broker, cameras) bind no port and are not affected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["listen_ports", "socket_bind_dropin"]


def listen_ports(config: Config) -> list[tuple[int, str]]:
    """The TCP ports ``config`` makes the daemon listen on, with what listens (sorted)."""
    ports: dict[int, str] = {}
    if config.http is not None:
        ports[config.http.port] = "web view (http.port)"
    if config.metrics is not None and config.metrics.enabled:
        ports.setdefault(config.metrics.port, "metrics (metrics.port)")
    if config.mqtt is not None and config.mqtt.embedded:
        ports.setdefault(config.mqtt.resolved_port(), "embedded broker (mqtt.port)")
    return sorted(ports.items())


def socket_bind_dropin(config: Config, source: str = "the config") -> str:
    """A systemd drop-in that lets the service bind exactly ``config``'s ports."""
    lines = [f"# Made by `edgeinfer validate-config --systemd-dropin` from {source}: the service",
             "# may bind these TCP ports and no other (make it again after changing a port).",
             "[Service]", "SocketBindDeny=any"]
    for port, what in listen_ports(config):
        lines.append(f"# {what}")
        lines.append(f"SocketBindAllow=tcp:{port}")
    return "\n".join(lines) + "\n"
