"""Every example in README.md runs, or is listed below with the reason it cannot run here.

Fenced blocks are read from README.md. In each test's own empty working directory, every
``yaml`` block whose first line names a file (``# config.yaml: ...``) is written there first,
then the block runs: ``python`` blocks in a fresh interpreter, ``sh`` blocks with
``bash -euo pipefail``, ``yaml`` blocks validated as configs (``edgeinfer validate-config``),
and the command-line synopsis checked against the CLI's verbs. A block that is neither run nor
in ``NOT_RUN`` fails, so a new README example gets tested or explained.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<lang>[A-Za-z]*)\n(?P<body>.*?)^```$", re.M | re.S)
NAMED = re.compile(r"^# (?P<name>[\w.-]+\.yaml)\b")

# Blocks that cannot run here, by their first line, and why. An entry that matches no block
# fails too, so this list cannot go stale.
NOT_RUN = {
    # The README's two set-up commands install into the running virtualenv: run word for word
    # from a fresh clone in a fresh virtualenv by scripts/test-readme-setup.sh instead.
    "pip install '.[broker]' && edgeinfer demo": "set-up command: scripts/test-readme-setup.sh",
    "pip install -e '.[dev]' && python3 -m pytest -q": "set-up command: "
    "scripts/test-readme-setup.sh",
    # A config fragment that shows the mqtt keys: its pipeline has no source or model, and its
    # broker (mqtt.local) and CA file exist only on the reader's network.
    "mqtt:": "fragment: mqtt keys only, a broker and CA that exist only on the reader's network",
    # Signs and pushes to devices over a TLS broker at mqtt.local: needs a fleet
    # (tests/ota/test_push.py runs push-model against a real mosquitto and a real device).
    "edgeinfer keygen ota-key          # ota-key (private, 0600) + ota-key.pub for the devices":
    "needs a device fleet and the broker mqtt.local (tests/ota/ covers push-model)",
    # Needs the reader's photos/ and camera.yaml, and bench/all.py measures for minutes
    # (tests/test_quantize.py and tests/test_bench.py run both commands on real models).
    "edgeinfer quantize 320n.onnx yolo-int8.onnx --calibration photos/ -c camera.yaml":
    "needs the reader's photos and camera config; benchmarks take minutes",
}


@dataclass(frozen=True)
class Block:
    lang: str
    body: str
    line: int

    @property
    def first(self) -> str:
        return self.body.splitlines()[0] if self.body.strip() else ""

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.lang or 'text'}"


def _blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [Block(m["lang"], m["body"], text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


BLOCKS = _blocks()


def _prepare(cwd: Path) -> None:
    """The README's named yaml blocks (``# config.yaml: ...``) as files in ``cwd``."""
    for b in BLOCKS:
        m = NAMED.match(b.first) if b.lang == "yaml" else None
        if m:
            (cwd / m["name"]).write_text(b.body)


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # bin/ of the running interpreter first: `edgeinfer` and `python3` are this virtualenv's
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def _cli_verbs() -> set[str]:
    from edgeinfer.cli import VERBS

    return set(VERBS)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_example(block: Block, tmp_path: Path) -> None:
    if block.first in NOT_RUN:
        pytest.skip(f"README line {block.line}: {NOT_RUN[block.first]}")
    _prepare(tmp_path)
    if block.lang == "python":
        proc = _run([sys.executable, "-c", block.body], tmp_path)
    elif block.lang == "sh":
        proc = _run(["bash", "-euo", "pipefail", "-c", block.body], tmp_path)
    elif block.lang == "yaml" and NAMED.match(block.first):
        name = NAMED.match(block.first)["name"]  # type: ignore[index]
        proc = _run([sys.executable, "-m", "edgeinfer", "validate-config", name], tmp_path)
    elif block.lang == "" and block.first.startswith("edgeinfer "):
        # The command-line synopsis: placeholders, not commands; every verb it names exists.
        named = {line.split()[1] for line in block.body.splitlines() if line.strip()}
        assert named <= _cli_verbs(), f"README names verbs the CLI lacks: {named - _cli_verbs()}"
        return
    else:
        pytest.fail(f"README line {block.line}: a {block.lang or 'plain'} block starting "
                    f"{block.first!r} is neither run by this test nor listed in NOT_RUN")
    assert proc.returncode == 0, (f"README line {block.line} exited {proc.returncode}\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def test_not_run_list_names_only_readme_blocks() -> None:
    firsts = {b.first for b in BLOCKS}
    assert set(NOT_RUN) <= firsts, f"stale NOT_RUN entries: {set(NOT_RUN) - firsts}"


def test_pipeline_example_writes_its_results(tmp_path: Path) -> None:
    """The config example and `edgeinfer run -c config.yaml` do what the README says."""
    _prepare(tmp_path)
    proc = _run([sys.executable, "-m", "edgeinfer", "run", "-c", "config.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 90 and all(line.startswith('{"seq":') for line in lines)
    assert proc.stdout.count("faces #") == 90
