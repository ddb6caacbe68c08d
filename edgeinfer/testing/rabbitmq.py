"""A RabbitMQ node of its own with the MQTT plugin, on free loopback ports, for tests.

    with RabbitMQ() as broker:          # RabbitMQ.available() says whether it can run here
        client.connect(broker.host, broker.port)

Never the machine's own node (5672, 25672, its cookie and database): every file the node
touches (config, enabled plugins, database, logs, Erlang cookie) is in a folder of its own, its
node name is unique, its AMQP, distribution and MQTT listeners are free loopback ports, and it
registers with an epmd of its own on a free port (an epmd the node started itself would
outlive it). Needs the Debian/Ubuntu ``rabbitmq-server`` package (3.x, with ``rabbitmq_mqtt``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Self

from .._net import free_port
from .procs import stop_process

__all__ = ["RabbitMQ"]

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the package's launcher (its /usr/sbin one su's)


class RabbitMQ:
    """Start a RabbitMQ node with ``rabbitmq_mqtt`` enabled; stop it and its epmd on exit.

    Args:
        server: the ``rabbitmq-server`` script to run (default: the Debian package's).
    """

    def __init__(self, server: str = SERVER) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()  # MQTT
        self.amqp_port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.node = f"edgeinfer-test-{uuid.uuid4().hex[:8]}@localhost"
        self.server = server
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._node: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available(server: str = SERVER) -> str | None:
        """None when a node can be started here, else why not (for a skip)."""
        if not os.access(server, os.X_OK):
            return f"rabbitmq-server is not installed (no {server}; apt-get install rabbitmq-server)"
        if shutil.which("epmd") is None:
            return "no epmd on PATH (Erlang's port mapper, from the erlang-base package)"
        return None

    @property
    def folder(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="edgeinfer-rabbitmq-")
        return Path(self._dir.name)

    @property
    def log(self) -> str:
        path = self.folder / "rabbitmq.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the node and wait until its MQTT listener accepts connections."""
        why = self.available(self.server)
        if why:
            raise RuntimeError(why)
        folder = self.folder
        (folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = {self.host}:{self.amqp_port}\n"
            f"mqtt.listeners.tcp.1 = {self.host}:{self.port}\n"
            "mqtt.allow_anonymous = true\n")  # as the guest user, which loopback may use
        (folder / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        (folder / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq/rabbitmq-env.conf
        cookie = folder / ".erlang.cookie"  # $HOME's: not the system node's
        cookie.write_text(uuid.uuid4().hex)
        cookie.chmod(0o400)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
            "HOME": str(folder), "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.node, "RABBITMQ_NODE_IP_ADDRESS": self.host,
            "RABBITMQ_NODE_PORT": str(self.amqp_port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(folder / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"), "RABBITMQ_LOGS": "-",
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(folder / "plugins"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(folder / "feature_flags"),
            "RABBITMQ_PID_FILE": str(folder / "pid"),
        }
        with open(folder / "rabbitmq.log", "ab") as log:  # the processes keep their own copy
            self._epmd = subprocess.Popen([shutil.which("epmd") or "epmd", "-port",
                                           str(self.epmd_port)],
                                          env=env, stdout=log, stderr=log, cwd=folder)
            # Listening before the node looks for it: a node that finds no epmd starts one
            # (`epmd -daemon`) that would outlive it.
            self._wait_port("epmd", self.epmd_port, self._epmd, time.monotonic() + timeout_s)
            # A session of its own: stop() reaches the Erlang VM under the launcher too.
            self._node = subprocess.Popen([self.server], env=env, stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, cwd=folder,
                                          start_new_session=True)
        self._wait_listening(timeout_s)

    def _wait_listening(self, timeout_s: float) -> None:
        assert self._node is not None
        self._wait_port("rabbitmq-server", self.port, self._node, time.monotonic() + timeout_s)

    def _wait_port(self, what: str, port: int, proc: subprocess.Popen[bytes],
                   deadline: float) -> None:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log = self.log[-3000:]
                self.stop()
                raise RuntimeError(f"{what} exited with {proc.returncode}: {log}")
            try:
                with socket.create_connection((self.host, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        log = self.log[-3000:]
        self.stop()
        raise RuntimeError(f"nothing listens on {self.host}:{port} ({what}) in time: {log}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the node (SIGTERM: a clean shutdown; SIGKILL after ``timeout_s``), then epmd."""
        node, epmd, self._node, self._epmd = self._node, self._epmd, None, None
        if node is not None:
            _signal_group(node, signal.SIGTERM)  # the launcher passes it on and waits
            try:
                node.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(node, signal.SIGKILL)
                node.wait(timeout_s)
            _signal_group(node, signal.SIGKILL)  # anything the VM left in its session
        if epmd is not None:
            stop_process(epmd, timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
