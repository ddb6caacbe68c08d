"""GStreamer RTSP server serving a test pattern; run by ``streams.RtspServer`` as a subprocess.

Runs under the system Python (Debian's ``python3-gi`` with ``gir1.2-gst-rtsp-server-1.0``),
not edgeinfer's: it imports nothing from edgeinfer. Prints ``READY <port>`` once listening and
exits on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mount", default="/test")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--fps", type=int, default=25)
    args = parser.parse_args(argv)

    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    # MJPEG over RTP: needs only plugins-base/-good (no x264); is-live paces it in real time.
    # rtpjpegpay takes only 4:2:0/4:2:2 JPEGs ("Invalid component" otherwise, and DESCRIBE then
    # hangs on a media that never prerolls), hence the explicit I420.
    factory.set_launch(
        f"( videotestsrc is-live=true pattern=ball ! video/x-raw,width={args.width},"
        f"height={args.height},framerate={args.fps}/1 ! videoconvert ! video/x-raw,format=I420 "
        f"! jpegenc quality=80 ! rtpjpegpay name=pay0 pt=26 )"
    )
    factory.set_shared(True)
    server.get_mount_points().add_factory(args.mount, factory)
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
