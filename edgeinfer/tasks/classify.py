"""``classify``: image -> one score per class -> top-k with labels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from ..config.pipeline import ClassifyTask as ClassifyConfig
from ..config.pipeline import PreprocessConfig
from ..errors import ConfigError, InvalidInputError
from ..frames import TOP, Classification, Frame, TaskResult
from ..runtime.base import format_shape
from ..runtime.gate import Gate
from .base import Entity, Task, label_of, load_labels
from .decoders.meta import read_meta
from .gates import ClassifyGate
from .labels import file_metadata
from .metrics import OutputPair, cosine, fmt_metric
from .preprocess import Preprocessor, Transform

if TYPE_CHECKING:
    from ..model.model import Model

__all__ = ["ClassifyTask", "is_probabilities", "softmax"]


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of a 1-D array, stable for large logits."""
    e = np.exp(x - x.max())
    return np.asarray(e / e.sum())


def is_probabilities(x: np.ndarray, tol: float = 1e-3) -> bool:
    """All in [0, 1] and summing to 1 within ``tol``."""
    return bool(x.min() >= 0.0 and x.max() <= 1.0 and abs(float(x.sum()) - 1.0) <= tol)


class ClassifyTask(Task):
    """Top-k classification of image frames.

    The model has one image input and one output whose last dimension is the class count (the
    others 1, e.g. ``[1, 1000]``). ``softmax: auto`` applies softmax unless the scores already
    are probabilities (all in [0, 1], summing to about 1).

    An Ultralytics classifier (metadata ``task: classify``) gets its class names from the
    metadata unless ``labels`` are given, and Ultralytics' preprocessing (``resize:
    center_crop``) unless ``preprocess`` is configured.

    Raises:
        ConfigError: the model has more than one input or output, the output is not one score
            per class, or the labels do not match the class count.
    """

    Config = ClassifyConfig
    part = TOP
    gate_key: ClassVar[str] = "classify"

    @classmethod
    def ha_entities(cls, pipeline: str, result_topic: str) -> list[Entity]:
        """The top label."""
        return [("sensor", "top", {
            "name": f"{pipeline} top label", "state_topic": result_topic,
            "value_template": "{{ value_json.top[0].label if value_json.top else 'none' }}"})]

    def __init__(self, config: ClassifyConfig, model: Model) -> None:
        super().__init__(config, model)
        if len(model.inputs) != 1 or len(model.outputs) != 1:
            raise ConfigError(
                f"classify needs a model with one image input and one output; {model.name} has "
                f"inputs {_names(model.inputs)} and outputs {_names(model.outputs)}")
        out = model.outputs[0]
        classes = out.shape[-1] if out.shape else None
        if not out.shape or any(isinstance(d, int) and d != 1 for d in out.shape[:-1]):
            raise ConfigError(f"classify expects one output [1, classes]; {model.name} has "
                              f"{out.name} {format_shape(out.shape)}")
        self.num_classes = classes if isinstance(classes, int) and classes > 0 else None
        meta = read_meta(file_metadata(model.path, model.format, model.metadata))
        ultralytics = meta.task == "classify"
        self.labels = load_labels(config.labels) if config.labels is not None or not ultralytics \
            else meta.names
        if self.labels is not None and self.num_classes is not None \
                and len(self.labels) != self.num_classes:
            raise ConfigError(f"labels has {len(self.labels)} entries; output {out.name} "
                              f"{format_shape(out.shape)} scores {self.num_classes} classes")
        pre = config.preprocess
        if ultralytics and pre == PreprocessConfig():
            pre = msgspec.structs.replace(pre, resize="center_crop")
        self.preprocessor = Preprocessor(pre, model.inputs[0])
        self._input, self._output = model.inputs[0].name, out.name

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Transform]:
        """The model's input for ``frame``."""
        tensor, transform = self.preprocessor(frame.data)
        return {self._input: tensor}, transform

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        """The ``top_k`` classes scoring at least ``score_threshold``, best first."""
        return TaskResult(TOP, self.classify(outputs[self._output]))

    def classify(self, output: np.ndarray) -> tuple[Classification, ...]:
        """Top-k of one output tensor (batch of 1)."""
        cfg: ClassifyConfig = self.config
        x = np.asarray(output, dtype=np.float32).reshape(-1)
        if self.labels is not None and x.size != len(self.labels):
            raise InvalidInputError(f"output has {x.size} scores, labels {len(self.labels)}")
        if cfg.softmax == "yes" or (cfg.softmax == "auto" and not is_probabilities(x)):
            x = softmax(x)
        k = min(cfg.top_k, x.size)
        top = np.argpartition(-x, k - 1)[:k] if k < x.size else np.arange(x.size)
        top = top[np.argsort(-x[top], kind="stable")]
        # A threshold of 0 keeps everything, raw logits below 0 included (softmax: no).
        thr = cfg.score_threshold if cfg.score_threshold > 0 else -np.inf
        return tuple(Classification(label_of(self.labels, int(i)), int(i), float(x[i]))
                     for i in top if x[i] >= thr)


    def accuracy_gate(self) -> Gate:
        """The same top-1 class on the sample photographs (``tasks.gates.ClassifyGate``)."""
        return ClassifyGate(ClassifyTask(self.config, self.model), self.model.outputs[0].name)

    def accuracy_metrics(self, pairs: Sequence[OutputPair]) -> dict[str, Any]:
        """Top-1 agreement and the cosine similarity of the score vectors."""
        agree, cos = [], []
        for ref, q in pairs:
            (a,), (b,) = ref.values(), q.values()
            agree.append(float(np.argmax(a) == np.argmax(b)))
            cos.append(cosine(a, b))
        return {"top1_agreement": float(np.mean(agree)) if agree else None,
                "cosine_mean": float(np.mean(cos)) if cos else None,
                "cosine_min": float(np.min(cos)) if cos else None}

    @classmethod
    def accuracy_rows(cls, report: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Top-1 agreement and cosine, then the per-tensor rows."""
        r, f = report, fmt_metric
        return [("top-1 agree", f"{f(r['top1_agreement'])} over {r['samples']} inputs"),
                ("cosine", f"mean {f(r['cosine_mean'])}, min {f(r['cosine_min'])}"),
                *super().accuracy_rows(report)]


def _names(specs: Any) -> str:
    return "[" + ", ".join(f"{s.name} {format_shape(s.shape)}" for s in specs) + "]"
