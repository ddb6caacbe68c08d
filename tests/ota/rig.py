"""The OTA test rig: real daemons (``edgeinfer run`` subprocesses) on a real mosquitto, a paho
peer that watches their topics, and a raw pusher that speaks the wire protocol of
``docs/ota.md`` byte by byte, so tests can send what ``push-model`` never would (tampered
manifests, short chunks, duplicates, chunks out of order)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


from edgeinfer.ota import manifest as mf
from edgeinfer.testing.peer import Peer
from edgeinfer.testing.procs import stop_process
from edgeinfer.ota.keys import PrivateKey, load_private_key

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "edgeinfer"


def target_of(base: str) -> Any:
    """The target a base topic names: ``<prefix>/<device>`` or ``<prefix>/group/<group>``."""
    parts = base.split("/")
    if len(parts) == 3 and parts[1] == "group":
        return {"group": parts[2]}
    return {"device": parts[-1]}


class Device:
    """One daemon: its config, process, and the peer's view of its topics."""

    def __init__(self, rig: Rig, device_id: str, model: Path, *, task: dict[str, Any],
                 groups: Iterable[str] = (), trusted: list[str] | None = None,
                 ota: dict[str, Any] | None = None) -> None:
        self.rig = rig
        self.id = device_id
        self.dir = rig.tmp / device_id
        self.dir.mkdir()
        self.state = self.dir / "state"
        self.proc: subprocess.Popen[str] | None = None
        self.log = self.dir / "daemon.log"
        ota_section = {
            "trusted_keys": trusted if trusted is not None else [str(rig.public)],
            "groups": list(groups),
            "health": {"min_inferences": 5, "window_s": 20},
            # latency is not what these tests check: on a loaded machine a timing verdict
            # ("slow") would reject a good update now and then (tests/ota/test_verify.py checks it)
            "verify": {"memory_limit_mb": 256, "timeout_s": 60, "max_slowdown": 1000},
            **(ota or {}),
        }
        self.config = self.dir / "config.yaml"
        self.config.write_text(json.dumps({
            "device_id": device_id,
            "runtime": {"state_dir": str(self.state)},
            "mqtt": {"host": rig.host, "port": rig.port, "stats_interval_s": 1},
            "ota": ota_section,
            "pipelines": [{
                "name": "cls",
                "source": {"type": "synthetic", "width": 64, "height": 48, "fps": 20},
                "model": {"path": str(model), "threads": 1},
                "task": task,
                "sinks": [{"type": "mqtt"}],
            }],
        }))
        for topic in (self.status_topic, self.result_topic, self.birth_topic):
            rig.peer.subscribe(topic)

    @property
    def status_topic(self) -> str:
        return f"{PREFIX}/{self.id}/ota/status"

    @property
    def result_topic(self) -> str:
        return f"{PREFIX}/{self.id}/cls/result"

    @property
    def birth_topic(self) -> str:
        return f"{PREFIX}/{self.id}/status"

    def start(self, env: dict[str, str] | None = None) -> Device:
        self.rig.peer.drain(self.result_topic)
        self.rig.peer.drain(self.birth_topic)
        full_env = {k: v for k, v in os.environ.items() if k != "EDGEINFER_OTA_CRASH_AT"}
        full_env.update(env or {})
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgeinfer", "-v", "run", "-c", str(self.config)],
                stdout=subprocess.DEVNULL, stderr=log, text=True, cwd=ROOT, env=full_env)
        return self

    def wait_running(self, timeout: float = 60.0) -> dict[str, Any]:
        """The first result after start once the daemon's birth lists the pipeline (its OTA
        topics are subscribed then; a result comes before that, and the birth sent on connecting
        lists no pipeline yet); returns the result."""
        def ready(msg: Any) -> bool:
            birth = json.loads(msg.payload)
            return bool(birth.get("state") == "online" and "cls" in birth.get("pipelines", ()))

        deadline = time.monotonic() + timeout
        try:
            self.rig.peer.next(self.birth_topic, timeout, ready)
        except AssertionError:
            raise AssertionError(f"{self.id}: no online birth; daemon log:\n{self.tail()}"
                                 ) from None
        return self.result(timeout=max(1.0, deadline - time.monotonic()))

    def result(self, timeout: float = 30.0,
               where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        def match(msg: Any) -> bool:
            return where is None or where(json.loads(msg.payload))
        try:
            return dict(json.loads(self.rig.peer.next(self.result_topic, timeout, match).payload))
        except AssertionError:
            raise AssertionError(f"{self.id}: no result; daemon log:\n{self.tail()}") from None

    def status(self, timeout: float = 60.0,
               where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """The next OTA status matching ``where`` (default: a final one)."""
        def match(msg: Any) -> bool:
            s = json.loads(msg.payload)
            return s["state"] in ("rejected", "committed", "rolled_back") if where is None \
                else where(s)
        try:
            return dict(json.loads(self.rig.peer.next(self.status_topic, timeout, match).payload))
        except AssertionError:
            raise AssertionError(f"{self.id}: no such OTA status; log:\n{self.tail()}") from None

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 15)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def staging(self) -> list[Path]:
        folder = self.state / "ota" / "staging"
        return sorted(folder.iterdir()) if folder.exists() else []


class Rig:
    def __init__(self, tmp: Path, host: str, port: int) -> None:
        from edgeinfer.ota.keys import generate_keypair

        self.tmp = tmp
        self.host, self.port = host, port
        self.private, self.public, self.key_id = generate_keypair(tmp / "ota-key")
        self.key: PrivateKey = load_private_key(self.private)
        self.peer = Peer(host, port)
        self.devices: list[Device] = []

    def device(self, model: Path, *, task: dict[str, Any] | None = None,
               device_id: str | None = None, **kw: Any) -> Device:
        d = Device(self, device_id or f"dev{uuid.uuid4().hex[:6]}", model,
                   task=task or {"type": "classify", "top_k": 1}, **kw)
        self.devices.append(d)
        return d

    def close(self) -> None:
        for d in self.devices:
            d.stop()
        self.peer.close()

    # -- a raw pusher --------------------------------------------------------------------------
    def offer(self, model: Path, *, version: str, base: str, pipeline: str = "cls",
              key: PrivateKey | None | bool = True, chunk_size: int = 65536,
              tamper: Callable[[dict[str, Any]], None] | None = None, **manifest_kw: Any
              ) -> tuple[mf.Manifest, int]:
        """Publish an offer for ``model`` (signed for the target ``base`` names unless
        ``target`` is given); returns the manifest and the chunk count. ``tamper`` edits the
        manifest dict after it was signed."""
        m, payload = self.make_offer(model, version=version, base=base, pipeline=pipeline,
                                     key=key, chunk_size=chunk_size, **manifest_kw)
        self.peer.publish(f"{base}/ota/offer", self.tampered(payload, tamper))
        return m, math.ceil(m.size / chunk_size)

    def make_offer(self, model: Path, *, version: str, base: str, pipeline: str = "cls",
                   key: PrivateKey | None | bool = True, chunk_size: int = 65536,
                   **manifest_kw: Any) -> tuple[mf.Manifest, bytes]:
        """The manifest and offer payload ``offer`` would publish."""
        signer = self.key if key is True else (key or None)
        manifest_kw.setdefault("target", mf.Target(**target_of(base)))
        m = mf.build_manifest(model, pipeline=pipeline, version=version, chunk_size=chunk_size,
                              key_id=signer.key_id if signer else None, **manifest_kw)
        return m, mf.make_offer(m, signer)

    @staticmethod
    def tampered(payload: bytes, tamper: Callable[[dict[str, Any]], None] | None) -> bytes:
        if tamper is not None:
            offer = json.loads(payload)
            text = json.loads(offer["manifest"])
            tamper(text)
            offer["manifest"] = json.dumps(text)
            payload = json.dumps(offer).encode()
        return payload

    def offer_dict(self, fields: dict[str, Any], *, base: str, chunk_size: int = 65536,
                   key: PrivateKey | None = None, data: bytes | None = None) -> None:
        """Publish an offer for a manifest given field by field (checks a device makes that
        ``build_manifest`` would already refuse), signed with ``key`` (default the rig's);
        the chunk hashes are ``data``'s (default: zeros)."""
        key = key or self.key
        size = int(fields["size"])
        text = json.dumps({"schema": "edgeinfer-ota/2", "pipeline": "cls", "format": "onnx",
                           "target": target_of(base), "sequence": int(time.time() * 1000),
                           "created": mf.now_iso(), "expires": mf.now_iso(time.time() + 600),
                           "chunk_size": chunk_size,
                           "chunks": [hashlib.sha256(data[i:i + chunk_size]).hexdigest()
                                      for i in range(0, size, chunk_size)] if data else
                                     ["0" * 64] * math.ceil(size / chunk_size),
                           "key_id": key.key_id, **fields}).encode()
        offer = {"manifest": text.decode(), "signature": mf.sign_bytes(text, key),
                 "transfer": {"id": str(fields["sha256"])[:16], "chunk_size": chunk_size,
                              "chunks": math.ceil(int(fields["size"]) / chunk_size)}}
        self.peer.publish(f"{base}/ota/offer", json.dumps(offer))

    def chunks(self, model: Path, m: mf.Manifest, base: str, indices: Iterable[int],
               chunk_size: int = 65536, data: bytes | None = None) -> None:
        blob = data if data is not None else model.read_bytes()
        tid = mf.transfer_id(m.sha256)
        for i in indices:
            self.peer.publish(f"{base}/ota/chunk/{tid}/{i}",
                              blob[i * chunk_size:(i + 1) * chunk_size])

    def push(self, model: Path, *, version: str, base: str, chunk_size: int = 65536,
             order: Callable[[list[int]], Iterable[int]] | None = None, **kw: Any
             ) -> mf.Manifest:
        m, n = self.offer(model, version=version, base=base, chunk_size=chunk_size, **kw)
        indices = list(range(n))
        self.chunks(model, m, base, order(indices) if order else indices, chunk_size)
        return m

    def cli(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgeinfer", *args, "--broker", f"{self.host}:{self.port}"],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT)
