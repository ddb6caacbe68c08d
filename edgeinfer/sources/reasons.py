"""Why a camera cannot be opened, in words, with the fix.

OpenCV says only "not opened". For a V4L2 device the kernel's answer (``ENOENT``, ``EACCES``,
``EBUSY`` ...) is read by opening the node ourselves; for a stream the reason is in FFmpeg's own
log lines (``[tcp @ 0x55...] Connection to tcp://127.0.0.1:9 failed: Connection refused``), which
the camera captures while it opens and hands here (they go to the debug log, not to the user).
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["device_path", "device_reason", "no_rtp_reason", "probe_reply", "slow_reply_reason",
           "stream_host", "stream_reason"]

_PROBE_BYTES = 8192
_PROBE_CONNECT_S = 0.5  # a camera off the network costs a probe no more than this

_DEVICE_ERRNO = {
    errno.ENOENT: "no such device {path}: is the camera plugged in? `ls /dev/video*`",
    errno.EACCES: "permission denied on {path}: add the service user to the video group "
                  "(`sudo usermod -aG video USER`, then restart the service)",
    errno.EPERM: "permission denied on {path}: add the service user to the video group "
                 "(`sudo usermod -aG video USER`, then restart the service)",
    errno.EBUSY: "{path} is busy: another program holds the camera (`fuser -v {path}`)",
    errno.ENODEV: "{path} is gone (unplugged?): plug the camera back in",
    errno.ENXIO: "{path} is gone (unplugged?): plug the camera back in",
}

_TIMED_OUT = ("timed out connecting to {host}: is the camera on this network, and the address "
              "right?")

# (words FFmpeg uses, lower case) -> the reason; checked in order, first match wins. No bare
# numbers or "timeout": FFmpeg's lines carry the URL ("tcp://127.0.0.1:40123?timeout=0").
_STREAM_WORDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("unauthorized",),
     "401 Unauthorized from {host}: check the user name and password in the URI"),
    (("forbidden",), "403 Forbidden from {host}: this user may not read the stream"),
    (("not found",), "404 stream not found on {host}: check the stream path in the URI"),
    (("connection refused",),
     "connection refused by {host}: is the camera (or RTSP server) on, and the port right?"),
    (("failed to resolve", "name or service not known", "temporary failure in name resolution",
      "no address associated"),
     "cannot resolve {hostname} (DNS failure): check the host name, or use the IP address"),
    (("no route to host", "network is unreachable"),
     "no route to {host}: check the network cable or Wi-Fi and the address"),
    (("timed out",), _TIMED_OUT),
    (("invalid data found",), "{host} answered, but not with a stream FFmpeg can read: check "
                              "the URI's scheme and path"),
)


def device_path(uri: str | int) -> str | None:
    """The device node a V4L2 camera ``uri`` names (``0`` -> ``/dev/video0``), else ``None``."""
    if isinstance(uri, int) or uri.isdigit():
        return f"/dev/video{int(uri)}"
    return uri if uri.startswith("/dev/") else None


def device_reason(path: str) -> str:
    """Why ``path`` cannot be opened as a camera: the kernel's answer to opening it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError as exc:
        words = _DEVICE_ERRNO.get(exc.errno or 0)
        if words is None:
            return f"cannot open {path}: {exc.strerror}"
        return words.format(path=path)
    os.close(fd)
    # V4L2 says EBUSY only when streaming starts, which OpenCV does not report: say both.
    return (f"{path} opens but gives no video: another program may hold the camera "
            f"(`fuser -v {path}`), or it is not a capture node (`v4l2-ctl --list-devices`)")


def stream_host(uri: str) -> str:
    """``host:port`` (or ``host``) of stream ``uri``, as reasons name it."""
    parts = urlsplit(uri)
    hostname = parts.hostname or uri
    return f"{hostname}:{parts.port}" if parts.port else hostname


def no_rtp_reason(uri: str, seconds: float) -> str:
    """Why a stream that opened (the camera answered PLAY) was dropped before any packet."""
    return (f"no RTP arrived in {seconds:.1f} s since PLAY: {stream_host(uri)} answered the RTSP "
            "requests but sends no video; check that the stream is enabled on the camera (with "
            "transport: udp, that no firewall drops RTP)")


def slow_reply_reason(uri: str, got: int, complete: bool, timeout_s: float) -> str:
    """Why an open that ran into its timeout did, when the camera does answer: ``got`` bytes
    of the reply to a probe, ``complete`` whether its head was whole."""
    host = stream_host(uri)
    if complete:
        what = (f"it answers, but opening the stream (DESCRIBE, SETUP, PLAY) did not finish "
                f"in {timeout_s:g} s")
    else:
        what = (f"{got} bytes of an RTSP reply, never completed, and opening did not finish "
                f"in {timeout_s:g} s")
    return (f"slow or incomplete reply from the camera at {host}: {what}; the camera (or "
            "something in between) is overloaded or is not an RTSP server: check it, or raise "
            "open_timeout_s")


def stream_reason(uri: str, lines: Sequence[str], *, timed_out: bool = False) -> str:
    """Why stream ``uri`` (with its password already masked) did not open, from FFmpeg's lines
    printed while opening it; ``timed_out``: the open ran into its timeout."""
    parts = urlsplit(uri)
    hostname = parts.hostname or uri
    host = stream_host(uri)
    text = "\n".join(lines).lower()
    for words, reason in _STREAM_WORDS:
        if any(w in text for w in words):
            return reason.format(host=host, hostname=hostname)
    if timed_out:
        return _TIMED_OUT.format(host=host)
    last = next((ln for ln in reversed(lines) if "] " in ln), "")
    detail = f" (FFmpeg: {last.split('] ', 1)[1]})" if last else ""
    return f"cannot open the stream at {host}{detail}: check the URI and that the camera is on"


def probe_reply(uri: str, timeout_s: float) -> tuple[int, bool] | None:
    """Ask ``uri``'s server for ``OPTIONS`` (no credentials sent) and read its reply for up to
    ``timeout_s``: the bytes that came and whether the reply's head was whole; ``None``: no
    connection."""
    parts = urlsplit(uri)
    netloc = parts.netloc.rpartition("@")[2]
    request = (f"OPTIONS rtsp://{netloc}{parts.path or '/'} RTSP/1.0\r\nCSeq: 1\r\n"
               "User-Agent: edgeinfer\r\n\r\n").encode()
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        # A camera off the network costs its retries no more than half a second more.
        with socket.create_connection((parts.hostname or "", parts.port or 554),
                                      timeout=min(_PROBE_CONNECT_S, timeout_s)) as sock:
            sock.sendall(request)
            while b"\r\n\r\n" not in data and len(data) < _PROBE_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                chunk = sock.recv(_PROBE_BYTES)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        pass
    except OSError:
        if not data:
            return None
    return len(data), b"\r\n\r\n" in data
