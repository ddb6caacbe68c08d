"""A backend from outside the package, registered through the backends table's public way
(``register_backend``) by ``test_backend_table.py``: proof that a backend is one module + one row.

It reads ONNX graphs that are a chain of ``Add``/``Mul`` by constants and folds the whole chain
into one multiply-add at load (``y = x * scale + offset``), so on such a graph it is truly faster
than onnxruntime, which runs every node; any other operator is refused with a ``ModelLoadError``.

It owns one option, as a backend does: ``toy_max_nodes`` (the longest chain it folds), a keyword
of ``backend_options`` once its row names it, checked by its ``make_options``, read back from
``SessionSpec.options["toy"]`` and part of a measured decision's key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from edgeinfer.errors import ConfigError, InferenceError, ModelLoadError
from edgeinfer.runtime.backends import own_options
from edgeinfer.runtime.base import Choice, LoadReport, SessionSpec, TensorSpec, warm_up

NAME = "toy"
runs = 0  # inferences by every toy session: the test checks the chosen backend really ran
DEFAULT_MAX_NODES = 10_000


@dataclass(frozen=True, slots=True)
class ToyOptions:
    """The toy's own options (``SessionSpec.options["toy"]``)."""

    max_nodes: int = DEFAULT_MAX_NODES

    def decision_key(self) -> dict[str, Any]:
        # a chain longer than this refuses the toy: another candidate wins
        return {"toy_max_nodes": self.max_nodes}


def make_options(*, toy_max_nodes: int = DEFAULT_MAX_NODES) -> ToyOptions:
    if not isinstance(toy_max_nodes, int) or toy_max_nodes < 1:
        raise ConfigError(f"toy_max_nodes must be a positive integer, got {toy_max_nodes!r}")
    return ToyOptions(toy_max_nodes)


class ToySession:
    def __init__(self, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                 scale: np.ndarray, offset: np.ndarray, report: LoadReport) -> None:
        self.inputs, self.outputs, self.report = inputs, outputs, report
        self._scale, self._offset = scale, offset

    @property
    def provider(self) -> str:
        return self.report.provider

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        global runs
        try:
            x = feeds[self.inputs[0].name]
        except KeyError as exc:
            raise InferenceError(f"toy: no input {exc}") from None
        runs += 1
        return {self.outputs[0].name: (x * self._scale + self._offset).astype(np.float32)}

    def close(self) -> None:
        pass


def available() -> bool:
    return True


def precisions() -> tuple[str, ...]:
    return ("fp32",)


def version() -> str:
    return "0.1"


def open_session(spec: SessionSpec) -> ToySession:
    choice = spec.choice or Choice(NAME, "CPU", "fp32", spec.threads)
    model = onnx.load(str(spec.path))
    graph = model.graph
    limit = own_options(spec, NAME, ToyOptions).max_nodes
    if len(graph.node) > limit:
        raise ModelLoadError(f"toy folds at most {limit} nodes (toy_max_nodes), "
                             f"{spec.path.name} has {len(graph.node)}")
    consts = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise ModelLoadError(f"toy reads one input and one output, not {spec.path.name}'s")
    current, scale, offset = graph.input[0].name, np.float32(1.0), np.float32(0.0)
    for node in graph.node:
        operands = [n for n in node.input if n != current]
        if node.op_type not in ("Add", "Mul") or len(operands) != 1 or operands[0] not in consts:
            raise ModelLoadError(f"toy runs chains of Add/Mul by constants, not {node.op_type}")
        c = consts[operands[0]]
        scale, offset = (scale, offset + c) if node.op_type == "Add" else (scale * c, offset * c)
        current = node.output[0]
    shape = tuple(d.dim_value for d in graph.input[0].type.tensor_type.shape.dim)
    report = LoadReport(backend=NAME, provider=choice.provider, choice=choice,
                        requested=(choice.provider,))
    session = ToySession((TensorSpec(graph.input[0].name, shape, "float32"),),
                         (TensorSpec(graph.output[0].name, shape, "float32"),),
                         np.broadcast_to(scale, shape).astype(np.float32),
                         np.broadcast_to(offset, shape).astype(np.float32), report)
    if spec.warmup:
        warm_up(session, spec)
    return session
