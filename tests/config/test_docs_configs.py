"""Every YAML config block in docs/ validates as what it shows, with the loader a user's file
goes through and the checks `validate-config` and `run` share (`start_problems`: what is wrong
on any machine): a whole device config as it stands (a reader copies it to a file), a part of
one (`mqtt:`, `ota:`, `http:`: completed with what that part needs, `ota:` with an `mqtt:`
section), one pipeline's keys (given a name and a model, and the `mqtt:` section its mqtt sink
publishes through), or a collector config (`collect.yaml`). A block that fits none of these
fails here, so a documented example cannot drift from the config tree. Running them is the job of the docs'
own tests (tests/analytics/test_e2e.py, tests/fleet/test_docs_fleet.py,
tests/control/test_docs_mqtt_example.py, tests/web/...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from edgeinfer.config import parse_config
from edgeinfer.config.loader import load_struct
from edgeinfer.config.collect import CollectConfig
from edgeinfer.config.schema import Config
from edgeinfer.daemon.startable import start_problems

ROOT = Path(__file__).resolve().parents[2]
DEVICE_KEYS = {"device_id", "runtime", "pipelines", "logging", "mqtt", "metrics", "ota", "http"}
PIPELINE_KEYS = {"name", "source", "model", "task", "sinks", "emit", "queue_size", "track",
                 "zones", "lines", "record", "detect", "motion"}
COLLECT_KEYS = {"database", "source", "batch", "metrics", "logging"}


def blocks() -> list[tuple[str, str]]:
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, block in enumerate(re.findall(r"^```ya?ml\n(.*?)^```", doc.read_text(), re.S | re.M)):
            found.append((f"{doc.name}#{i}", block))
    return found


BLOCKS = blocks()


def test_the_docs_have_config_blocks() -> None:
    assert len(BLOCKS) >= 9, BLOCKS  # the extraction itself works


@pytest.mark.parametrize(("where", "block"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_a_docs_config_block_validates(where: str, block: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "credentials"  # as systemd's LoadCredential= would hand them over
    secrets.mkdir()
    for name in re.findall(r"\$\{credential:([^}]+)\}", block):
        (secrets / name).write_text("a-secret-of-32-characters-or-more-0123456789")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(secrets))
    data = yaml.safe_load(block)
    assert isinstance(data, dict), f"{where}: not a mapping"
    keys = set(data)
    if "database" in keys:  # a collector config
        assert keys <= COLLECT_KEYS, f"{where}: {sorted(keys - COLLECT_KEYS)}"
        (tmp_path / "collect.yaml").write_text(block)
        load_struct(tmp_path / "collect.yaml", CollectConfig)
        return
    if keys <= DEVICE_KEYS:
        text = block
        if "pipelines" not in keys:  # a section of a device config: beside a pipeline
            text += _pipeline("{type: synthetic, frames: 1}")
        if "ota" in keys and "mqtt" not in keys:
            text += "mqtt: {host: 127.0.0.1}\n"
        assert not _invalid(parse_config(text, source=where, base_dir=tmp_path)), where
        return
    assert keys <= PIPELINE_KEYS, f"{where}: keys of no config part: {sorted(keys)}"
    item = {"name": "doc", "model": {"path": "model.onnx"}, **data}
    whole = {"mqtt": {"host": "127.0.0.1"}, "pipelines": [item]}
    config = parse_config(yaml.safe_dump(whole), source=where, base_dir=tmp_path)
    assert not _invalid(config), where  # e.g. a decoder name no decoder has


def _invalid(config: Config) -> list[str]:
    """What `validate-config` refuses on any machine (a missing model or camera is only this
    machine's: the docs name files and devices of the reader's)."""
    return [str(p) for p in start_problems(config) if p.invalid]


def _pipeline(source: str) -> str:
    return (f"pipelines:\n  - name: doc\n    source: {source}\n"
            "    model: {path: model.onnx}\n    task: {type: raw}\n")
