"""A real nats-server cluster with JetStream (and MQTT) on free loopback ports, for tests.

    with NatsCluster(tmp_path, nodes=3) as cluster:
        nats.connect(servers=cluster.client_urls)
        paho_client.connect("127.0.0.1", cluster.mqtt_ports[1])
        cluster.kill(0)      # SIGKILL, as a crash
        cluster.restart(0)   # same ports, same JetStream folder

Every node has its own config, JetStream folder and log under ``folder``, a unique
``server_name`` and fixed ports chosen at construction, so a restarted node rejoins the cluster
where it was. JetStream replicates its streams over the cluster (R3 needs three nodes); the
MQTT streams nats-server creates (``$MQTT_msgs``, ``$MQTT_rmsgs``, ``$MQTT_sess``) get
``mqtt_replicas`` replicas, so that a device's QoS 1 messages survive one node's death.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .._net import free_port
from .procs import stop_process

__all__ = ["NatsCluster"]


class NatsCluster:
    """Start ``nodes`` nats-server processes routed into one cluster; stop them on exit.

    Args:
        folder: Where each node's config, JetStream store and log go (``n0/``, ``n1/``, ...).
        nodes: How many nodes (3 for R3 streams).
        mqtt: Also serve MQTT 3.1.1 on a port of each node.
        mqtt_replicas: Replicas of the MQTT streams (``None``: as many as nodes, at most 3).
        binary: The nats-server executable (default: found on PATH).
    """

    def __init__(self, folder: str | Path, nodes: int = 3, mqtt: bool = True, *,
                 mqtt_replicas: int | None = None, binary: str | None = None) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.folder = Path(folder)
        self.host = "127.0.0.1"
        self.nodes = nodes
        self.mqtt = mqtt
        self.mqtt_replicas = mqtt_replicas if mqtt_replicas is not None else min(nodes, 3)
        self.binary = binary or shutil.which("nats-server") or "/usr/bin/nats-server"
        self.client_ports = [free_port() for _ in range(nodes)]
        self.cluster_ports = [free_port() for _ in range(nodes)]
        self.http_ports = [free_port() for _ in range(nodes)]
        self.mqtt_ports = [free_port() for _ in range(nodes)] if mqtt else []
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * nodes

    @property
    def client_urls(self) -> list[str]:
        """``nats://127.0.0.1:<port>`` of every node."""
        return [f"nats://{self.host}:{port}" for port in self.client_ports]

    def running(self, i: int) -> bool:
        """Whether node ``i``'s process is alive."""
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def log(self, i: int) -> str:
        """What node ``i`` logged so far."""
        path = self.folder / f"n{i}" / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every node; return once each listens and JetStream has a meta leader."""
        for i in range(self.nodes):
            self._spawn(i)
        deadline = time.monotonic() + timeout_s
        for i in range(self.nodes):
            self._wait_listening(i, deadline)
        self.wait_jetstream(deadline - time.monotonic())

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash: nothing flushed, no goodbye to the cluster)."""
        proc = self._procs[i]
        if proc is not None:
            stop_process(proc, kill=True)

    def stop_node(self, i: int) -> None:
        """Stop node ``i`` cleanly (SIGTERM)."""
        proc = self._procs[i]
        if proc is not None:
            stop_process(proc)

    def restart(self, i: int, kill: bool = False, timeout_s: float = 30.0) -> None:
        """Stop (or with ``kill`` SIGKILL) node ``i`` if it runs, then start it again on the
        same ports and JetStream folder; return once it listens and JetStream is ready."""
        if self.running(i):
            self.kill(i) if kill else self.stop_node(i)
        self._spawn(i)
        deadline = time.monotonic() + timeout_s
        self._wait_listening(i, deadline)
        self.wait_jetstream(deadline - time.monotonic())

    def stop(self) -> None:
        """Stop every node."""
        for proc in self._procs:
            if proc is not None:
                stop_process(proc)

    def jsz(self, i: int) -> dict[str, Any]:
        """Node ``i``'s JetStream monitoring document (``/jsz``)."""
        url = f"http://{self.host}:{self.http_ports[i]}/jsz"
        with urllib.request.urlopen(url, timeout=2) as reply:
            doc: dict[str, Any] = json.loads(reply.read())
        return doc

    def wait_jetstream(self, timeout_s: float = 30.0) -> None:
        """Return once a running node reports a JetStream meta leader."""
        deadline = time.monotonic() + max(timeout_s, 0.1)
        while time.monotonic() < deadline:
            for i in range(self.nodes):
                if self.running(i) and self._meta_leader(i):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"no JetStream meta leader within {timeout_s:.1f} s")

    def _meta_leader(self, i: int) -> str | None:
        try:
            cluster = self.jsz(i).get("meta_cluster") or {}
        except (OSError, ValueError):
            return None
        leader = cluster.get("leader")
        return leader if isinstance(leader, str) and leader else None

    def _config(self, i: int) -> str:
        node = self.folder / f"n{i}"
        routes = ", ".join(f'"nats-route://{self.host}:{port}"'
                           for j, port in enumerate(self.cluster_ports) if j != i)
        lines = [f"server_name: n{i}", f"listen: {self.host}:{self.client_ports[i]}",
                 f"http: {self.host}:{self.http_ports[i]}",
                 f'jetstream {{ store_dir: "{node / "js"}", max_mem: 64MB, max_file: 1GB }}']
        if self.nodes > 1:
            lines.append(f"cluster {{ name: edgeinfer-test, listen: {self.host}:"
                         f"{self.cluster_ports[i]}, routes: [{routes}] }}")
        if self.mqtt:
            lines.append(f"mqtt {{ listen: {self.host}:{self.mqtt_ports[i]}, "
                         f"stream_replicas: {self.mqtt_replicas} }}")
        return "\n".join(lines) + "\n"

    def _spawn(self, i: int) -> None:
        node = self.folder / f"n{i}"
        node.mkdir(parents=True, exist_ok=True)
        conf = node / "nats.conf"
        conf.write_text(self._config(i))
        with open(node / "log", "ab") as log:
            self._procs[i] = subprocess.Popen([self.binary, "-c", str(conf)],
                                              stdout=subprocess.DEVNULL, stderr=log)

    def _wait_listening(self, i: int, deadline: float) -> None:
        ports = [self.client_ports[i]] + ([self.mqtt_ports[i]] if self.mqtt else [])
        for port in ports:
            while True:
                proc = self._procs[i]
                if proc is None or proc.poll() is not None:
                    raise RuntimeError(f"nats-server n{i} exited: {self.log(i)[-2000:]}")
                try:
                    with socket.create_connection((self.host, port), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"nats-server n{i} did not listen on {port}") from None
                    time.sleep(0.05)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
