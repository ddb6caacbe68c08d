"""``vad``: voice activity with the Silero VAD ONNX model, its recurrent state carried across
audio windows, debounced into speech segments with start/end times in stream seconds.

The model is fed as the official ``silero_vad.utils_vad.OnnxWrapper`` feeds it: windows of 512
samples at 16 kHz (256 at 8 kHz), each preceded by the last 64 (32) samples of the previous
window's model input as context, ``state`` [2, 1, 128] from the previous ``stateN``, ``sr`` an
int64 scalar. A rate that is a multiple of 16 kHz is decimated to 16 kHz by taking every n-th
sample, as the official code does. The state changes only in the inference thread
(``inject_state``/``update_state``), so early preprocessing of the next window never races it.

Debouncing (``postprocess``), after Silero's ``get_speech_timestamps``: a window is speech at
``probability >= threshold`` and silence below ``max(threshold - 0.15, 0.01)`` (in between
keeps the current state). The first speech window opens a candidate segment; silence lasting
``min_silence_ms`` closes it. A candidate that has lasted ``min_speech_ms`` (pauses shorter
than ``min_silence_ms`` included) becomes a segment: the ``"start"`` event, dated back to its
first speech window. The ``"end"`` event is dated back to the first window of the silence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.pipeline import VadTask as VadConfig
from ..errors import ConfigError
from ..frames import VAD, DropFrame, Frame, TaskResult, VadState
from .base import Entity, Task

if TYPE_CHECKING:
    from ..model.model import Model

__all__ = ["VadTask", "silero_load_options"]

WINDOWS = {16000: 512, 8000: 256}  # samples per model input at each native rate
CONTEXTS = {16000: 64, 8000: 32}  # samples of the previous input prepended to each window
STATE_SHAPE = (2, 1, 128)


def silero_load_options(sample_rate: int = 16000) -> dict[str, Any]:
    """``load_model`` keyword arguments that let the Silero model warm up (zeros are no valid
    ``sr``, and its dynamic input length must be given)."""
    rate, _ = _native(sample_rate)
    n = WINDOWS[rate] + CONTEXTS[rate]
    return {"input_shapes": {"input": (1, n), "state": STATE_SHAPE},
            "warmup_inputs": {"sr": rate}}


class VadTask(Task):
    """Speech probability per audio window and debounced speech segments.

    Args:
        config: The ``vad`` task config.
        model: A loaded Silero VAD model (inputs ``input``, ``state``, ``sr``; outputs
            ``output``, ``stateN``).

    Raises:
        ConfigError: The model's inputs or outputs are not Silero's (the message names them).
    """

    Config = VadConfig
    part = VAD
    stateful = True

    @classmethod
    def ha_entities(cls, pipeline: str, result_topic: str) -> list[Entity]:
        """Speech or not."""
        return [("binary_sensor", "speech", {
            "name": f"{pipeline} speech", "state_topic": result_topic,
            "value_template": "{{ 'ON' if value_json.vad.speech else 'OFF' }}",
            "device_class": "sound"})]

    @classmethod
    def load_options(cls, config: Any, source: Any) -> dict[str, Any]:
        """Silero's input shapes and warm-up values at the source's sample rate."""
        return silero_load_options(getattr(source, "sample_rate", 16000))

    def __init__(self, config: VadConfig, model: Model) -> None:
        super().__init__(config, model)
        _check_model(model)
        self._srs = {rate: np.array(rate, dtype=np.int64) for rate in WINDOWS}
        self._neg = max(config.threshold - 0.15, 0.01)
        self.reset()

    def reset(self) -> None:
        """Zero the recurrent state and context and forget any segment in progress."""
        self._state = np.zeros(STATE_SHAPE, np.float32)
        self._context: np.ndarray | None = None
        self._pending: np.ndarray | None = None
        self._rate = 0
        self._speech = False
        self._candidate: float | None = None  # first window of speech not yet long enough
        self._silence: float | None = None  # first window of silence inside a segment
        self._segment: float | None = None  # start of the current segment

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]:
        """The window as ``input`` (with room for the context ``inject_state`` adds) and ``sr``.

        Raises:
            ConfigError: Not audio, a rate the model cannot take, or a window of the wrong
                length (the message says which ``window`` to set on the audio source).
            DropFrame: The window holds NaN or infinite samples (they would poison the state).
        """
        if frame.kind != "audio" or frame.sample_rate is None:
            raise ConfigError(f"the vad task needs an audio source, got {frame.kind!r} frames")
        rate, step = _native(frame.sample_rate)
        x = frame.data
        expected = WINDOWS[rate] * step
        if x.ndim != 1 or x.shape[0] != expected:
            raise ConfigError(
                f"the vad model takes windows of {WINDOWS[rate]} samples at {rate} Hz; the audio "
                f"source gives {x.shape[0] if x.ndim == 1 else x.shape} samples at "
                f"{frame.sample_rate} Hz: set `window: {expected}` on the source")
        if not math.isfinite(float(x.sum())):
            raise DropFrame
        ctx = CONTEXTS[rate]
        buf = np.empty((1, ctx + WINDOWS[rate]), np.float32)
        buf[0, ctx:] = x[::step] if step > 1 else x
        return {"input": buf, "sr": self._srs[rate]}, None

    def inject_state(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fill in the previous window's context and the recurrent state."""
        buf = feeds["input"]
        rate = int(feeds["sr"])
        ctx = CONTEXTS[rate]
        if rate != self._rate:  # the official wrapper starts over when the rate changes
            self._state = np.zeros(STATE_SHAPE, np.float32)
            self._context = None
            self._rate = rate
        if self._context is None:
            buf[0, :ctx] = 0.0
        else:
            buf[0, :ctx] = self._context
        self._pending = buf[0, -ctx:]
        feeds["state"] = self._state
        return feeds

    def update_state(self, outputs: Mapping[str, np.ndarray]) -> None:
        """Keep ``stateN`` and this window's tail as the next window's state and context."""
        self._state = outputs["stateN"]
        self._context = self._pending

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        """Debounce this window's probability into a ``VadState``."""
        p = float(outputs["output"].reshape(-1)[0])
        rate = float(frame.sample_rate or 16000)
        duration = frame.data.shape[0] / rate
        t = frame.start if frame.start is not None else frame.index * duration
        c = self.config
        if p >= c.threshold:
            self._silence = None
            if not self._speech and self._candidate is None:
                self._candidate = t
        elif p < self._neg and (self._speech or self._candidate is not None):
            if self._silence is None:
                self._silence = t
            if (t + duration - self._silence) * 1000.0 >= c.min_silence_ms - 1e-6:
                silence, self._silence, self._candidate = self._silence, None, None
                if self._speech:
                    start, self._segment, self._speech = self._segment, None, False
                    return TaskResult(VAD, VadState(False, p, start, silence, "end"))
        if (not self._speech and self._candidate is not None and self._silence is None
                and (t + duration - self._candidate) * 1000.0 >= c.min_speech_ms - 1e-6):
            self._speech, self._segment, self._candidate = True, self._candidate, None
            return TaskResult(VAD, VadState(True, p, self._segment, None, "start"))
        return TaskResult(VAD, VadState(self._speech, p, self._segment))


def _native(sample_rate: int) -> tuple[int, int]:
    """The model rate a stream is fed at and the decimation step that gets it there."""
    if sample_rate in WINDOWS:
        return sample_rate, 1
    if sample_rate % 16000 == 0:
        return 16000, sample_rate // 16000
    raise ConfigError(f"the vad model takes 8000 or 16000 Hz audio (or a multiple of 16000), "
                      f"got {sample_rate} Hz")


def _check_model(model: Model) -> None:
    ins = {s.name: s for s in model.inputs}
    outs = {s.name: s for s in model.outputs}
    ok = (
        set(ins) == {"input", "state", "sr"} and {"output", "stateN"} <= set(outs)
        and len(ins["input"].shape) == 2 and ins["input"].dtype == "float32"
        and len(ins["state"].shape) == 3 and _fits(ins["state"].shape[0], 2)
        and _fits(ins["state"].shape[2], 128)
        and ins["sr"].dtype == "int64" and ins["sr"].shape == ()
    )
    if not ok:
        def describe(specs: Any) -> str:
            return ", ".join(f"{s.name} {list(s.shape)} {s.dtype}" for s in specs)

        raise ConfigError(
            f"the vad task needs a Silero VAD model (inputs input [batch, samples] float32, "
            f"state [2, batch, 128] float32, sr [] int64; outputs output [batch, 1], stateN); "
            f"model {model.name!r} has inputs {describe(model.inputs)}; "
            f"outputs {describe(model.outputs)}")


def _fits(dim: Any, size: int) -> bool:
    return dim == size or not isinstance(dim, int)  # a symbolic or unknown dim takes any size
