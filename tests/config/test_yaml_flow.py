"""``${T}`` inside a ``{...}`` flow mapping (the README's style) gave a raw YAML error
(``expected ',' or '}', but got '{'``): ``{`` is YAML's own there."""

from __future__ import annotations

import pytest

from edgeinfer.config._yaml import YamlReader
from edgeinfer.errors import ConfigError


def test_substitutions_inside_flow_mappings_and_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FPS", "7")
    monkeypatch.setenv("CAM", "/dev/video2")
    monkeypatch.delenv("UNSET_HERE", raising=False)
    data = YamlReader("c.yaml").load(
        "source: {type: camera, uri: ${CAM}, max_fps: ${FPS}, name: \"${FPS}\"}\n"
        "sizes: [${FPS}, ${UNSET_HERE:-3}, x${FPS}y]\n"
        "block: ${FPS}\n")
    assert data == {"source": {"type": "camera", "uri": "/dev/video2", "max_fps": 7,
                               "name": "7"},
                    "sizes": [7, 3, "x7y"], "block": 7}


def test_errors_inside_flow_mappings_name_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNSET_HERE", raising=False)
    with pytest.raises(ConfigError, match=r"^c\.yaml:2: \$\.b\.x: environment variable "
                       r"UNSET_HERE is not set$"):
        YamlReader("c.yaml").load("a: 1\nb: {x: ${UNSET_HERE}}\n")
    with pytest.raises(ConfigError, match=r"^c\.yaml:3:1: invalid YAML: expected ',' or '}'"):
        YamlReader("c.yaml").load("a: 1\nb: {x: ${UNSET_HERE:-1}, y: {z}\n")
