"""Detection decoders: a detector's raw output tensors -> boxes, scores and class ids.

One module per decoder family, one line each in ``DECODERS`` (the name a config's ``decoder:``
gives -> ``"module:Class"``, imported when first used). A plug-in adds its own with
``register_decoder``. Every decoder is a ``base.Decoder``: it checks a model's outputs when it is
bound to them and has a ``matches(outputs, metadata)`` test used to pick one for
``decoder: auto``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping, Sequence

from ..._importer import import_from_string
from ...errors import ConfigError
from ...runtime.base import TensorSpec, format_shape
from .base import FAR, NEAR, Decoded, Decoder, Mismatch
from .blazeface import BlazeFaceDecoder, blazeface_anchors
from .ssd import SsdDecoder
from .yolo import YoloV5Decoder, YoloV8Decoder

__all__ = ["DECODERS", "BlazeFaceDecoder", "Decoded", "Decoder", "Registry", "SsdDecoder",
           "YoloV5Decoder", "YoloV8Decoder", "blazeface_anchors", "decoder_class",
           "explain_decoders", "make_decoder", "pick_decoder", "register_decoder"]

logger = logging.getLogger(__name__)

Registry = Mapping[str, str | type[Decoder]]
"""Decoders by name: ``DECODERS`` for ``detect``; a task with heads of its own (pose,
segmentation) keeps its own registry of the same shape and passes it to the functions below."""

DECODERS: dict[str, str | type[Decoder]] = {
    "yolov8": "edgeinfer.tasks.decoders.yolo:YoloV8Decoder",
    "yolov5": "edgeinfer.tasks.decoders.yolo:YoloV5Decoder",
    "ssd": "edgeinfer.tasks.decoders.ssd:SsdDecoder",
    "blazeface": "edgeinfer.tasks.decoders.blazeface:BlazeFaceDecoder",
    "blazepose": "edgeinfer.tasks.decoders.blazepose:BlazePoseDecoder",
    "yolo-end2end": "edgeinfer.tasks.decoders.end2end:YoloEnd2EndDecoder",
    "ultralytics-rtdetr": "edgeinfer.tasks.decoders.rtdetr:UltralyticsRtDetrDecoder",
    "yolox": "edgeinfer.tasks.decoders.yolox:YoloxDecoder",
    "yolo-nas": "edgeinfer.tasks.decoders.yolonas:YoloNasDecoder",
    "rtdetr": "edgeinfer.tasks.decoders.detr:RtDetrDecoder",
    "dfine": "edgeinfer.tasks.decoders.detr:DFineDecoder",
    "rfdetr": "edgeinfer.tasks.decoders.detr:RfDetrDecoder",
}


def register_decoder(name: str, decoder: str | type[Decoder],
                     registry: MutableMapping[str, str | type[Decoder]] = DECODERS) -> None:
    """Make ``decoder: <name>`` (and ``decoder: auto``) know a decoder.

    Args:
        name: The config value.
        decoder: A ``Decoder`` subclass, or ``"module:Class"`` to import when first used.
        registry: The task's registry (default: ``detect``'s).

    Raises:
        ValueError: ``name`` is taken (or ``auto``).
    """
    if name in registry or name == "auto":
        raise ValueError(f"decoder {name!r} is already registered")
    registry[name] = decoder


def decoder_class(name: str, registry: Registry = DECODERS) -> type[Decoder]:
    """The decoder registered as ``name`` (in ``registry``).

    Raises:
        ConfigError: no such decoder (the valid names are listed).
    """
    try:
        entry = registry[name]
    except KeyError:
        valid = ", ".join(["auto", *sorted(registry)])
        raise ConfigError(f"unknown decoder {name!r}; valid: {valid}") from None
    cls: type[Decoder] = import_from_string(entry) if isinstance(entry, str) else entry
    return cls


def make_decoder(name: str, outputs: Sequence[TensorSpec], input_size: tuple[int, int],
                 metadata: Mapping[str, str] | None = None, registry: Registry = DECODERS
                 ) -> Decoder:
    """The decoder ``name`` (of ``registry``) bound to a model's outputs.

    Raises:
        ConfigError: unknown decoder, or outputs it cannot read (the shapes are named).
    """
    decoder = decoder_class(name, registry)(outputs, input_size, metadata)
    if decoder.doubt is not None:
        logger.warning("decoder %s: %s; the first frames' values are checked", name,
                       decoder.doubt)
    return decoder


def pick_decoder(outputs: Sequence[TensorSpec], metadata: Mapping[str, str],
                 registry: Registry = DECODERS, model: str = "MODEL") -> tuple[str, str]:
    """``decoder: auto``: the one decoder of ``registry`` whose ``matches`` accepts ``outputs``.

    Args:
        model: The model's path or catalog name, for the command the refusal names.

    Returns:
        The decoder's name and why it was picked (for the log and ``edgeinfer info``).

    Raises:
        ConfigError: none fits (the one or two closest layouts lead, and ``edgeinfer info
            MODEL --task detect`` is named for every decoder's account), or several do (they
            are named).
    """
    verdicts = explain_decoders(outputs, metadata, registry)
    fits = [name for name, verdict in verdicts if verdict is True]
    have = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in outputs) or "none"
    if len(fits) == 1:
        return fits[0], f"the only decoder whose layout fits {have}{_meta_note(metadata)}"
    if fits:
        raise _several(fits, have)
    raise _none_fits([v for _, v in verdicts if isinstance(v, str)], have, model)


def explain_decoders(outputs: Sequence[TensorSpec], metadata: Mapping[str, str],
                     registry: Registry = DECODERS) -> list[tuple[str, bool | str]]:
    """Every decoder of ``registry`` with its ``matches`` verdict on ``outputs`` (``True``,
    why not, or ``False``: never picked by ``auto``), in the registry's order: what ``edgeinfer
    info MODEL --task detect`` prints."""
    verdicts: list[tuple[str, bool | str]] = []
    for name in registry:
        try:
            verdict = decoder_class(name, registry).matches(outputs, metadata)
        except ImportError as exc:  # a plug-in whose package is missing cannot be the one
            verdict = Mismatch(f"decoder {name} cannot be imported: {exc}", name,
                               f"cannot be imported: {exc}", FAR)
        verdicts.append((name, verdict))
    return verdicts


def _none_fits(reasons: list[str], have: str, model: str) -> ConfigError:
    """The refusal of ``decoder: auto``: the one or two closest layouts and the fix first; the
    full account is ``edgeinfer info``'s."""
    near = sorted((r for r in reasons if _nearness(r) > FAR), key=lambda r: -_nearness(r))[:2]
    account = f"every decoder's reason: edgeinfer info {model} --task detect"
    if not near:
        return ConfigError(f"decoder: auto found no decoder for the outputs {have}: none reads "
                           "outputs of these ranks and count. Is it a detector? Set task: "
                           "{type: ...} to the model's task, or decoder: to the layout that "
                           f"made it; {account}")
    closest = "; ".join(f"{r.decoder} ({r.why})" if isinstance(r, Mismatch) else r for r in near)
    return ConfigError(f"decoder: auto found no decoder for the outputs {have}. Closest: "
                       f"{closest}. Fix that, or set decoder: to the layout that made the model; "
                       f"{account}")


def _nearness(reason: str) -> int:
    # A plug-in's plain reason: as near as a named dimension (it read the outputs).
    return reason.nearness if isinstance(reason, Mismatch) else NEAR


def _several(fits: list[str], have: str) -> ConfigError:
    names = " and ".join(", ".join(fits).rsplit(", ", 1))
    return ConfigError(f"decoder: auto: the outputs {have} fit {names}, and the model's metadata "
                      "does not say which made it; set decoder: to one of them (the labels, "
                      "or a metadata 'names', can also tell YOLO layouts apart)")


def _meta_note(metadata: Mapping[str, str]) -> str:
    facts = [f"task {metadata['task']}"] if "task" in metadata else []
    if "names" in metadata:
        facts.append("class names")
    return f" (metadata: {', '.join(facts)})" if facts else ""
