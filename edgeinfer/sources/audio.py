"""``audio``: raw PCM from a command's stdout (a microphone through ``arecord``, a stream through
``ffmpeg``), or a WAV file, cut into windows of float32 mono samples.

A command is a live source: it is restarted with backoff when it exits or cannot start, its
stderr is drained (so a chatty tool never blocks on a full pipe) and its last lines end up in
the error. Reads take exactly the bytes the next window needs, straight into a buffer that is
converted once into the window; nothing else is buffered.
"""

from __future__ import annotations

import logging
import os
import select
import shlex
import shutil
import signal
import struct
import subprocess
import threading
import time
import wave
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..config.pipeline import AudioSource as AudioConfig
from ..errors import SourceError
from ..frames import Frame
from ._window import Windower
from .base import Backoff, RateLimiter, Source

__all__ = ["AudioSource", "command_problem"]

logger = logging.getLogger(__name__)

# sample_format -> (numpy dtype, offset subtracted, scale to [-1, 1])
_FORMATS: dict[str, tuple[str, float, float]] = {
    "s16le": ("<i2", 0.0, 1.0 / 32768),
    "s32le": ("<i4", 0.0, 1.0 / 2**31),
    "f32le": ("<f4", 0.0, 1.0),
    "u8": ("u1", 128.0, 1.0 / 128),
}
_WAV_PCM = {1: "u8", 2: "s16le", 4: "s32le"}  # sample width in bytes -> format
_POLL_MS = 200  # how long a read waits before it looks at stop()
_STDERR_LINES = 20
_LINE_BYTES = 1024
_NAME_CHARS = 120  # a command in messages is cut here (an inline script would flood the log)
# Recorders an audio `command` usually names, and the Debian/Raspberry Pi OS package of each
_PACKAGES = {"arecord": "alsa-utils", "parec": "pulseaudio-utils", "pw-record": "pipewire-bin",
             "ffmpeg": "ffmpeg", "sox": "sox", "rec": "sox", "gst-launch-1.0":
             "gstreamer1.0-tools"}


class _Pcm:
    """Converts interleaved PCM bytes to float32 mono in [-1, 1]."""

    __slots__ = ("_dtype", "_offset", "_scale", "channels", "frame_bytes")

    def __init__(self, sample_format: str, channels: int) -> None:
        dtype, offset, scale = _FORMATS[sample_format]
        self._dtype = np.dtype(dtype)
        self._offset = np.float32(offset)
        self._scale = np.float32(scale)
        self.channels = channels
        self.frame_bytes = self._dtype.itemsize * channels

    def convert(self, raw: memoryview, out: np.ndarray) -> None:
        a = np.frombuffer(raw, self._dtype, count=len(out) * self.channels)
        if self.channels > 1:
            a.reshape(len(out), self.channels).mean(axis=1, dtype=np.float32, out=out)
            if self._offset:
                out -= self._offset
            out *= self._scale
        elif self._offset:
            np.subtract(a, self._offset, out=out)
            out *= self._scale
        else:
            np.multiply(a, self._scale, out=out)


class AudioSource(Source):
    """Windows of ``window`` float32 mono samples, ``hop`` apart, from a command or a WAV file.

    Frames are ``kind="audio"`` with ``sample_rate`` and ``start``, the stream time (s) of their
    first sample. A command is live (restarted with ``reconnect`` backoff when it exits; samples
    keep counting across restarts); a WAV file is read to its end.

    Args:
        config: The ``audio`` source config.
        **context: Ignored (what other sources need).

    Attributes:
        terminate_timeout_s: How long a command gets to exit after SIGTERM before SIGKILL.
    """

    terminate_timeout_s = 2.0

    def __init__(self, config: AudioConfig, **context: Any) -> None:
        super().__init__(config)
        self.live = config.command is not None
        cmd = config.command
        self._argv: list[str] = (shlex.split(cmd) if isinstance(cmd, str) else list(cmd or []))
        self._pcm = _Pcm(config.sample_format, config.channels)
        self._buf = bytearray(config.window * self._pcm.frame_bytes)
        self._windows = Windower(config.window, config.hop)
        self._pos = 0  # samples of stream time consumed
        self._index = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._poll = select.poll()
        self._stderr: deque[str] = deque(maxlen=_STDERR_LINES)
        self._stderr_thread: threading.Thread | None = None
        self._file: IO[bytes] | None = None
        self._read: Callable[[memoryview], int] = self._read_pipe
        self._last_error = ""

    @property
    def name(self) -> str:
        if not self.live:
            return str(self.config.path)
        cmd = " ".join(shlex.join(self._argv).split())
        return cmd if len(cmd) <= _NAME_CHARS else cmd[:_NAME_CHARS - 3] + "..."

    # -- lifecycle ------------------------------------------------------------------------------
    def _open(self) -> None:
        if not self.live:
            self._read = self._open_wav()
            return
        problem = command_problem(self.config)
        if problem is not None:  # no retry brings a missing program back
            raise SourceError(f"audio command {self.name!r}: {problem}")
        self._last_error = self._start()

    def _frames(self) -> Iterator[Frame]:
        if not self.live:
            yield from self._cut()
            return
        backoff = Backoff(self.config.reconnect, self._stop)
        while not self._stop.is_set():
            if self._proc is not None:
                for frame in self._cut():
                    backoff.attempts = 0
                    yield frame
                if self._stop.is_set():
                    return
                self._last_error = self._reap()
            self._windows.reset()
            self.stats.errors += 1
            self.stats.last_error = self._last_error
            logger.warning("audio command %s: %s", self.name, self._last_error)
            if not backoff.wait():
                if self._stop.is_set():
                    return
                raise SourceError(f"audio command {self.name!r} failed {backoff.attempts + 1} "
                                  f"times in a row; last: {self._last_error}")
            self.stats.reconnects += 1
            self._last_error = self._start()

    def _close(self) -> None:
        self._reap(grace_s=0.0)
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- the command ----------------------------------------------------------------------------
    def _start(self) -> str:
        """Start the command; ``""`` on success, else why it could not start."""
        try:
            # Its own process group: a shell pipeline is stopped as a whole, and a Ctrl-C meant
            # for the daemon does not reach the recorder first.
            proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
        except OSError as exc:
            return f"cannot start: {exc.strerror or exc}"
        assert proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._poll = select.poll()
        self._poll.register(proc.stdout, select.POLLIN)
        self._stderr = deque(maxlen=_STDERR_LINES)
        self._stderr_thread = threading.Thread(target=_drain, args=(proc.stderr, self._stderr),
                                               name="edgeinfer-audio-stderr", daemon=True)
        self._stderr_thread.start()
        return ""

    def _reap(self, grace_s: float = 0.2) -> str:
        """Stop the command (after ``grace_s`` to exit by itself) and say how it ended."""
        proc, self._proc = self._proc, None
        if proc is None:
            return ""
        try:
            proc.wait(grace_s)  # at the end of its stdout it is usually exiting anyway
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(self.terminate_timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self._stderr_thread is not None:
            self._stderr_thread.join(1.0)
            self._stderr_thread = None
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        rc = proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        tail = [line for line in self._stderr if line][-3:]
        if rc == 127:  # a shell's "command not found": name the package
            missing = [w for w in _PACKAGES if any(f"{w}: not found" in t or
                                                    f"{w}: command not found" in t for t in tail)]
            if missing:
                tail.append(_not_installed(missing[0]))
        return how + (": " + " | ".join(tail) if tail else "")

    def _read_pipe(self, mv: memoryview) -> int:
        stdout = self._proc.stdout if self._proc is not None else None
        assert stdout is not None
        got, size = 0, len(mv)
        while got < size:
            if not self._poll.poll(_POLL_MS):
                if self._stop.is_set():
                    break
                continue
            n = stdout.readinto(mv[got:])  # type: ignore[attr-defined]
            if not n:
                break
            got += n
        return got

    # -- windows --------------------------------------------------------------------------------
    def _cut(self) -> Iterator[Frame]:
        """Windows from ``self._read`` until it ends or stop(); a partial sample at the end of
        the stream (a wrong sample format or channel count) is counted corrupt."""
        c, w, read, fb = self.config, self._windows, self._read, self._pcm.frame_bytes
        mv = memoryview(self._buf)
        rate = float(c.sample_rate)
        pacer = RateLimiter(c.sample_rate / w.hop if c.realtime and not self.live else None,
                            self._stop)
        while not self._stop.is_set():
            n = min(w.skip, w.window) if w.skip else w.need
            got = read(mv[:n * fb])
            if got < n * fb:
                self._pos += got // fb
                if got % fb and not self._stop.is_set():
                    self.stats.corrupt += 1
                return
            self._pos += n
            if w.skip:
                w.skip -= n
                continue
            self._pcm.convert(mv[:got], w.free())
            window = w.commit(n)
            if window is None:
                continue
            pacer.pace()
            self.stats.frames += 1
            yield Frame(self._index, time.monotonic(), time.time(), window, "audio",
                        c.sample_rate, start=(self._pos - w.window) / rate)
            self._index += 1

    # -- WAV files ------------------------------------------------------------------------------
    def _open_wav(self) -> Callable[[memoryview], int]:
        c, path = self.config, self.config.path
        try:
            self._file = f = open(path, "rb")  # noqa: SIM115 (closed in _close)
        except OSError as exc:
            raise SourceError(f"cannot open audio file {path}: {exc.strerror or exc}") from exc
        try:
            wav = wave.open(f, "rb")  # noqa: SIM115 (wraps self._file, closed in _close)
            rate, channels = wav.getframerate(), wav.getnchannels()
            fmt = _WAV_PCM.get(wav.getsampwidth(), f"{8 * wav.getsampwidth()}-bit PCM")
            read = _wave_reader(wav)
        except (wave.Error, EOFError) as exc:
            # wave (3.11) reads integer PCM only; float and WAVE_FORMAT_EXTENSIBLE are here
            rate, channels, fmt, read = _riff_reader(f, str(path), exc)
        got = (rate, channels, fmt)
        if got != (c.sample_rate, c.channels, c.sample_format):
            self._close()
            raise SourceError(
                f"audio file {path} is {rate} Hz, {channels} channel(s), {fmt}, but the source "
                f"config says {c.sample_rate} Hz, {c.channels} channel(s), {c.sample_format}")
        return read


def _wave_reader(wav: wave.Wave_read) -> Callable[[memoryview], int]:
    frame_bytes = wav.getsampwidth() * wav.getnchannels()

    def read(mv: memoryview) -> int:
        data = wav.readframes(len(mv) // frame_bytes)
        mv[:len(data)] = data
        return len(data)

    return read


def _riff_reader(f: IO[bytes], path: str, why: Exception
                 ) -> tuple[int, int, str, Callable[[memoryview], int]]:
    """Parse the RIFF header of a WAV that ``wave`` refused; leaves ``f`` at the samples."""
    f.seek(0)
    head = f.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:] != b"WAVE":
        raise SourceError(f"audio file {path} is not a WAV file ({why})")
    fmt: tuple[int, int, int, int] | None = None
    while True:
        chunk = f.read(8)
        if len(chunk) < 8:
            raise SourceError(f"audio file {path} has no data chunk")
        cid, size = chunk[:4], int.from_bytes(chunk[4:], "little")
        if cid == b"fmt ":
            body = f.read(size + size % 2)
            tag, channels, rate = struct.unpack_from("<HHI", body)
            bits = struct.unpack_from("<H", body, 14)[0]
            if tag == 0xFFFE and len(body) >= 26:  # WAVE_FORMAT_EXTENSIBLE: tag in the GUID
                tag = struct.unpack_from("<H", body, 24)[0]
            fmt = (tag, channels, rate, bits)
        elif cid == b"data" and fmt is not None:
            break
        else:
            f.seek(size + size % 2, os.SEEK_CUR)
    assert fmt is not None
    tag, channels, rate, bits = fmt
    name = ("f32le" if tag == 3 and bits == 32 else _WAV_PCM.get(bits // 8, "") if tag == 1
            else "")
    name = name or f"format {tag} with {bits}-bit samples"
    remaining = size

    def read(mv: memoryview) -> int:
        nonlocal remaining
        n = f.readinto(mv[:min(len(mv), remaining)])  # type: ignore[attr-defined]
        remaining -= n
        return int(n)

    return rate, channels, name, read


def _drain(pipe: IO[bytes], tail: deque[str]) -> None:
    """Keep the last lines of a command's stderr; a line without end is cut, not buffered."""
    partial = b""
    try:
        while chunk := pipe.read(4096):
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()[-_LINE_BYTES:]
            tail.extend(line[:_LINE_BYTES].decode(errors="replace").rstrip()
                        for line in lines[-_STDERR_LINES:])
        if partial:
            tail.append(partial.decode(errors="replace").rstrip())
    except (OSError, ValueError):  # closed under us by _reap: a grandchild kept it open
        pass


def command_problem(config: AudioConfig) -> str | None:
    """Why ``config``'s command cannot start here, or ``None``: it is empty, or its program
    is not installed (``edgeinfer validate-config`` asks the same before ``run`` does)."""
    cmd = config.command
    if cmd is None:
        return None  # a WAV file
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    if not argv:
        return "`command` is empty"
    if shutil.which(argv[0]) is None:
        return _not_installed(argv[0])
    return None


def _not_installed(program: str) -> str:
    package = _PACKAGES.get(Path(program).name)
    hint = f" (apt install {package})" if package else ""
    return f"{program} is not installed or not on PATH{hint}"


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
