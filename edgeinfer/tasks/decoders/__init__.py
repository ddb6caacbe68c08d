"""Detection decoders: a detector's raw output tensors -> boxes, scores and class ids.

One module per decoder family, one line each in ``DECODERS`` (the name a config's ``decoder:``
gives -> ``"module:Class"``, imported when first used). A plug-in adds its own with
``register_decoder``. Every decoder is a ``base.Decoder``: it checks a model's outputs when it is
bound to them and has a ``matches(outputs, metadata)`` test used to pick one for
``decoder: auto``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..._importer import import_from_string
from ...errors import ConfigError
from ...runtime.base import TensorSpec
from .base import Decoded, Decoder
from .blazeface import BlazeFaceDecoder, blazeface_anchors
from .ssd import SsdDecoder
from .yolo import YoloV5Decoder, YoloV8Decoder

__all__ = ["DECODERS", "BlazeFaceDecoder", "Decoded", "Decoder", "SsdDecoder", "YoloV5Decoder",
           "YoloV8Decoder", "blazeface_anchors", "decoder_class", "make_decoder",
           "register_decoder"]

DECODERS: dict[str, str | type[Decoder]] = {
    "yolov8": "edgeinfer.tasks.decoders.yolo:YoloV8Decoder",
    "yolov5": "edgeinfer.tasks.decoders.yolo:YoloV5Decoder",
    "ssd": "edgeinfer.tasks.decoders.ssd:SsdDecoder",
    "blazeface": "edgeinfer.tasks.decoders.blazeface:BlazeFaceDecoder",
}


def register_decoder(name: str, decoder: str | type[Decoder]) -> None:
    """Make ``decoder: <name>`` (and ``decoder: auto``) know a decoder.

    Args:
        name: The config value.
        decoder: A ``Decoder`` subclass, or ``"module:Class"`` to import when first used.

    Raises:
        ValueError: ``name`` is taken (or ``auto``).
    """
    if name in DECODERS or name == "auto":
        raise ValueError(f"decoder {name!r} is already registered")
    DECODERS[name] = decoder


def decoder_class(name: str) -> type[Decoder]:
    """The decoder registered as ``name``.

    Raises:
        ConfigError: no such decoder (the valid names are listed).
    """
    try:
        entry = DECODERS[name]
    except KeyError:
        raise ConfigError(f"unknown decoder {name!r}; valid: {', '.join(sorted(DECODERS))}"
                          ) from None
    cls: type[Decoder] = import_from_string(entry) if isinstance(entry, str) else entry
    return cls


def make_decoder(name: str, outputs: Sequence[TensorSpec], input_size: tuple[int, int],
                 metadata: Mapping[str, str] | None = None) -> Decoder:
    """The decoder ``name`` bound to a model's outputs.

    Raises:
        ConfigError: unknown decoder, or outputs it cannot read (the shapes are named).
    """
    return decoder_class(name)(outputs, input_size, metadata)
