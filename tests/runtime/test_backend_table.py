"""The backends table: a backend from a test module, registered through ``register_backend``,
is measured and chosen by ``load_model`` with no file of ``edgeinfer/`` edited; its own option
travels to it and into the decision key; and the decision cache key of the built-in backends is
what it was before the table (cached decisions found)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ConfigError, ModelLoadError
from edgeinfer.runtime import backends, decision, open_session
from edgeinfer.runtime.backends.onnx import OnnxOptions
from edgeinfer.runtime.backends.tflite import LiteRTOptions
from edgeinfer.runtime.base import Choice, DelegateSpec, SessionSpec
from edgeinfer.runtime.candidates import admissible
from edgeinfer.runtime.providers import cpu_features_digest, detect_platform

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import toy_backend  # noqa: E402  (tests/runtime/toy_backend.py)

NODES = 3000  # onnxruntime runs each node (milliseconds); the toy folds them into one


@pytest.fixture
def toy() -> Iterator[str]:
    backends.register_backend("toy", "toy_backend", formats=("onnx",), options=("toy_max_nodes",))
    try:
        yield "toy"
    finally:
        del backends.BACKENDS["toy"]


def _chain(path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range(NODES):
        op = "Add" if i % 2 == 0 else "Mul"
        value = rng.normal(0, 0.01, (1, 64)) if op == "Add" else 1 + rng.normal(0, 0.001, (1, 64))
        inits.append(numpy_helper.from_array(value.astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node(op, [current, f"c{i}"], [f"t{i}"]))
        current = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_backend_registered_from_a_test_module_is_measured_and_chosen(
        toy: str, tmp_path: Path) -> None:
    path = _chain(tmp_path / "chain.onnx")
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    with edgeinfer.load_model(path, providers="cpu", probe=False) as ort_model:
        expected = ort_model.run(x)["y"]
    before = toy_backend.runs
    with edgeinfer.load_model(path, providers=toy, state_dir=tmp_path / "state",
                              probe_budget_s=10) as m:
        assert m.provider == "toy-CPU", m.selection
        assert m.selection is not None and m.selection["choice"]["backend"] == "toy"
        got = m.run(x)["y"]
    assert toy_backend.runs > before
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # the decision was cached under the toy's name and a second load opens it without measuring
    with edgeinfer.load_model(path, providers=toy, state_dir=tmp_path / "state") as again:
        assert again.provider == "toy-CPU"


def test_the_table_refuses_what_it_cannot_hold(toy: str) -> None:
    with pytest.raises(ConfigError, match="already registered"):
        backends.register_backend(toy, "toy_backend", formats=("onnx",))
    with pytest.raises(ConfigError, match="formats"):
        backends.register_backend("other", "toy_backend", formats=("pt",))
    with pytest.raises(ConfigError, match="unknown backend 'nope'; valid: armnn, litert"):
        backends.module("nope")
    assert Choice.from_dict({"backend": toy, "device": "CPU"}).provider == "toy-CPU"


def test_a_cached_choice_of_a_backend_no_longer_registered_is_not_opened(tmp_path: Path) -> None:
    spec = SessionSpec(path=tmp_path / "m.onnx", format="onnx", sha256="ab" * 32, threads=2)
    gone = Choice.from_dict({"backend": "gone", "device": "CPU"})  # its table still parses
    assert admissible(spec, gone) == ("no backend 'gone' is registered "
                                      "(known: onnxruntime, openvino, litert, armnn)")
    assert admissible(spec, Choice("armnn", "CpuAcc")) == "armnn reads no onnx models"
    assert admissible(spec, Choice("onnxruntime", "CPUExecutionProvider")) == ""


def test_decision_key_is_the_one_cached_decisions_were_written_under(tmp_path: Path) -> None:
    """The key's parts as they were before the backends table, written out here: a device's
    cached decisions must still be found after upgrading."""
    spec = SessionSpec(path=tmp_path / "m.onnx", format="onnx", sha256="ab" * 32, threads=2,
                       providers=("auto",), precision="fp16", state_dir=tmp_path)
    platform = detect_platform()
    legacy = {
        "v": decision.SELECTOR_VERSION, "sha256": spec.sha256, "format": "onnx",
        "versions": {d: decision.dist_version(d) for d in (
            "onnxruntime", "onnxruntime-gpu", "openvino", "ai-edge-litert", "tflite-runtime")},
        "machine": platform.machine, "cpu": platform.cpu_model,
        "features": cpu_features_digest(), "threads": 2, "providers": ["auto"],
        "precision": "fp16", "shapes": {}, "delegates": [], "gate": "outputs",
        "memory_limit_mb": None,
        "armnn": "present" if importlib.util.find_spec("pyarmnn") is not None else None,
    }
    want = hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:32]
    assert decision.cache_key(spec, "outputs") == want


def test_a_backend_option_reaches_its_backend_and_the_decision_key(toy: str, tmp_path: Path
                                                                     ) -> None:
    path = _chain(tmp_path / "chain.onnx")
    options = backends.backend_options(arena="off", toy_max_nodes=100)
    assert options == {"onnxruntime": OnnxOptions("off"), "litert": LiteRTOptions(),
                       "toy": toy_backend.ToyOptions(100)}
    spec = SessionSpec(path=path, format="onnx", sha256="cd" * 32, threads=1,
                       choice=Choice(toy, "CPU"), options=options)
    with pytest.raises(ModelLoadError, match=f"toy folds at most 100 nodes .* has {NODES}"):
        open_session(spec)
    roomy = spec.replace(options=backends.backend_options(toy_max_nodes=NODES))
    session = open_session(roomy)
    try:
        assert session.provider == "toy-CPU"
    finally:
        session.close()
    # the toy's option is part of the key (a decision measured under one limit is not reused
    # under another); the built-in defaults add LiteRT's empty delegates only
    keys = {decision.cache_key(s.replace(choice=None), "outputs") for s in (spec, roomy)}
    assert len(keys) == 2
    assert backends.decision_key(spec) == {"delegates": [], "toy_max_nodes": 100}


def test_backend_options_refuse_what_their_backends_cannot_take(toy: str, tmp_path: Path
                                                                ) -> None:
    with pytest.raises(ConfigError, match="toy_max_nodes must be a positive integer, got 0"):
        backends.backend_options(toy_max_nodes=0)
    with pytest.raises(ConfigError, match="arena must be one of .*, got 'big'"):
        backends.backend_options(arena="big")
    with pytest.raises(ConfigError, match="a delegate needs a 'library'"):
        backends.backend_options(delegates=[{"options": {}}])
    with pytest.raises(ConfigError, match="unknown backend option aerna; valid: arena, delegates, "
                                          "toy_max_nodes"):
        backends.backend_options(aerna="off")
    with pytest.raises(ConfigError, match="option 'arena' \\(onnxruntime's\\) is taken"):
        backends.register_backend("other", "toy_backend", formats=("onnx",), options=("arena",))
    spec = SessionSpec(path=tmp_path / "m.onnx", format="onnx", sha256="ab" * 32, threads=1)
    with pytest.raises(ConfigError, match="options names onnx; the backends with options are "
                                          "litert, onnxruntime, toy"):
        open_session(spec.replace(options={"onnx": OnnxOptions("off")}))
    with pytest.raises(ConfigError, match=r"options\['onnxruntime'\] must be a OnnxOptions"):
        backends.own_options(spec.replace(options={"onnxruntime": "off"}), "onnxruntime",
                             OnnxOptions)


def test_load_model_keywords_become_the_backends_options(tmp_path: Path) -> None:
    path = _chain(tmp_path / "chain.onnx")
    with pytest.raises(ConfigError, match="arena must be one of"):
        edgeinfer.load_model(path, arena="big")
    with edgeinfer.load_model(path, providers="cpu", probe=False, arena="off",
                              delegates=["libfoo.so"]) as m:
        assert m._spec.options == {"onnxruntime": OnnxOptions("off"),
                                   "litert": LiteRTOptions((DelegateSpec("libfoo.so"),))}
