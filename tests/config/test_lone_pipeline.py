"""A pipeline saved as a file of its own (the docs show them alone) is recognised and the fix
shown: put it under `pipelines:` (issue 30, item 11). Before, `validate-config` read it as a
collector's config (`$.source.type: unknown type 'camera'; valid: mqtt, nats`,
`$.name: unknown field`) and `run` said `$.name: unknown field`."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from edgeinfer.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _lone_block() -> str:
    """The first block of docs/ that is one pipeline's keys with a camera source."""
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"^```ya?ml\n(.*?)^```", doc.read_text(), re.S | re.M):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and {"name", "source", "model"} <= set(data):
                return block
    raise AssertionError("no lone pipeline block in docs/")


def _said(verb: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(verb)
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("verb", [["validate-config"], ["run", "-c"]])
def test_a_docs_pipeline_saved_alone_is_named_and_shown_where_it_goes(
        verb: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = _lone_block()
    name = yaml.safe_load(block)["name"]
    path = tmp_path / "cam.yaml"
    path.write_text(block)
    code, said = _said([*verb, str(path)], capsys)
    assert code == 78, said
    assert "this is one pipeline, not a whole config" in said, said
    assert re.search(rf"pipelines:\n +- name: {name}\n +source: \.\.\.", said), said
    assert "unknown type" not in said and "unknown field" not in said, said
    # the advice, followed as written, gives a config validate-config takes
    path.write_text("pipelines:\n" + textwrap.indent(block, "    ").replace("    name:",
                                                                          "  - name:", 1))
    code, said = _said(["validate-config", str(path)], capsys)
    assert code == 0 and "not a whole config" not in said, said


def test_a_list_of_pipelines_saved_alone_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("- name: a\n  source: {type: synthetic}\n  model: {path: m.onnx}\n"
                    "- name: b\n  source: {type: camera, uri: 0}\n  model: {path: m.onnx}\n")
    code, said = _said(["validate-config", str(path)], capsys)
    assert code == 78 and "this is a list of pipelines, not a whole config" in said, said
    assert re.search(r"pipelines:\n +- name: a\n.*\n +- name: b\n", said, re.S), said


@pytest.mark.parametrize(("text", "words"), [
    # a device config with a misspelt key keeps msgspec's message naming it
    ("pipelines: []\nmqqt: {host: x}\n", "$.mqqt: unknown field"),
    # a collector config is still read as one
    ("database: {dsnn: postgresql://db/x}\nsource: {type: nats}\n",
     "$.database.dsnn: unknown field; did you mean 'dsn'?"),
])
def test_other_configs_are_not_taken_for_a_pipeline(
        text: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code, said = _said(["validate-config", str(path)], capsys)
    assert code == 78 and words in said and "not a whole config" not in said, said


def test_the_configuration_guide_quotes_the_message_as_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    guide = (ROOT / "docs" / "configuration.md").read_text()
    quoted = next(b for b in re.findall(r"^```text\n(.*?)^```", guide, re.M | re.S)
                  if "not a whole config" in b)
    path = tmp_path / "cam.yaml"
    path.write_text(_lone_block())
    code, said = _said(["validate-config", str(path)], capsys)
    assert code == 78 and quoted.replace("cam.yaml", str(path)) in said, (quoted, said)
