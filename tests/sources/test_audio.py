"""The audio source against real processes writing PCM and real WAV files."""

from __future__ import annotations

import os
import struct
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config.pipeline import AudioSource as AudioConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import SourceError
from edgeinfer.sources import open_source
from edgeinfer.sources.audio import AudioSource
from edgeinfer.testing.sensors import pcm_command, take

FAST = ReconnectConfig(initial_s=0.02, max_s=0.05)
RAW = {"s16le": "<i2", "s32le": "<i4", "f32le": "<f4", "u8": "u1"}


def _pcm(fmt: str, channels: int, frames: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """Random PCM bytes and the float32 mono samples they should become."""
    rng = np.random.default_rng(seed)
    if fmt == "f32le":
        a = rng.uniform(-1, 1, (frames, channels)).astype("<f4")
        ref = a
    elif fmt == "u8":
        a = rng.integers(0, 256, (frames, channels)).astype("u1")
        ref = (a.astype(np.float32) - 128) / 128
    else:
        bits = 16 if fmt == "s16le" else 32
        a = rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), (frames, channels)).astype(RAW[fmt])
        ref = a.astype(np.float32) / np.float32(2 ** (bits - 1))
    return a.tobytes(), ref.astype(np.float32).mean(axis=1, dtype=np.float32)


@pytest.mark.parametrize(("fmt", "channels"), [("s16le", 1), ("s32le", 2), ("f32le", 1), ("u8", 2)])
def test_command_pcm_becomes_overlapping_mono_windows(tmp_path: Path, fmt: str,
                                                      channels: int) -> None:
    raw, ref = _pcm(fmt, channels, 3000)
    (tmp_path / "pcm").write_bytes(raw)
    # odd chunk sizes: windows straddle writes and samples straddle reads
    cmd = pcm_command(file=tmp_path / "pcm", chunk=777, hold=True)
    config = AudioConfig(command=cmd, sample_rate=8000, channels=channels, sample_format=fmt,
                         window=400, hop=300, reconnect=FAST)
    with open_source(config) as src:
        assert isinstance(src, AudioSource) and src.live
        frames = take(src, 9)
    assert [f.index for f in frames] == list(range(9))  # (3000 - 400) // 300 + 1
    for f in frames:
        assert f.kind == "audio" and f.sample_rate == 8000 and f.data.dtype == np.float32
        assert f.start == pytest.approx(f.index * 300 / 8000)
        np.testing.assert_allclose(f.data, ref[f.index * 300:f.index * 300 + 400], rtol=1e-6)
        assert not f.data.flags.writeable
    assert src.stats.frames == 9 and src.stats.errors == 0


def test_hop_longer_than_window_skips_samples(tmp_path: Path) -> None:
    raw, ref = _pcm("s16le", 1, 2000)
    (tmp_path / "pcm").write_bytes(raw)
    config = AudioConfig(command=pcm_command(file=tmp_path / "pcm", hold=True), window=256,
                         hop=600)
    with AudioSource(config) as src:
        frames = take(src, 3)  # at 0, 600, 1200 (1800 + 256 is past the end)
    assert len(frames) == 3
    for i, f in enumerate(frames):
        np.testing.assert_array_equal(f.data, ref[i * 600:i * 600 + 256])
        assert f.start == pytest.approx(i * 600 / 16000)


def test_command_that_dies_is_restarted_with_its_stderr_counted(tmp_path: Path) -> None:
    # 1600 samples a run: 3 windows of 512, then the command exits with an error
    cmd = pcm_command(seconds=0.1, exit_code=3, stderr="mic unplugged")
    with AudioSource(AudioConfig(command=cmd, window=512, reconnect=FAST)) as src:
        frames = take(src, 9)
    assert len(frames) == 9
    assert src.stats.reconnects >= 2 and src.stats.errors >= 2
    assert "exited with code 3" in src.stats.last_error
    assert "mic unplugged" in src.stats.last_error
    # stream time goes on across restarts (the 64-sample tail of each run is dropped)
    starts = [f.start for f in frames]
    assert starts[:4] == pytest.approx([0, 0.032, 0.064, 0.1])
    assert all(b > a for a, b in zip(starts, starts[1:]))


def test_missing_program_fails_at_once_naming_it_and_its_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It said `cannot start: No such file or directory` after retrying a program that no
    retry brings back; `arecord` comes with alsa-utils."""
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    config = AudioConfig(command="no-such-recorder -f S16_LE",
                         reconnect=ReconnectConfig(initial_s=0.01, max_attempts=2))
    with pytest.raises(SourceError) as err, AudioSource(config) as src:
        list(src)
    assert "no-such-recorder -f S16_LE" in str(err.value)
    assert "no-such-recorder is not installed or not on PATH" in str(err.value)
    config = AudioConfig(command="arecord -q -t raw -f S16_LE -r 16000 -c 1",
                         reconnect=ReconnectConfig(initial_s=0.01, max_attempts=2))
    with pytest.raises(SourceError, match=r"arecord is not installed or not on PATH "
                       r"\(apt install alsa-utils\)"), AudioSource(config) as src:
        list(src)


def test_a_shell_command_missing_arecord_names_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    config = AudioConfig(command="/bin/sh -c 'arecord -q -f S16_LE'",
                         reconnect=ReconnectConfig(initial_s=0.01, max_attempts=2))
    with AudioSource(config) as src, pytest.raises(SourceError) as err:
        list(src)
    assert "exited with code 127" in str(err.value)
    assert "arecord is not installed or not on PATH (apt install alsa-utils)" in str(err.value)
    assert src.stats.errors == 2 and src.stats.reconnects == 1  # max_attempts failures in a row


def test_partial_sample_at_end_of_stream_is_corrupt() -> None:
    # s16le: 1000 samples plus one stray byte, as a recorder writing 8-bit or 24-bit would leave
    cmd = pcm_command(seconds=1000 / 16000, extra_bytes=1)
    with AudioSource(AudioConfig(command=cmd, window=250, reconnect=FAST)) as src:
        frames = take(src, 5)  # 4 windows a run: the 5th comes after the restart
    assert src.stats.corrupt >= 1 and src.stats.reconnects >= 1
    assert frames[4].start == pytest.approx(1000 / 16000)
    assert "exited with code 0" in src.stats.last_error


def test_stop_ends_a_silent_command_and_close_kills_one_ignoring_sigterm() -> None:
    cmd = pcm_command(seconds=0.0, hold=True, ignore_term=True)
    src = AudioSource(AudioConfig(command=cmd))
    src.terminate_timeout_s = 0.3
    done = threading.Event()
    with src:
        pid = src._proc.pid  # type: ignore[union-attr]
        thread = threading.Thread(target=lambda: (list(src), done.set()))
        thread.start()
        time.sleep(0.3)
        src.stop()
        assert done.wait(20.0)  # the recorder never ends by itself: only stop() can end it
    thread.join()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_stop_interrupts_the_backoff() -> None:
    config = AudioConfig(command="false", reconnect=ReconnectConfig(initial_s=30))  # exits at once
    with AudioSource(config) as src:
        threading.Timer(0.2, src.stop).start()
        t0 = time.monotonic()
        assert list(src) == []
    assert time.monotonic() - t0 < 20.0  # not the 30 s backoff


def _write_wav(path: Path, data: bytes, rate: int, channels: int, width: int) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)
    return path


def _write_float_wav(path: Path, data: bytes, rate: int, channels: int) -> Path:
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


@pytest.mark.parametrize(("fmt", "width"), [("s16le", 2), ("u8", 1), ("s32le", 4), ("f32le", 4)])
def test_wav_file_is_read_to_the_end(tmp_path: Path, fmt: str, width: int) -> None:
    raw, ref = _pcm(fmt, 2, 1100)
    path = tmp_path / "a.wav"
    if fmt == "f32le":
        _write_float_wav(path, raw, 16000, 2)
    else:
        _write_wav(path, raw, 16000, 2, width)
    config = AudioConfig(path=str(path), channels=2, sample_format=fmt, window=500)
    with open_source(config) as src:
        assert not src.live
        frames = list(src)
    assert len(frames) == 2  # the last 100 samples make no window
    for i, f in enumerate(frames):
        np.testing.assert_allclose(f.data, ref[i * 500:(i + 1) * 500], rtol=1e-6)
    assert src.stats.corrupt == 0


def test_wav_whose_header_differs_from_the_config_is_refused(tmp_path: Path) -> None:
    path = _write_wav(tmp_path / "speech.wav", b"\0\0" * 100, 22050, 1, 2)
    with pytest.raises(SourceError) as err:
        AudioSource(AudioConfig(path=str(path), sample_rate=16000)).__enter__()
    msg = str(err.value)
    assert "speech.wav" in msg and "22050 Hz" in msg and "16000 Hz" in msg
    path = _write_wav(tmp_path / "stereo8.wav", b"\0" * 100, 16000, 2, 1)
    with pytest.raises(SourceError, match=r"2 channel\(s\), u8.*1 channel\(s\), s16le"):
        AudioSource(AudioConfig(path=str(path))).__enter__()


def test_missing_or_bad_wav_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="nope.wav"):
        AudioSource(AudioConfig(path=str(tmp_path / "nope.wav"))).__enter__()
    (tmp_path / "text.wav").write_text("not audio")
    with pytest.raises(SourceError, match="text.wav is not a WAV file"):
        AudioSource(AudioConfig(path=str(tmp_path / "text.wav"))).__enter__()


def test_realtime_wav_is_paced_at_its_sample_rate(tmp_path: Path) -> None:
    path = _write_wav(tmp_path / "a.wav", b"\0\0" * 4000, 16000, 1, 2)  # 0.25 s
    config = AudioConfig(path=str(path), window=500, realtime=True)
    t0 = time.monotonic()
    with AudioSource(config) as src:
        assert len(list(src)) == 8
    # RateLimiter lets one interval of slack through, then holds 31.25 ms per window
    assert time.monotonic() - t0 >= 0.15  # (no upper bound: timing under load is bench/'s)


def test_a_chatty_stderr_is_drained_and_its_last_lines_kept() -> None:
    # 200 kB on stderr before any audio: undrained, the pipe fills and the command blocks
    cmd = "sh -c 'yes chatter | head -n 25000 >&2; echo last words >&2; head -c 32000 /dev/zero'"
    with AudioSource(AudioConfig(command=cmd, window=1000, reconnect=FAST)) as src:
        frames = take(src, 17, timeout_s=10)  # 16 windows a run: the 17th is after a restart
    assert len(frames) == 17 and not frames[0].data.any()
    assert src.stats.last_error == "exited with code 0: chatter | chatter | last words"
