"""Model names resolve the same way in ``load_model`` as in the CLI and configs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer import catalog
from edgeinfer.errors import ModelNotFoundError


@pytest.mark.parametrize("name", ["320n.onnx", "nudenet-320n"])
def test_load_model_finds_pulled_example_by_name(yolo_path: Path, name: str,
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no 320n.onnx here: only the models cache has it
    with edgeinfer.load_model(name, input_shapes={"images": (1, 3, 320, 320)},
                              warmup=False) as m:
        assert m.sha256 == catalog.CATALOG["nudenet-320n"].sha256


def test_resolve_bare_name_in_models_cache(tmp_path: Path, yolo_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(yolo_path, models / "mine.onnx")
    monkeypatch.setenv("EDGEINFER_MODELS", str(models))
    monkeypatch.chdir(tmp_path)
    assert catalog.resolve_model("mine.onnx") == models / "mine.onnx"


def test_missing_model_error_lists_where_it_looked(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as info:
        edgeinfer.load_model("nothere.onnx")
    text = str(info.value)
    assert "model file not found: nothere.onnx" in text
    assert str(tmp_path / "nothere.onnx") in text
    assert str(tmp_path / "models" / "nothere.onnx") in text
    assert "nudenet-320n" in text  # the example models it could have named


def test_unpulled_example_without_fetch_names_the_pull_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEINFER_MODELS", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="edgeinfer models pull nudenet-320n"):
        catalog.resolve_model("320n.onnx", fetch_missing=False)


def test_on_fetch_is_called_before_the_download(tmp_path: Path) -> None:
    seen: list[tuple[str, bool]] = []

    def on_fetch(entry: catalog.CatalogModel, target: Path) -> None:
        seen.append((entry.name, target.exists()))

    path = catalog.pull("blazeface", tmp_path, on_fetch=on_fetch)
    assert seen == [("blazeface", False)] and path.is_file()
    catalog.pull("blazeface", tmp_path, on_fetch=on_fetch)  # cached: no fetch, no call
    assert seen == [("blazeface", False)]
