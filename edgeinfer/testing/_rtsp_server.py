"""GStreamer RTSP server serving a test pattern or a video file; run by ``streams.RtspServer``
as a subprocess.

Runs under the system Python (Debian's ``python3-gi`` with ``gir1.2-gst-rtsp-server-1.0``),
not edgeinfer's: it imports nothing from edgeinfer. Prints ``READY <port>`` once listening and
exits on SIGTERM or SIGINT.

Mounts: ``--mount`` serves the main stream, ``--sub-mount`` (with ``--sub-width`` and
``--sub-height``, or ``--sub-file``) a second, smaller one, as a camera's substream. A stream is
a live ``videotestsrc`` encoded as MJPEG (``--codec jpeg``: plugins-good only), H.264
(``--codec h264``: ``x264enc`` from plugins-ugly) or H.265 (``--codec h265``: ``x265enc`` from
plugins-bad), a keyframe every ``--gop`` frames, or, with
``--file``, an MP4 file's H.264 video served as it is (no encoding at run time), looping: the
file's access units are read once, then fed in real time with timestamps that run on across
loops, so clients see one endless stream.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any


def _pattern(codec: str, width: int, height: int, fps: int, gop: int) -> str:
    raw = (f"videotestsrc is-live=true pattern=ball ! video/x-raw,width={width},height={height},"
           f"framerate={fps}/1 ! videoconvert ! video/x-raw,format=I420")
    if codec == "h265":
        return (f"( {raw} ! x265enc tune=zerolatency speed-preset=ultrafast key-int-max={gop} "
                f"bitrate=800 ! video/x-h265,profile=main ! rtph265pay name=pay0 pt=96 "
                f"config-interval=-1 )")
    if codec == "h264":
        return (f"( {raw} ! x264enc tune=zerolatency speed-preset=ultrafast key-int-max={gop} "
                f"bitrate=800 ! video/x-h264,profile=baseline ! rtph264pay name=pay0 pt=96 "
                f"config-interval=-1 )")
    # MJPEG over RTP: needs only plugins-base/-good (no x264); is-live paces it in real time.
    # rtpjpegpay takes only 4:2:0/4:2:2 JPEGs ("Invalid component" otherwise, and DESCRIBE then
    # hangs on a media that never prerolls), hence the explicit I420.
    return f"( {raw} ! jpegenc quality=80 ! rtpjpegpay name=pay0 pt=26 )"


def _read_units(Gst: Any, path: str) -> tuple[Any, list[tuple[bytes, int, int, int, bool]], int]:
    """The caps and access units (data, pts, dts, duration in ns, keyframe) of ``path``'s H.264
    video, and the file's duration in ns."""
    pipeline = Gst.parse_launch(
        f'filesrc location="{path}" ! qtdemux ! h264parse ! '
        "video/x-h264,stream-format=avc,alignment=au ! appsink name=sink sync=false")
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    units: list[tuple[bytes, int, int, int, bool]] = []
    caps = None
    while True:
        sample = sink.emit("try-pull-sample", 10 * Gst.SECOND)
        if sample is None:
            break
        caps = sample.get_caps()
        buf = sample.get_buffer()
        ok, info = buf.map(Gst.MapFlags.READ)
        if not ok:
            continue
        data = bytes(info.data)
        buf.unmap(info)
        pts = buf.pts if buf.pts != Gst.CLOCK_TIME_NONE else 0
        dts = buf.dts if buf.dts != Gst.CLOCK_TIME_NONE else pts
        duration = buf.duration if buf.duration != Gst.CLOCK_TIME_NONE else 0
        units.append((data, pts, dts, duration,
                      not buf.has_flags(Gst.BufferFlags.DELTA_UNIT)))
    pipeline.set_state(Gst.State.NULL)
    if not units or caps is None:
        raise SystemExit(f"no H.264 video in {path}")
    step = units[1][2] - units[0][2] if len(units) > 1 else Gst.SECOND // 25
    first = units[0][2]
    length = units[-1][2] - first + (units[-1][3] or step)
    return caps, units, length


class _FileFeeder:
    """Feeds one media's ``appsrc`` with a file's access units, looping, in real time."""

    def __init__(self, Gst: Any, caps: Any, units: list[tuple[bytes, int, int, int, bool]],
                 length: int) -> None:
        self.Gst, self.caps, self.units, self.length = Gst, caps, units, length

    def configure(self, factory: Any, media: Any) -> None:
        src = media.get_element().get_by_name("src")
        src.set_property("caps", self.caps)
        stop = threading.Event()
        media.connect("unprepared", lambda *_: stop.set())
        threading.Thread(target=self._feed, args=(src, stop), daemon=True).start()

    def _feed(self, src: Any, stop: threading.Event) -> None:
        Gst = self.Gst
        first = self.units[0][2]
        clock = src.get_clock()
        base = clock.get_time() - src.get_base_time() if clock is not None else 0  # running time
        start = time.monotonic()
        loop = 0
        while not stop.is_set():
            offset = loop * self.length
            for data, pts, dts, duration, key in self.units:
                due = start + (offset + dts - first) / Gst.SECOND
                delay = due - time.monotonic()
                if delay > 0 and stop.wait(delay):
                    return
                buf = Gst.Buffer.new_wrapped(data)
                buf.pts = base + offset + pts - first
                buf.dts = base + offset + dts - first
                buf.duration = duration
                if not key:
                    buf.set_flags(Gst.BufferFlags.DELTA_UNIT)
                if src.emit("push-buffer", buf) != Gst.FlowReturn.OK:
                    return  # the media went away
            loop += 1


def _add(Gst: Any, GstRtspServer: Any, server: Any, mount: str, launch: str,
         feeder: _FileFeeder | None) -> None:
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)
    if feeder is not None:
        factory.connect("media-configure", feeder.configure)
    server.get_mount_points().add_factory(mount, factory)


def _stream(Gst: Any, args: argparse.Namespace, file: str | None, width: int, height: int
            ) -> tuple[str, _FileFeeder | None]:
    if file is None:
        return _pattern(args.codec, width, height, args.fps, args.gop or args.fps), None
    caps, units, length = _read_units(Gst, file)
    launch = ("( appsrc name=src is-live=true format=time do-timestamp=false "
              "! h264parse ! rtph264pay name=pay0 pt=96 config-interval=-1 )")
    return launch, _FileFeeder(Gst, caps, units, length)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mount", default="/test")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--fps", type=int, default=25)
    parser.add_argument("--codec", choices=("jpeg", "h264", "h265"), default="jpeg")
    parser.add_argument("--gop", type=int, default=0, help="frames per keyframe (0: fps)")
    parser.add_argument("--file", default=None, help="serve this MP4's H.264 video, looping")
    parser.add_argument("--sub-mount", default=None)
    parser.add_argument("--sub-width", type=int, default=160)
    parser.add_argument("--sub-height", type=int, default=120)
    parser.add_argument("--sub-file", default=None)
    args = parser.parse_args(argv)

    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    _add(Gst, GstRtspServer, server, args.mount,
         *_stream(Gst, args, args.file, args.width, args.height))
    if args.sub_mount:
        _add(Gst, GstRtspServer, server, args.sub_mount,
             *_stream(Gst, args, args.sub_file, args.sub_width, args.sub_height))
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 1

    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"READY {server.get_bound_port()}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
