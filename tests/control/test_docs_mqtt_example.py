"""docs/mqtt.md's command example, run word for word against a real daemon and mosquitto.

It published the command and then subscribed to the reply: the reply (not retained) was gone
and `mosquitto_sub -C 1` waited forever.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from daemons import ROOT, Run, daemon_config


def _example() -> str:
    text = (ROOT / "docs/mqtt.md").read_text()
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "cmd/set" in b]
    assert len(blocks) == 1, "docs/mqtt.md: one sh block with the cmd/set example"
    return blocks[0]


@pytest.mark.skipif(not shutil.which("mosquitto_sub"), reason="mosquitto-clients not installed")
def test_the_command_example_prints_the_reply(
        mqtt_broker: tuple[str, int], blazeface_path: Path, tmp_path: Path,
        start_daemon: Callable[[dict[str, Any]], Run]) -> None:
    host, port = mqtt_broker
    run = start_daemon(daemon_config(host, port, blazeface_path, tmp_path, "pi-kitchen"))
    online = subprocess.run(["mosquitto_sub", "-h", host, "-p", str(port), "-C", "1", "-W", "60",
                             "-t", "edgeinfer/pi-kitchen/status"],
                            capture_output=True, text=True, timeout=90)
    assert '"online"' in online.stdout, online.stdout + online.stderr
    script = re.sub(r"\bmosquitto_(sub|pub) ", rf"mosquitto_\1 -h {host} -p {port} ", _example())
    proc = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"id": 1' in proc.stdout or '"id":1' in proc.stdout, proc.stdout
    assert '"ok": true' in proc.stdout or '"ok":true' in proc.stdout, proc.stdout
    run.stop()
