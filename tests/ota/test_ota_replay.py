"""What a client on the broker can do to model updates, against real daemons on a real
mosquitto (``docs/ota.md``, "Threat model"): replay captured offers and rollback requests (on
the same device, after a restart, on another device), send offers dated long ago, forge chunks
and junk offers that carry a real transfer's id, offer the running model under another
version; and signed models the parser chokes on."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.ota import manifest as mf
from edgeinfer.ota import rollback as rb
from edgeinfer.testing import onnx_models
from edgeinfer.testing.peer import Peer
from rig import Rig
from test_ota_daemon import _base, _sha

CHUNK = 65536


def _rid(payload: bytes) -> str:
    offer = json.loads(payload)
    return mf.request_id(offer["manifest"], offer["signature"])


def _send(rig: Rig, model: Path, m: mf.Manifest, payload: bytes, base: str) -> None:
    rig.peer.publish(f"{base}/ota/offer", payload)
    rig.chunks(model, m, base, range(len(m.chunks)))


def test_a_captured_older_update_is_refused_after_a_newer_one_and_after_a_restart(
        rig: Rig, models: dict[str, Path]) -> None:
    dev = rig.device(models["v1"]).start()
    dev.wait_running()
    base = _base(dev)
    m2, p2 = rig.make_offer(models["v2"], version="2.0.0", base=base)  # captured by someone
    _send(rig, models["v2"], m2, p2, base)
    assert dev.status()["state"] == "committed"
    m3, p3 = rig.make_offer(models["v3"], version="3.0.0", base=base)
    assert m3.sequence > m2.sequence
    _send(rig, models["v3"], m3, p3, base)
    assert dev.status()["state"] == "committed"
    assert dev.result(where=lambda r: r["model"]["sha256"] == _sha(models["v3"]))

    def replay() -> dict[str, Any]:
        _send(rig, models["v2"], m2, p2, base)
        status = dev.status()
        assert status["state"] == "rejected" and status["reason"] == "downgrade", status
        assert status["request"] == _rid(p2)
        rig.peer.drain(dev.result_topic)
        assert dev.result()["model"]["sha256"] == _sha(models["v3"])
        return status

    replay()
    # the refusal went out live, not retained: the retained status is still v3's commit
    late = Peer(rig.host, rig.port)
    try:
        late.subscribe(dev.status_topic)
        retained = json.loads(late.next(dev.status_topic, 10).payload)
    finally:
        late.close()
    assert retained["state"] == "committed" and retained["request"] == _rid(p3), retained
    dev.stop()
    dev.start().wait_running()
    replay()  # the highest sequence survived the restart
    assert json.loads((dev.state / "ota" / "replay.json").read_bytes())["sequences"]["cls"] \
        == m3.sequence
    # going back on purpose: a new manifest signed as a downgrade, with a lower sequence
    m, payload = rig.make_offer(models["v2"], version="2.0.1", base=base, sequence=1,
                                downgrade=True)
    _send(rig, models["v2"], m, payload, base)
    status = dev.status()
    assert status["state"] == "committed" and status["request"] == _rid(payload), status
    assert dev.result(where=lambda r: r["model"]["version"] == "2.0.1")


def test_a_capture_replayed_on_another_device_and_manifests_out_of_date_are_refused(
        rig: Rig, models: dict[str, Path]) -> None:
    a = rig.device(models["v1"]).start()
    b = rig.device(models["v1"]).start()
    a.wait_running()
    b.wait_running()
    m, payload = rig.make_offer(models["v2"], version="2.0.0", base=_base(a))
    _send(rig, models["v2"], m, payload, _base(b))  # a's update, sent to b
    status = b.status()
    assert status["state"] == "rejected" and status["reason"] == "wrong_target", status
    assert a.id in status["message"]
    assert b.result()["model"]["sha256"] == _sha(models["v1"])
    assert b.staging() == []

    # a group's update is for its members only
    rig.offer(models["v2"], version="2.0.0", base=_base(b), target=mf.Target(group="other"))
    assert b.status()["reason"] == "wrong_target"
    # signed in 2001 (valid for an hour then), or an hour in the device's future
    rig.offer(models["v2"], version="2001", base=_base(b), now=978_307_200.0)
    assert b.status()["reason"] == "expired_manifest"
    rig.offer(models["v2"], version="future", base=_base(b), now=time.time() + 3600)
    assert b.status()["reason"] == "not_yet_valid"
    assert b.result()["model"]["sha256"] == _sha(models["v1"])


def test_a_rollback_request_is_taken_once_even_across_a_restart_and_names_the_configured_model(
        rig: Rig, models: dict[str, Path]) -> None:
    dev = rig.device(models["v1"])
    config = json.loads(dev.config.read_text())
    config["pipelines"][0]["model"]["name"] = "kitchen-classifier"
    dev.config.write_text(json.dumps(config))
    dev.start()
    assert dev.wait_running()["model"]["name"] == "kitchen-classifier"
    base = _base(dev)
    rig.push(models["v2"], version="2.0.0", base=base, name="classifier")
    assert dev.status()["state"] == "committed"

    other = rb.make_rollback("cls", rig.key, target=mf.Target(device="someone-else"))
    rig.peer.publish(f"{base}/ota/rollback", other)
    assert dev.status()["reason"] == "wrong_target"
    request = rb.make_rollback("cls", rig.key, target=mf.Target(device=dev.id))
    rig.peer.publish(f"{base}/ota/rollback", request)
    status = dev.status()
    assert status["state"] == "rolled_back" and status["reason"] == "requested", status
    env = json.loads(request)
    assert status["request"] == mf.request_id(env["request"], env["signature"])
    # the seeded previous model went into the store under the configured name
    assert status["name"] == "kitchen-classifier", status
    back = dev.result(where=lambda r: r["model"]["sha256"] == _sha(models["v1"]))
    assert back["model"]["name"] == "kitchen-classifier"

    dev.stop()
    dev.start().wait_running()
    rig.peer.publish(f"{base}/ota/rollback", request)
    status = dev.status()
    assert status["state"] == "rejected" and status["reason"] == "replayed", status
    assert dev.result()["model"]["sha256"] == _sha(models["v1"])


def test_junk_offers_and_a_forged_chunk_do_not_change_a_signed_transfer(
        rig: Rig, models: dict[str, Path], tmp_path: Path) -> None:
    big = onnx_models.tiny_classifier(tmp_path / "wide.onnx", classes=8192, seed=4)
    dev = rig.device(models["v1"]).start()
    dev.wait_running()
    base = _base(dev)
    m, payload = rig.make_offer(big, version="wide-1", base=base)
    real = _rid(payload)
    n = len(m.chunks)
    assert n >= 4
    data = big.read_bytes()
    rig.peer.publish(f"{base}/ota/offer", payload)
    assert dev.status(where=lambda s: s["state"] == "receiving")["request"] == real
    # a forged chunk 0 (right length, wrong bytes) arrives first: dropped, not staged
    rig.peer.publish(f"{base}/ota/chunk/{m.sha256[:16]}/0", bytes(CHUNK))
    rig.chunks(big, m, base, range(1, n - 1))

    # junk that carries the real transfer's id: unsigned, and the real offer with another
    # chunk size in its (unsigned) transfer section
    offer = json.loads(payload)
    rig.peer.publish(f"{base}/ota/offer", json.dumps(dict(offer, signature=None)))
    edited = dict(offer, transfer=dict(offer["transfer"], chunk_size=2 * CHUNK,
                                       chunks=math.ceil(m.size / (2 * CHUNK))))
    rig.peer.publish(f"{base}/ota/offer", json.dumps(edited))
    refusals = [dev.status(where=lambda s: s["state"] == "rejected") for _ in range(2)]
    assert [s["reason"] for s in refusals] == ["unsigned", "bad_transfer"]
    assert all(s["request"] not in (None, real) for s in refusals), refusals
    assert all(s["transfer"] is None and s["sha256"] is None for s in refusals)

    # the transfer goes on where it was: chunk 0 (the forged one) and the last still missing
    from edgeinfer.ota.protocol import expand_ranges

    stalled = dev.status(where=lambda s: s["state"] == "receiving" and s["received"] == n - 2)
    assert stalled["request"] == real
    assert sorted(expand_ranges(stalled["missing"], n)) == [0, n - 1]
    rig.peer.publish(f"{base}/ota/chunk/{m.sha256[:16]}/0", data[:CHUNK])
    rig.chunks(big, m, base, [n - 1])
    final = dev.status()
    assert final["state"] == "committed" and final["request"] == real, (final, dev.tail())
    assert "chunk 0 is not the signed chunk" in dev.tail(200)


def test_an_offer_of_the_running_model_is_checked_and_answered_with_the_running_model(
        rig: Rig, models: dict[str, Path]) -> None:
    dev = rig.device(models["v1"]).start()
    running = dev.wait_running()["model"]
    base = _base(dev)
    rig.offer(models["v1"], version="9.9.9", base=base, target=mf.Target(device="elsewhere"))
    assert dev.status()["reason"] == "wrong_target"
    _, payload = rig.make_offer(models["v1"], version="9.9.9", base=base)
    rig.peer.publish(f"{base}/ota/offer", payload)
    status = dev.status()
    assert status["state"] == "committed" and status["request"] == _rid(payload), status
    assert status["version"] == running["version"] != "9.9.9"
    assert status["name"] == running["name"] and status["sha256"] == _sha(models["v1"])
    assert "already runs" in status["message"]
    assert dev.result()["model"]["version"] == running["version"]


def _external_data_model(path: Path, location: str) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("kind", ["nested_if", "nul_location", "long_location"])
def test_a_signed_model_the_parser_chokes_on_is_a_typed_rejection_and_leaves_no_staging(
        rig: Rig, models: dict[str, Path], tmp_path: Path, kind: str) -> None:
    path = {
        "nested_if": lambda: onnx_models.nested_if_model(tmp_path / "nested.onnx"),
        "nul_location": lambda: _external_data_model(tmp_path / "nul.onnx", "w\0.bin"),
        "long_location": lambda: _external_data_model(tmp_path / "long.onnx", "w" * 5000),
    }[kind]()
    dev = rig.device(models["v1"]).start()
    dev.wait_running()
    base = _base(dev)
    data = path.read_bytes()
    sha = _sha(path)
    rig.offer_dict({"name": kind.replace("_", "-"), "version": "x", "sha256": sha,
                    "size": len(data), "filename": "m.onnx"}, base=base, data=data)
    for i in range(0, len(data), CHUNK):
        rig.peer.publish(f"{base}/ota/chunk/{sha[:16]}/{i // CHUNK}", data[i:i + CHUNK])
    status = dev.status()
    assert status["state"] == "rejected", status
    # nested subgraphs: the model scanner refuses them as a format (edgeinfer info says the same)
    assert status["reason"] in ("bad_model", "unsafe_model", "bad_format"), (status, dev.tail())
    assert dev.staging() == []
    assert dev.result()["model"]["sha256"] == _sha(models["v1"])



def test_push_model_is_not_misled_by_a_junk_offer_with_its_transfer_id(
        rig: Rig, models: dict[str, Path], tmp_path: Path) -> None:
    import subprocess
    import sys

    from rig import ROOT

    big = onnx_models.tiny_classifier(tmp_path / "wide.onnx", classes=8192, seed=5)
    dev = rig.device(models["v1"]).start()
    dev.wait_running()
    base = _base(dev)
    push = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "push-model", str(big), "--device", dev.id,
         "--pipeline", "cls", "--version", "2.0.0", "--key", str(rig.private), "--chunk-kb",
         "64", "--wait", "--timeout", "120", "--json", "--broker", f"{rig.host}:{rig.port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        receiving = dev.status(where=lambda s: s["state"] == "receiving")
        # someone copies the offer's transfer id (from the chunk topics) into junk of its own
        junk = {"manifest": json.dumps({"sha256": _sha(big), "version": "9.0.1"}),
                "signature": None,
                "transfer": {"id": receiving["transfer"], "chunk_size": CHUNK, "chunks": 1}}
        rig.peer.publish(f"{base}/ota/offer", json.dumps(junk))
        out, err = push.communicate(timeout=150)
    finally:
        if push.poll() is None:
            push.kill()
    row = json.loads(out)["devices"][0]
    assert push.returncode == 0, (out, err, dev.tail())
    assert row["state"] == "committed" and row["version"] == "2.0.0", row
    assert dev.result(where=lambda r: r["model"]["version"] == "2.0.0")
