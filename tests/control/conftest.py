"""Fixtures of the command tests: ``start_daemon`` runs ``edgeinfer run`` subprocesses."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemons import Run


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Run]]:
    """``start_daemon(config)``: write ``config``, run it; every run is killed at the end."""
    runs: list[Run] = []

    def start(config: dict[str, Any]) -> Run:
        path = tmp_path / f"config-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(json.dumps(config))
        runs.append(Run(path))
        return runs[-1]

    yield start
    for run in runs:
        run.kill()
