"""What a device remembers against replays (``ReplayGuard``), and a staged transfer that takes
only the signed bytes of each chunk."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from edgeinfer.errors import OtaRejected
from edgeinfer.ota import manifest as mf
from edgeinfer.ota.keys import PrivateKey
from edgeinfer.ota.receiver import StagedTransfer
from edgeinfer.ota.replay import ReplayGuard
from edgeinfer.testing import onnx_models


def _reason(fn: object, *args: object, **kw: object) -> str:
    with pytest.raises(OtaRejected) as err:
        fn(*args, **kw)  # type: ignore[operator]
    return err.value.reason


def test_sequences_survive_a_restart_and_refuse_going_below(tmp_path: Path) -> None:
    guard = ReplayGuard(tmp_path)
    guard.check_sequence("cls", 5, downgrade=False, request="a" * 16)  # nothing installed yet
    guard.accept("cls", 10, downgrade=False, request="a" * 16, expires=time.time() + 60)
    again = ReplayGuard(tmp_path)  # a restarted device
    assert again.highest("cls") == 10 and again.highest("other") is None
    assert _reason(again.check_sequence, "cls", 9, downgrade=False, request="b" * 16) \
        == "downgrade"
    assert _reason(again.check_sequence, "cls", 10, downgrade=False, request="b" * 16) \
        == "downgrade"  # not above: a replay of the installed update itself
    again.check_sequence("cls", 10, downgrade=False, request="b" * 16, running=True)
    again.check_sequence("cls", 11, downgrade=False, request="b" * 16)
    again.check_sequence("other", 1, downgrade=False, request="b" * 16)
    # a lower one than installed stays the floor's business: accept never lowers it
    again.accept("cls", 3, downgrade=True, request="c" * 16, expires=time.time() + 60)
    assert ReplayGuard(tmp_path).highest("cls") == 10


def test_a_downgrade_is_taken_once(tmp_path: Path) -> None:
    guard = ReplayGuard(tmp_path)
    guard.accept("cls", 10, downgrade=False, request="a" * 16, expires=time.time() + 60)
    guard.check_sequence("cls", 2, downgrade=True, request="d" * 16)
    guard.accept("cls", 2, downgrade=True, request="d" * 16, expires=time.time() + 60)
    assert _reason(ReplayGuard(tmp_path).check_sequence, "cls", 2, downgrade=True,
                   request="d" * 16) == "replayed"
    ReplayGuard(tmp_path).check_sequence("cls", 2, downgrade=True, request="e" * 16)


def test_nonces_are_taken_once_across_restarts_and_pruned_when_old(tmp_path: Path) -> None:
    guard = ReplayGuard(tmp_path, nonce_ttl_s=100)
    now = time.time()
    guard.use_nonce("0011223344556677", now - 500)  # kept until the next prune
    guard.use_nonce("8899aabbccddeeff", now)
    assert _reason(ReplayGuard(tmp_path).use_nonce, "8899aabbccddeeff", now) == "replayed"
    ReplayGuard(tmp_path, nonce_ttl_s=100).use_nonce("1234567812345678", now)
    kept = json.loads((tmp_path / "rollback-nonces.json").read_bytes())
    assert set(kept) == {"8899aabbccddeeff", "1234567812345678"}


def test_an_unreadable_file_starts_afresh_with_an_error(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "replay.json").write_text("{not json")
    guard = ReplayGuard(tmp_path)
    assert guard.highest("cls") is None
    assert "unreadable" in caplog.text
    guard.accept("cls", 1, downgrade=False, request="a" * 16, expires=time.time())
    assert ReplayGuard(tmp_path).highest("cls") == 1


def test_a_staged_transfer_keeps_only_chunks_that_match_the_signed_hashes(tmp_path: Path) -> None:
    model = onnx_models.tiny_classifier(tmp_path / "wide.onnx", classes=4096, seed=2)
    data = model.read_bytes()
    key = PrivateKey.generate()
    chunk = 65536
    m = mf.build_manifest(model, pipeline="cls", version="1", target=mf.Target(device="pi"),
                          chunk_size=chunk, key_id=key.key_id)
    payload = mf.make_offer(m, key)
    st = StagedTransfer.create(tmp_path / "staging", payload, mf.parse_offer(payload), m, None)
    forged = bytes(len(data[:chunk]))
    assert _reason(st.write, 0, forged) == "bad_transfer"
    assert st.missing()[0] == 0 and st.bad_chunks == 1
    for i in range(len(m.chunks)):
        assert st.write(i, data[i * chunk:(i + 1) * chunk])
    assert not st.write(0, data[:chunk])  # a duplicate of a good chunk: ignored
    assert not st.write(0, forged)  # first write wins: a forgery after it changes nothing
    st.flush()
    assert st.complete and st.data_path.read_bytes() == data
    assert st.request == mf.request_id(json.loads(payload)["manifest"],
                                       json.loads(payload)["signature"])
    st.remove()
