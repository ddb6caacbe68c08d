"""One way to pull a model for the service, the right one, in docs/deploy.md and in every
config scripts/install.sh installs (issue 30, item 17).

configs/camera-detect.yaml, the config install.sh puts on a generic board, said
`sudo CACHE_DIRECTORY=/var/cache/edgeinfer ... edgeinfer models pull`: a root pull, which
docs/deploy.md warns leaves files that make systemd migrate the directory to
/var/cache/private/ and a cache the service cannot write. The right way runs the pull as the
service runs: a transient unit with the unit's own `DynamicUser=` and `CacheDirectory=`, read
here from systemd/edgeinfer.service, with the venv install.sh makes. The old recipe, still in the
configs of devices installed before, is refused by `models pull` with the right one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgeinfer.model.catalog import CATALOG

ROOT = Path(__file__).resolve().parent.parent


def _unit(key: str) -> list[str]:
    text = (ROOT / "systemd" / "edgeinfer.service").read_text()
    return re.findall(rf"^{key}=(.*)$", text, re.M)


def _pull(name: str) -> str:
    """The pull as the service: its identity and cache directory, from the unit itself."""
    assert _unit("DynamicUser") == ["yes"] and not _unit("User")  # else: -p User=...
    (cache,) = _unit("CacheDirectory")
    script = (ROOT / "scripts" / "install.sh").read_text()
    prefix = re.findall(r"^PREFIX=(/\S+)$", script, re.M)[0]  # the default
    return (f"sudo systemd-run --pipe --wait -p DynamicUser=yes -p CacheDirectory={cache} "
            f"{prefix}/venv/bin/edgeinfer models pull {name}")


def _installed_configs() -> list[str]:
    """The configs install.sh picks by itself, and those docs/deploy.md offers to `--config`."""
    script = (ROOT / "scripts" / "install.sh").read_text()
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    names = set(re.findall(r'CONFIG="\$FROM/configs/([\w.-]+\.yaml)"', script))
    names |= set(re.findall(r"`--config FILE` picks another\s+\(such as\s+"
                            r"`configs/([\w.-]+\.yaml)`", deploy))
    assert {"pi4.yaml", "jetson.yaml", "camera-detect.yaml", "audio-vad.yaml"} <= names, names
    return sorted(names)


def _commands(text: str) -> list[str]:
    """The `models pull` commands in ``text`` (comments or a shell block), continuation lines
    joined and whitespace collapsed."""
    lines = [re.sub(r"^\s*#", "", line) for line in text.splitlines()]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [" ".join(line.split()) for line in joined.splitlines() if "models pull" in line]


def _catalog_models(config: str) -> set[str]:
    data = yaml.safe_load((ROOT / "configs" / config).read_text().replace("${", "x{"))
    return {p["model"]["path"] for p in data["pipelines"] if p["model"]["path"] in CATALOG}


@pytest.mark.parametrize("config", _installed_configs())
def test_an_installed_config_pulls_its_model_as_the_service(config: str) -> None:
    models = _catalog_models(config)
    assert models, f"{config}: no example model to pull"
    found = _commands((ROOT / "configs" / config).read_text())
    assert found == [_pull(name) for name in sorted(models)], found


def test_the_deploy_guide_pulls_the_same_way() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)
    found = [c for b in blocks for c in _commands(b)]
    assert found == [_pull("nudenet-320n")], found


def _models_pull(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("CACHE_DIRECTORY", "INVOCATION_ID", "EDGEINFER_MODELS",
                          "EDGEINFER_CACHE_DIR")}
    return subprocess.run([sys.executable, "-m", "edgeinfer", "models", "pull", *args],
                          capture_output=True, text=True, timeout=120, env={**clean, **env})


def test_the_old_root_recipe_is_refused_naming_the_right_one(tmp_path: Path,
                                                             yolo_path: Path) -> None:
    """Configs already installed keep the old comment (install.sh never overwrites a config):
    `CACHE_DIRECTORY=... edgeinfer models pull` by hand, outside systemd, is refused with the
    command that pulls as the service, and writes nothing."""
    cache = tmp_path / "edgeinfer"
    cache.mkdir()
    done = _models_pull({"CACHE_DIRECTORY": str(cache)}, "nudenet-320n")
    assert done.returncode == 78, done.stderr
    right = _pull("nudenet-320n").replace("/opt/edgeinfer/venv/bin/edgeinfer",
                                          str(Path(sys.executable).parent / "edgeinfer"))
    assert right in " ".join(done.stderr.split()), done.stderr
    assert not any(cache.iterdir())
    # the service itself (systemd sets INVOCATION_ID) pulls there: the file is already whole
    (cache / "models").mkdir()
    shutil.copy(yolo_path, cache / "models" / CATALOG["nudenet-320n"].filename)
    done = _models_pull({"CACHE_DIRECTORY": str(cache), "INVOCATION_ID": "0" * 32},
                        "nudenet-320n")
    assert done.returncode == 0 and str(cache / "models") in done.stdout, done.stderr
