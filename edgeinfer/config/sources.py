"""Typed config of a pipeline's sources: one struct per ``type:`` (camera, video, audio,
serial, MQTT...), a tagged union. Field names are a contract; the modules that implement them
(OpenCV, pyserial, ...) are imported only when a pipeline starts. ``config.pipeline`` re-exports
every name here."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ._types import (
    Arg,
    FilePath,
    Fps,
    Readings,
    Samples,
    Seconds,
    Size,
    TaggedPart,
    TopicFilter,
)

__all__ = ["AudioSource", "CameraSource", "ImagesSource", "MqttSource", "Picamera2Source",
           "ReconnectConfig", "SerialSource", "SourceConfig", "SyntheticSource", "VideoSource"]


class ReconnectConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Exponential backoff of a live source that lost its device or stream.

    Attributes:
        initial_s: First wait after a failure.
        max_s: Longest wait; the wait doubles up to it, with up to 20 % jitter.
        max_attempts: Give up after this many failures in a row (``None``: never; a device
            unplugged for an hour comes back when plugged in).
    """

    initial_s: Seconds = 0.5
    max_s: Seconds = 30.0
    max_attempts: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None


class CameraSource(TaggedPart, tag="camera", frozen=True):
    """A camera: a V4L2 device (``/dev/video0`` or an index), an ``rtsp://`` / ``rtsps://``
    stream, ``http(s)://`` MJPEG, or a GStreamer pipeline (``backend: gstreamer``, ``uri`` ending
    in ``appsink``). RTSP goes through PyAV when it is installed (``edgeinfer[rtsp]``): the
    camera's own H.264/H.265 packets are kept for event clips cut without re-encoding
    (``docs/sources.md``); everything else through OpenCV.

    Attributes:
        uri: Device path, device index, stream URL or GStreamer pipeline.
        detect_uri: The camera's low-resolution substream (``rtsp://.../sub``): the frames the
            pipeline decodes and detects on, while ``uri`` (the main stream) is only demuxed for
            clips and never decoded. Boxes, zones and lines are in main-stream pixels. Needs
            PyAV (``backend: auto`` or ``pyav``) and a stream ``uri``.
        width, height, fps: Requested capture mode of a V4L2 device (the device may pick the
            nearest).
        max_fps: Cap on frames handed to the pipeline (frames over it are skipped and counted).
        backend: ``auto`` (PyAV for ``rtsp://`` and ``rtsps://`` when installed, else OpenCV's
            FFmpeg; V4L2 for devices), ``pyav``, ``v4l2``, ``ffmpeg`` (OpenCV's) or
            ``gstreamer`` (OpenCV's).
        transport: RTSP over ``tcp`` (interleaved: no packet lost, what clips from the camera's
            packets need) or ``udp``; ``auto``: TCP with PyAV, FFmpeg's own choice with OpenCV.
            ``tcp``/``udp`` need PyAV.
        fourcc: Pixel format to ask a V4L2 device for, e.g. ``MJPG``.
        open_timeout_s: How long opening or reading a stream may take before it counts as lost.
        isolation: Where the camera is read and decoded: ``process`` (a capture process of
            its own, frames handed over in shared memory: decoding does not take turns with
            inference on the interpreter lock, and a crash in a decoder restarts this camera
            only), ``thread`` (a thread of the pipeline's process); ``auto``: ``process``, or
            ``thread`` where ``EDGEINFER_CAPTURE_IN_PROCESS=1`` is set (a decoder under a
            debugger).
        decoder: What decodes a stream's H.264/H.265 (PyAV): ``auto`` (the board's hardware
            decoder when one opens and decodes the stream's first pictures: V4L2 M2M on a
            Raspberry Pi, NVDEC with an NVIDIA GPU, VA-API; else FFmpeg's software decoder;
            one log line says which), ``software``, or one of ``v4l2m2m``, ``nvdec``,
            ``vaapi`` (tried alone; software, with a warning, when it does not work).
    """

    uri: Arg | Annotated[int, Meta(ge=0, le=255)] = 0
    detect_uri: Arg | None = None
    width: Size | None = None
    height: Size | None = None
    fps: Fps | None = None
    max_fps: Fps | None = None
    backend: Literal["auto", "pyav", "v4l2", "ffmpeg", "gstreamer"] = "auto"
    transport: Literal["auto", "tcp", "udp"] = "auto"
    fourcc: Annotated[str, Meta(min_length=4, max_length=4)] | None = None
    open_timeout_s: Seconds = 10.0
    reconnect: ReconnectConfig = msgspec.field(default_factory=ReconnectConfig)
    isolation: Literal["auto", "process", "thread"] = "auto"
    decoder: Literal["auto", "software", "v4l2m2m", "nvdec", "vaapi"] = "auto"

    def __post_init__(self) -> None:
        if self.backend == "pyav" and not _is_url(self.uri):
            raise ValueError(f"backend pyav reads streams (rtsp://...); uri {self.uri!r} is not "
                             "one: use backend auto or v4l2 for a device")
        if self.detect_uri is not None:
            if self.backend not in ("auto", "pyav"):
                raise ValueError(f"detect_uri needs backend pyav (or auto); backend is "
                                 f"{self.backend}")
            if not _is_url(self.uri) or not _is_url(self.detect_uri):
                raise ValueError("detect_uri is a camera's substream: both uri and detect_uri "
                                 "must be stream URLs (rtsp://...)")
        if self.decoder not in ("auto", "software") and (
                self.backend not in ("auto", "pyav") or not _is_url(self.uri)):
            raise ValueError(f"decoder: {self.decoder} decodes streams through PyAV: it needs a "
                             f"stream uri (rtsp://...) and backend auto or pyav")
        if self.transport != "auto" and self.backend not in ("auto", "pyav"):
            raise ValueError(f"transport: {self.transport} needs backend pyav (or auto); "
                             f"OpenCV's backend {self.backend} lets FFmpeg choose")


def _is_url(uri: str | int) -> bool:
    return isinstance(uri, str) and "://" in uri


class Picamera2Source(TaggedPart, tag="picamera2", frozen=True):
    """The Raspberry Pi CSI camera through picamera2/libcamera (the ``picamera`` extra)."""

    width: Size = 640
    height: Size = 480
    fps: Fps | None = None
    max_fps: Fps | None = None
    camera: Annotated[int, Meta(ge=0, le=63)] = 0
    reconnect: ReconnectConfig = msgspec.field(default_factory=ReconnectConfig)


class VideoSource(TaggedPart, tag="video", frozen=True):
    """A video file, read to the end (nothing skipped), optionally looping.

    Attributes:
        uri: The file.
        fps: Pace reading to this rate (``None``: as fast as the pipeline takes frames).
        loop: Start again at the end.
        isolation: ``process``: read and decoded ahead in a capture process (as cameras are),
            in step with the pipeline (it waits for inference; nothing is skipped);
            ``thread``: in the pipeline's process; ``auto``: ``thread`` (measured: a file is
            read at the pipeline's pace, and its decoder already runs beside inference off
            the interpreter lock; the process's hand-over cost more than it saved).
    """

    uri: FilePath
    fps: Fps | None = None
    loop: bool = False
    isolation: Literal["auto", "process", "thread"] = "auto"


class ImagesSource(TaggedPart, tag="images", frozen=True):
    """Image files: a folder (sorted) or a glob pattern."""

    uri: FilePath
    fps: Fps | None = None
    loop: bool = False


class SyntheticSource(TaggedPart, tag="synthetic", frozen=True):
    """A generated moving test pattern, for smoke tests on a device with no camera.

    Attributes:
        frames: Stop after this many (``None``: run until stopped).
    """

    width: Size = 640
    height: Size = 480
    fps: Fps = 15.0
    frames: Annotated[int, Meta(ge=1, le=1_000_000_000)] | None = None


class AudioSource(TaggedPart, tag="audio", frozen=True):
    """Raw PCM from a command's stdout (e.g. ``arecord -f S16_LE -r 16000 -c 1 -t raw``) or a
    WAV file, cut into windows.

    Attributes:
        command: The command (a list, or a string split like a shell would). Live: restarted
            with backoff when it exits.
        path: A WAV file instead of a command.
        sample_rate, channels, sample_format: What the command writes (a WAV file's header is
            checked against them).
        window: Samples per window (per channel; channels are averaged to mono).
        hop: Samples between window starts (``None``: ``window``, no overlap).
        realtime: Replay a WAV ``path`` at its sample rate, as a microphone would deliver it
            (default: as fast as the pipeline takes windows).
    """

    command: Arg | list[Arg] | None = None
    path: FilePath | None = None
    sample_rate: Annotated[int, Meta(ge=1000, le=384000)] = 16000
    channels: Annotated[int, Meta(ge=1, le=32)] = 1
    sample_format: Literal["s16le", "s32le", "f32le", "u8"] = "s16le"
    window: Samples = 512
    hop: Samples | None = None
    reconnect: ReconnectConfig = msgspec.field(default_factory=ReconnectConfig)
    realtime: bool = False

    def __post_init__(self) -> None:
        if (self.command is None) == (self.path is None):
            raise ValueError("give exactly one of `command` or `path`")


class SerialSource(TaggedPart, tag="serial", frozen=True):
    """A line-based sensor on a tty (the ``serial`` extra): CSV or JSON per line, windowed.

    Attributes:
        port: The tty, e.g. ``/dev/ttyUSB0``.
        format: ``csv`` (numbers separated by commas) or ``json`` (an object per line).
        fields: Column names (CSV) or keys to read (JSON), in order.
        window, hop: Readings per window and between window starts.
    """

    port: FilePath
    baudrate: Annotated[int, Meta(ge=50, le=12_000_000)] = 115200
    format: Literal["csv", "json"] = "csv"
    fields: list[str] = []
    window: Readings = 1
    hop: Readings | None = None
    reconnect: ReconnectConfig = msgspec.field(default_factory=ReconnectConfig)


class MqttSource(TaggedPart, tag="mqtt", frozen=True):
    """Sensor readings arriving as JSON on an MQTT topic, windowed (the broker is ``mqtt:``)."""

    needs_sections = ("mqtt",)

    topic: TopicFilter
    fields: list[str] = []
    window: Readings = 1
    hop: Readings | None = None
    qos: Literal[0, 1] = 1


SourceConfig = (
    CameraSource | Picamera2Source | VideoSource | ImagesSource | SyntheticSource | AudioSource
    | SerialSource | MqttSource
)
