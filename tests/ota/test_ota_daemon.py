"""Model updates end to end: real daemons as subprocesses on a real mosquitto, real models
(a float classifier and its INT8 QDQ version made by onnxruntime's quantizer, a model of the
wrong task, a corrupted copy, one that exhausts memory), every bad input of docs/ota.md, and
the daemon killed with SIGKILL at each step of an update."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.testing import onnx_models
from edgeinfer.testing.mosquitto import Mosquitto
from rig import PREFIX, Rig


def _base(device: Any) -> str:
    return f"{PREFIX}/{device.id}"


def _sha(path: Path) -> str:
    from edgeinfer.runtime.modelfile import file_sha256

    return file_sha256(path)


def test_update_commits_and_results_carry_the_new_model(rig: Rig, models: dict[str, Path]
                                                        ) -> None:
    dev = rig.device(models["v1"]).start()
    first = dev.wait_running()
    assert first["model"]["sha256"] == _sha(models["v1"])

    rig.push(models["v2"], version="2.0.0", base=_base(dev), name="classifier")
    states = []
    final = dev.status(where=lambda s: states.append(s["state"]) or s["state"] in
                       ("committed", "rejected", "rolled_back"))
    assert final["state"] == "committed", (final, dev.tail())
    assert "receiving" in states and "verifying" in states and "applied" in states
    assert final["previous"]["sha256"] == _sha(models["v1"])
    # the speed check timed v2 in turns with v1, in the same trial, and says what it found
    assert final["message"].startswith("verified; latency ") and "the current model's time" \
        in final["message"] and "timed in turns" in final["message"], final

    after = dev.result(where=lambda r: r["model"]["version"] == "2.0.0")
    assert after["model"] == {"name": "classifier", "version": "2.0.0",
                              "sha256": _sha(models["v2"])}
    store = dev.state / "ota"
    current = (store / "pipelines" / "cls" / "current")
    previous = (store / "pipelines" / "cls" / "previous")
    assert current.is_symlink() and not os.path.isabs(os.readlink(current))
    assert current.resolve().read_bytes() == models["v2"].read_bytes()
    assert previous.resolve().read_bytes() == models["v1"].read_bytes()
    assert not (store / "pipelines" / "cls" / "pending.json").exists()
    assert dev.staging() == []

    # a restarted daemon runs the updated model, not the configured one
    dev.stop()
    dev.start()
    assert dev.wait_running()["model"]["version"] == "2.0.0"

    # the same model again: already running, nothing transferred
    rig.offer(models["v2"], version="2.0.0", base=_base(dev), name="classifier")
    again = dev.status()
    assert again["state"] == "committed" and "already" in again["message"]


def _unknown_op_model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["image"], ["logits"], domain="com.example")],
        "unknown", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_bad_updates_are_rejected_with_a_reason_and_the_model_untouched(
        rig: Rig, models: dict[str, Path], yolo_path: Path, tmp_path: Path) -> None:
    from edgeinfer.ota.keys import PrivateKey

    dev = rig.device(models["v1"], ota={"max_model_mb": 4}).start()
    dev.wait_running()
    base, v1 = _base(dev), _sha(models["v1"])
    stranger = PrivateKey.generate()
    v2_sha, v2_size = _sha(models["v2"]), models["v2"].stat().st_size

    def expect(reason: str, send: Any) -> dict[str, Any]:
        send()
        status = dev.status()
        assert status["state"] == "rejected" and status["reason"] == reason, (status, dev.tail())
        assert status["message"]
        # the stream goes on, on the old model
        assert dev.result()["model"]["sha256"] == v1
        return status

    expect("unsigned", lambda: rig.push(models["v2"], version="u", base=base, key=None))
    expect("unknown_key", lambda: rig.push(models["v2"], version="k", base=base, key=stranger))

    def tampered(m: dict[str, Any]) -> None:
        m["version"] = "9.9.9"
    expect("bad_signature", lambda: rig.offer(models["v2"], version="s", base=base,
                                              tamper=tampered))
    for name in ("../../etc/cron.d/x", "a/b", ".hidden"):
        expect("bad_name", lambda name=name: rig.offer_dict(
            {"name": name, "version": "n", "sha256": v2_sha, "size": v2_size,
             "filename": "m.onnx"}, base=base))
    expect("bad_name", lambda: rig.offer_dict(
        {"name": "ok", "version": "n", "sha256": v2_sha, "size": v2_size,
         "filename": "../m.onnx"}, base=base))
    expect("unknown_pipeline", lambda: rig.offer(models["v2"], version="p", base=base,
                                                 pipeline="nope"))
    expect("wrong_task", lambda: rig.offer(models["v2"], version="t", base=base, task="detect"))
    expect("oversize", lambda: rig.offer(yolo_path, version="big", base=base))

    # chunks that match their signed hashes, but the file is not the one signed for (a
    # signer's mistake: the chunk list was made from another file)
    def corrupt() -> None:
        data = models["corrupt"].read_bytes()
        rig.offer_dict({"name": "c", "version": "c", "sha256": v2_sha, "size": v2_size,
                        "filename": "c.onnx"}, base=base, data=data)
        for i in range(0, len(data), 65536):
            rig.peer.publish(f"{base}/ota/chunk/{v2_sha[:16]}/{i // 65536}", data[i:i + 65536])
    expect("sha256_mismatch", corrupt)
    # checked and signed, but not a model, not loadable, not this task's, too hungry
    def not_a_model() -> None:
        data, sha = models["not_onnx"].read_bytes(), _sha(models["not_onnx"])
        rig.offer_dict({"name": "notes", "version": "f", "sha256": sha, "size": len(data),
                        "filename": "notes.onnx"}, base=base, data=data)
        rig.peer.publish(f"{base}/ota/chunk/{sha[:16]}/0", data)
    expect("bad_format", not_a_model)
    bad_op = _unknown_op_model(tmp_path / "unknown-op.onnx")
    expect("load_failed", lambda: rig.push(bad_op, version="l", base=base))
    status = expect("undecodable", lambda: rig.push(models["wrong_task"], version="w",
                                                    base=base))
    assert "classify" in status["message"]
    expect("out_of_memory", lambda: rig.push(models["hog"], version="h", base=base))

    # nothing of the refused updates is left: no staging, no store link
    assert dev.staging() == []
    assert not (dev.state / "ota" / "pipelines" / "cls" / "current").exists()
    assert dev.proc is not None and dev.proc.poll() is None


def test_transfer_resends_missing_ranges_and_takes_duplicates_and_any_order(
        rig: Rig, models: dict[str, Path], tmp_path: Path) -> None:
    big = onnx_models.tiny_classifier(tmp_path / "wide.onnx", classes=8192, seed=4)
    dev = rig.device(models["v1"]).start()
    dev.wait_running()
    base = _base(dev)
    m, n = rig.offer(big, version="wide-1", base=base)
    assert n >= 4
    data = big.read_bytes()
    tid = m.sha256[:16]
    # a short chunk and a chunk of another transfer are dropped; a duplicate is harmless
    rig.peer.publish(f"{base}/ota/chunk/{tid}/1", data[65536:65536 + 100])
    rig.peer.publish(f"{base}/ota/chunk/{'0' * 16}/0", data[:65536])
    rig.chunks(big, m, base, [3, 1, 3])
    # the device says what it misses once chunks stop coming
    missing = dev.status(where=lambda s: s["state"] == "receiving" and s["received"] == 2)
    ranges = missing["missing"]
    from edgeinfer.ota.protocol import expand_ranges

    assert sorted(expand_ranges(ranges, n)) == [i for i in range(n) if i not in (1, 3)]
    rig.chunks(big, m, base, reversed(list(expand_ranges(ranges, n))))
    final = dev.status()
    assert final["state"] == "committed", (final, dev.tail())
    assert dev.result(where=lambda r: r["model"]["version"] == "wide-1")["model"]["sha256"] \
        == _sha(big)


def test_rollback_request_returns_to_the_previous_model(rig: Rig, models: dict[str, Path]
                                                       ) -> None:
    from edgeinfer.ota import manifest as mf
    from edgeinfer.ota import rollback as rb

    dev = rig.device(models["v1"]).start()
    dev.wait_running()
    base = _base(dev)
    rig.push(models["v2"], version="2.0.0", base=base)
    assert dev.status()["state"] == "committed"
    target = mf.Target(device=dev.id)
    rig.peer.publish(f"{base}/ota/rollback", rb.make_rollback("cls", None, target=target))
    assert dev.status()["reason"] == "unsigned"
    request = rb.make_rollback("cls", rig.key, target=target)
    rig.peer.publish(f"{base}/ota/rollback", request)
    status = dev.status()
    assert status["state"] == "rolled_back" and status["reason"] == "requested", status
    assert status["sha256"] == _sha(models["v1"])
    assert dev.result(where=lambda r: r["model"]["sha256"] == _sha(models["v1"]))
    rig.peer.publish(f"{base}/ota/rollback", request)  # a replay is refused
    assert dev.status()["state"] == "rejected"


def test_an_update_failing_the_health_gate_is_rolled_back(rig: Rig, models: dict[str, Path]
                                                         ) -> None:
    # The stream runs at 20 fps: 500 inferences in 3 s cannot happen, so the gate fails and
    # the device goes back to the model it ran, with the reason on its status.
    dev = rig.device(models["v1"], ota={"health": {"min_inferences": 500, "window_s": 3}}).start()
    dev.wait_running()
    rig.push(models["v2"], version="2.0.0", base=_base(dev))
    status = dev.status()
    assert status["state"] == "rolled_back" and status["reason"] == "health_gate", status
    assert "of 500 inferences" in status["message"]
    assert dev.result(where=lambda r: r["model"]["sha256"] == _sha(models["v1"]))
    link = dev.state / "ota" / "pipelines" / "cls" / "current"
    assert link.resolve().read_bytes() == models["v1"].read_bytes()
    assert not (link.parent / "pending.json").exists()


@pytest.mark.parametrize("point", ["chunk", "verify", "store", "link", "swap", "gate"])
def test_kill_9_at_any_step_leaves_a_complete_verified_model(
        rig: Rig, models: dict[str, Path], tmp_path: Path, point: str) -> None:
    from edgeinfer.ota.protocol import expand_ranges

    v1 = models["v1"]
    v2 = onnx_models.tiny_classifier(tmp_path / "wide.onnx", classes=4096, seed=6)  # 3+ chunks
    dev = rig.device(v1).start({"EDGEINFER_OTA_CRASH_AT": point})
    dev.wait_running()
    base = _base(dev)
    if point == "chunk":  # half the chunks, then the daemon dies once they are on disk
        m, n = rig.offer(v2, version="2.0.0", base=base)
        rig.chunks(v2, m, base, range(n // 2))
    else:
        m = rig.push(v2, version="2.0.0", base=base)
    assert dev.wait_exit(60) == -signal.SIGKILL, dev.tail()

    rig.peer.drain(dev.status_topic)
    dev.start()  # no crash point now
    first = dev.wait_running()
    if point == "chunk":  # the transfer resumes from the staged file
        assert first["model"]["sha256"] == _sha(v1)
        status = dev.status(where=lambda s: s["state"] == "receiving")
        n = status["chunks"]
        assert 0 < status["received"] < n
        rig.chunks(v2, m, base, expand_ranges(status["missing"], n))
        assert dev.status()["state"] == "committed"
        want = v2
    elif point in ("verify", "store"):  # the complete staged file is verified again
        status = dev.status()
        assert status["state"] == "committed", (status, dev.tail())
        want = v2
    else:  # swapped but not committed: undone at boot
        status = dev.status()
        assert status["state"] == "rolled_back" and status["reason"] == "interrupted", status
        want = v1
    result = dev.result(where=lambda r: r["model"]["sha256"] == _sha(want))
    assert result["model"]["sha256"] == _sha(want)
    store = dev.state / "ota"
    assert dev.staging() == []
    assert not list(store.rglob("*.tmp"))
    assert not (store / "pipelines" / "cls" / "pending.json").exists()
    current = store / "pipelines" / "cls" / "current"
    if current.exists():
        assert current.resolve().read_bytes() == want.read_bytes()
    else:
        assert want == v1


def test_fleet_push_with_canary_and_wait_through_the_cli(rig: Rig, models: dict[str, Path]
                                                        ) -> None:
    from edgeinfer.ota.keys import generate_keypair

    uid = os.urandom(3).hex()
    group = f"line-{uid}"
    _, other_pub, _ = generate_keypair(rig.tmp / "other-key")
    # "a" sorts first, so it is the canary; it trusts another key and refuses the update.
    a = rig.device(models["v1"], device_id=f"a-{uid}", groups=[group],
                   trusted=[str(other_pub)])
    b = rig.device(models["v1"], device_id=f"b-{uid}", groups=[group])
    c = rig.device(models["v1"], device_id=f"c-{uid}", groups=[group])
    for d in (a, b, c):
        d.start()
    for d in (a, b, c):
        d.wait_running()
    for d in (b, c):
        rig.peer.drain(d.status_topic)

    push = ["push-model", str(models["v2"]), "--group", group, "--pipeline", "cls",
            "--version", "2.0.0", "--key", str(rig.private), "--chunk-kb", "64", "--wait",
            "--timeout", "120"]
    canary = rig.cli(*push, "--canary", "1")
    assert canary.returncode != 0, canary
    assert "canary" in (canary.stdout + canary.stderr).lower()
    assert f"a-{uid}" in canary.stdout and "unknown_key" in canary.stdout
    for d in (b, c):  # the rest of the group got nothing
        assert [json.loads(m.payload)["state"] for m in rig.peer.drain(d.status_topic)] == []
        assert d.result()["model"]["sha256"] == _sha(models["v1"])

    fleet = rig.cli(*push, "--json")
    assert fleet.returncode != 0, fleet
    final = {s["device"]: s for s in json.loads(fleet.stdout)["devices"]}
    assert final[f"a-{uid}"]["state"] == "rejected"
    assert final[f"a-{uid}"]["reason"] == "unknown_key"
    assert final[f"b-{uid}"]["state"] == final[f"c-{uid}"]["state"] == "committed"
    for d in (b, c):
        assert d.result(where=lambda r: r["model"]["version"] == "2.0.0")

    back = rig.cli("push-model", "--device", f"b-{uid}", "--pipeline", "cls", "--rollback",
                   "--key", str(rig.private), "--wait", "--timeout", "60")
    assert back.returncode == 0, back
    assert "rolled_back" in back.stdout
    assert b.result(where=lambda r: r["model"]["sha256"] == _sha(models["v1"]))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: a state directory that is nearly full for an update."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if os.environ.get("CI"):
            raise RuntimeError(f"cannot mount a tmpfs: {done.stderr}")
        pytest.skip(f"cannot mount a tmpfs (not root?): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_update_the_disk_cannot_hold_is_refused_at_the_offer(
        rig: Rig, models: dict[str, Path], small_disk: Path) -> None:
    dev = rig.device(models["v1"])
    config = json.loads(dev.config.read_text())
    config["runtime"]["state_dir"] = str(small_disk / "state")
    dev.config.write_text(json.dumps(config))
    dev.start().wait_running()
    rig.offer(models["v2"], version="2.0.0", base=_base(dev))
    status = dev.status()
    assert status["state"] == "rejected" and status["reason"] == "storage", status
    assert "MiB free" in status["message"]
    assert dev.result()["model"]["sha256"] == _sha(models["v1"])


@pytest.fixture(scope="module")
def yolo_int8(yolo_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """YOLOv8n-320 quantized by edgeinfer itself, calibrated on real photographs."""
    import cv2

    from edgeinfer import samples
    from edgeinfer.config.pipeline import DetectTask, PreprocessConfig
    from edgeinfer.quantize import quantize_model

    d = tmp_path_factory.mktemp("yolo-int8")
    photos = d / "photos"
    photos.mkdir()
    for p in samples.sample_images():
        img = cv2.imread(str(p))
        cv2.imwrite(str(photos / f"{p.stem}.png"), img)
        cv2.imwrite(str(photos / f"{p.stem}-mirror.png"), img[:, ::-1])
    task = DetectTask(decoder="yolov8", preprocess=PreprocessConfig(size=[320, 320]))
    card = quantize_model(yolo_path, d / "yolo-int8.onnx", photos, config=task,
                          method="minmax", samples=12)
    return Path(card.path)


@pytest.mark.slow
def test_real_models_float_to_int8_with_golden_and_wrong_task(
        rig: Rig, yolo_path: Path, yolo_int8: Path, blazeface_path: Path, tmp_path: Path
        ) -> None:
    import numpy as np

    import edgeinfer
    from edgeinfer import samples

    video = samples.demo_video(tmp_path / "clip.avi", frames=30, fps=10)
    task = {"type": "detect", "decoder": "yolov8",
            "preprocess": {"size": [320, 320], "scale": 0.00392157}}
    dev = rig.device(yolo_path, task=task, ota={"health": {"min_inferences": 5, "window_s": 30}})
    config = json.loads(dev.config.read_text())
    config["pipelines"][0]["source"] = {"type": "video", "uri": str(video), "fps": 10,
                                        "loop": True}
    dev.config.write_text(json.dumps(config))
    dev.start().wait_running()

    # A copy whose weights were damaged before signing: its golden outputs (from the good
    # model) do not match, so it never runs.
    x = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
    with edgeinfer.load_model(yolo_path, input_shapes={"images": [1, 3, 320, 320]}) as m:
        expected = m.run({"images": x})["output0"]
    golden = tmp_path / "golden.npz"
    np.savez(golden, images=x, **{"out:output0": expected})
    damaged = tmp_path / "yolo-damaged.onnx"
    data = bytearray(yolo_path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 4096):
        data[i] ^= 0x01  # low bits: the weights change, nothing becomes NaN
    damaged.write_bytes(bytes(data))
    push = ["push-model", "--device", dev.id, "--pipeline", "cls", "--key", str(rig.private),
            "--wait", "--timeout", "120", "--json"]
    done = rig.cli(*push, str(damaged), "--version", "bad", "--golden", str(golden))
    assert done.stdout, done
    status = json.loads(done.stdout)["devices"][0]
    assert done.returncode != 0 and status["reason"] == "golden_mismatch", (done, dev.tail())

    # BlazeFace (TFLite) is a fine model, but not one this pipeline's YOLOv8 decoder can read.
    done = rig.cli(*push, str(blazeface_path), "--version", "face")
    status = json.loads(done.stdout)["devices"][0]
    assert status["reason"] == "undecodable", (done, dev.tail())

    # The INT8 version of the running model: verified, swapped in, committed.
    done = rig.cli(*push, str(yolo_int8), "--version", "2.0.0-int8")
    status = json.loads(done.stdout)["devices"][0]
    assert done.returncode == 0 and status["state"] == "committed", (done, dev.tail())
    after = dev.result(where=lambda r: r["model"]["version"] == "2.0.0-int8")
    assert after["model"]["sha256"] == _sha(yolo_int8)


def test_the_birth_that_lists_the_pipelines_comes_after_the_ota_subscriptions(
        tmp_path: Path, models: dict[str, Path]) -> None:
    """A pusher that sends its offer on seeing the device's birth (or its first result) must
    find the offer topic subscribed: in the broker's own log, the daemon's SUBSCRIBE to its
    ``ota/offer`` topic comes before the birth it publishes once the pipelines run (the second
    retained status; the first is sent on connecting, before any pipeline starts). Before this,
    the subscription came after that birth and an offer sent at once was lost, unanswered."""
    with Mosquitto(extra_config="log_type debug") as broker:
        rig = Rig(tmp_path, broker.host, broker.port)
        try:
            dev = rig.device(models["v1"]).start()
            dev.wait_running()
            status = re.compile(rf"Received PUBLISH from edgeinfer-{dev.id} \(d0, q1, r1, "
                                rf"m\d+, '{re.escape(_base(dev))}/status'")
            deadline = time.monotonic() + 30
            while len(status.findall(broker.log)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            log = broker.log
            births = [m.start() for m in status.finditer(log)]
            assert len(births) >= 2, log[-3000:]
            offer = log.find(f"\t{_base(dev)}/ota/offer (QoS 1)")
            assert 0 <= offer < births[1], log[-3000:]
        finally:
            rig.close()
