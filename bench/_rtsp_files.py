"""GStreamer's RTSP server serving H.264 MP4 files, one mount each; run by ``bench/cameras.py``.

Runs under the system Python (Debian's ``python3-gi`` with ``gir1.2-gst-rtsp-server-1.0``),
imports nothing from edgeinfer. Every client gets its own playback from the file's start
(unshared media), in real time (the media's clock paces it); no re-encoding
(``qtdemux ! h264parse ! rtph264pay``). Prints ``READY <port>`` once listening; exits on
SIGTERM or SIGINT.

    /usr/bin/python3 bench/_rtsp_files.py --mount /main=main.mp4 --mount /sub=sub.mp4
"""

from __future__ import annotations

import argparse
import signal
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mount", action="append", required=True, help="/path=file.mp4")
    args = parser.parse_args(argv)

    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    mounts = server.get_mount_points()
    for spec in args.mount:
        path, _, file = spec.partition("=")
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(f'( filesrc location="{file}" ! qtdemux ! h264parse '
                           f"! rtph264pay name=pay0 pt=96 config-interval=1 )")
        factory.set_shared(False)
        mounts.add_factory(path, factory)
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
