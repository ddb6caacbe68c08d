"""``Choice``: one exact way to run a model, the unit the backend selector measures and caches.

Every backend opens one (``SessionSpec.choice``); a decision file stores the winner as
``Choice.to_dict()``. Re-exported by ``runtime/base.py`` beside the other session values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRECISIONS = ("fp32", "fp16", "int8")
"""The lowest arithmetic a backend may use for a model's float layers: ``fp32`` only, ``fp16``
(also bf16 where the CPU has it), ``int8`` (also candidates that quantize float weights
themselves). A model's own quantized layers always run as the file says."""


@dataclass(frozen=True, slots=True)
class Choice:
    """One way to run a model, exactly: the unit ``providers: auto`` measures and caches.

    Attributes:
        backend: a name in the backends table (``runtime/backends/__init__.py``):
            ``"onnxruntime"``, ``"openvino"``, ``"litert"``, ``"armnn"`` or one registered
            (a cached choice naming no registered backend is refused by the selector).
        device: onnxruntime: the execution provider (``"CPUExecutionProvider"``); OpenVINO: its
            device (``"CPU"``); LiteRT: ``"xnnpack"`` or an external delegate's library path;
            ARM NN: its backend (``"CpuAcc"``).
        precision: arithmetic for float layers: ``"fp32"``, ``"bf16"``, ``"fp16"``, or ``"int8"``
            (onnxruntime: weights quantized dynamically by edgeinfer).
        threads: intra-op threads.
        opt: onnxruntime graph optimization level (``"all"``, ``"extended"``, ``"basic"``);
            empty for the other backends.
        spin: onnxruntime intra-op thread spinning (faster at >1 thread, burns idle CPU).
    """

    backend: str
    device: str
    precision: str = "fp32"
    threads: int = 1
    opt: str = ""
    spin: bool = False

    @property
    def provider(self) -> str:
        """The short name results and stats carry: the onnxruntime execution provider's name,
        ``"openvino-CPU"``, ``"xnnpack"`` or the delegate, ``"armnn-CpuAcc"``."""
        if self.backend == "onnxruntime":
            return self.device
        if self.backend == "litert":
            return self.device if self.device == "xnnpack" else Path(self.device).name
        return f"{self.backend}-{self.device}"

    def label(self) -> str:
        """``onnxruntime CPU fp32 all spin 2t``: every field, for tables and logs."""
        device = self.device.removesuffix("ExecutionProvider")
        if self.backend == "litert" and self.device != "xnnpack":
            device = Path(self.device).name
        parts = [self.backend, device, self.precision]
        if self.opt:
            parts.append(self.opt)
        if self.spin:
            parts.append("spin")
        parts.append(f"{self.threads}t")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Choice:
        """The inverse of ``to_dict``; ``ValueError`` for anything else (a damaged cache)."""
        try:
            choice = cls(backend=str(data["backend"]), device=str(data["device"]),
                         precision=str(data.get("precision", "fp32")),
                         threads=int(data.get("threads", 1)), opt=str(data.get("opt", "")),
                         spin=bool(data.get("spin", False)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a backend choice: {exc}") from None
        if not choice.backend or choice.threads < 1:
            raise ValueError(f"not a backend choice: {dict(data)!r}")
        return choice
