"""Which decoder turns a camera's H.264/H.265 packets into pictures: chosen like a backend.

``decoder: auto`` (the default) looks for the board's hardware decoders, in this order:

- ``v4l2m2m``: a V4L2 memory-to-memory decoder (a Raspberry Pi 4's ``bcm2835-codec``, most
  Arm SoCs' VPUs), FFmpeg's ``h264_v4l2m2m`` / ``hevc_v4l2m2m``; present when a
  ``/sys/class/video4linux/*/name`` says it decodes;
- ``nvdec``: NVIDIA's decoder on a GPU with its driver, FFmpeg's ``h264_cuvid`` /
  ``hevc_cuvid``; present when ``/proc/driver/nvidia`` is (a Jetson's decoder is reached
  through its own V4L2 stack, not FFmpeg's NVDEC: it takes the software path unless its
  FFmpeg has ``v4l2m2m`` support for it);
- ``vaapi``: an Intel or AMD GPU through VA-API (a ``/dev/dri/renderD*`` node, and an FFmpeg
  built with VA-API: PyAV's wheels are not);

and takes the first that opens and then decodes the stream's first pictures (a probe: up to
``PROBE_PACKETS`` packets); otherwise FFmpeg's software decoder. Either way one log line says
what decodes and, for the software path, why no hardware one does. Naming a decoder
(``decoder: v4l2m2m``) tries only that one, and falls back to software with a warning.

Only the software path and the fallback have run where edgeinfer is tested (no hardware
decoder there); ``docs/sources.md`` says so.
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import av

__all__ = ["HARDWARE", "PROBE_PACKETS", "Hardware", "hardware_decoder", "present"]

logger = logging.getLogger("edgeinfer.sources.camera")

PROBE_PACKETS = 12  # a hardware decoder with no picture after this many packets is let go


@dataclass(frozen=True, slots=True)
class Hardware:
    """A hardware decoder family: FFmpeg's decoder name for a codec, and what it is."""

    kind: str
    title: str

    def codec(self, codec: str) -> str:
        return {"v4l2m2m": f"{codec}_v4l2m2m", "nvdec": f"{codec}_cuvid"}.get(self.kind, codec)


HARDWARE = {h.kind: h for h in (Hardware("v4l2m2m", "V4L2 M2M"), Hardware("nvdec", "NVDEC"),
                                Hardware("vaapi", "VA-API"))}


def present(kind: str) -> str | None:
    """``None`` when the board seems to have the ``kind`` of decoder, else why not (words)."""
    if kind == "v4l2m2m":
        for name in glob.glob("/sys/class/video4linux/video*/name"):
            try:
                text = Path(name).read_text().lower()
            except OSError:
                continue
            if "dec" in text or "codec" in text:
                return None
        return "no V4L2 memory-to-memory decoder (/sys/class/video4linux)"
    if kind == "nvdec":
        return None if os.path.exists("/proc/driver/nvidia") else "no NVIDIA driver"
    if kind == "vaapi":
        if not glob.glob("/dev/dri/renderD*"):
            return "no GPU render node (/dev/dri/renderD*)"
        from av.codec.hwaccel import hwdevices_available

        if "vaapi" not in hwdevices_available():
            return "this FFmpeg (PyAV's) is built without VA-API"
        return None
    return f"unknown decoder {kind!r}"


def hardware_decoder(stream: av.VideoCodecContext, setting: str, name: str
                     ) -> tuple[av.VideoCodecContext | None, str]:
    """A hardware decoder for ``stream``'s codec that opens (``setting``: ``auto`` or one
    ``HARDWARE`` kind), and what it is; ``(None, why not)`` for the software path."""
    codec = stream.name
    if setting == "software" or codec not in ("h264", "hevc"):
        return None, ("asked for software decoding" if setting == "software"
                      else f"no hardware decoding for {codec}")
    kinds = list(HARDWARE) if setting == "auto" else [setting]
    why: list[str] = []
    for kind in kinds:
        hw = HARDWARE[kind]
        missing = present(kind)
        if missing is not None and setting == "auto":
            why.append(f"{hw.title}: {missing}")
            continue
        try:
            ctx = _open(hw, stream)
        except (av.error.FFmpegError, OSError, ValueError) as exc:
            why.append(f"{hw.title}: {hw.codec(codec)} did not open ({exc})")
            continue
        return ctx, f"{hw.codec(codec)} ({hw.title}, hardware)"
    return None, "; ".join(why)


def _open(hw: Hardware, stream: av.VideoCodecContext) -> av.VideoCodecContext:
    if hw.kind == "vaapi":
        from av.codec.hwaccel import HWAccel

        ctx = av.CodecContext.create(stream.name, "r",
                                     hwaccel=HWAccel("vaapi", allow_software_fallback=False))
    else:
        ctx = av.CodecContext.create(hw.codec(stream.name), "r")
    assert isinstance(ctx, av.VideoCodecContext)
    if stream.extradata:
        ctx.extradata = stream.extradata
    if stream.width and stream.height:
        ctx.width, ctx.height = stream.width, stream.height
    ctx.open()
    return ctx
