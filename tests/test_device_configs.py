"""The configs install.sh puts on a Pi or a Jetson start on a fresh device: no credential and
no OTA key needed, and the commented steps in them (a broker password, signed updates) work
once followed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEVICE_CONFIGS = ["pi4.yaml", "jetson.yaml"]


@pytest.mark.parametrize("name", DEVICE_CONFIGS)
def test_validates_without_credentials_directory(name: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    proc = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config",
                           str(ROOT / "configs" / name)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    config = load_config(ROOT / "configs" / name)
    assert config.ota is None  # no /etc/edgeinfer/ota-key.pub on a fresh device
    assert config.mqtt is not None and config.mqtt.password is None


@pytest.mark.parametrize("name", DEVICE_CONFIGS)
def test_the_commented_password_and_ota_steps_work(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "configs" / name).read_text()
    key = tmp_path / "ota-key.pub"
    subprocess.run([sys.executable, "-m", "edgeinfer", "keygen", str(tmp_path / "ota-key")],
                   check=True, capture_output=True, timeout=60)
    assert key.is_file()
    # uncomment what the comments say to uncomment, as a user would
    text = re.sub(r"^  # (username|password): ", r"  \1: ", text, flags=re.M)
    text = re.sub(r"^# (ota:|  trusted_keys:|  groups:|    - \$\{EDGEINFER_GROUP)", r"\1",
                  text, flags=re.M)
    text = text.replace("/etc/edgeinfer/ota-key.pub", str(key))
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "mqtt_password").write_text("s3cret\n")
    path = tmp_path / name
    path.write_text(text)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    config = load_config(path)
    assert config.mqtt is not None and config.mqtt.password == "s3cret"
    assert config.ota is not None and [str(k) for k in config.ota.trusted_keys] == [str(key)]
