"""Fixtures of the fleet tests: one throwaway PostgreSQL cluster for the whole session.

Without the server binaries the tests that need it are skipped, unless ``CI`` is set: CI
installs them, so there their absence is a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeinfer.testing.postgres import BIN_DIR, Postgres, available


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    """A running PostgreSQL 15 on a free loopback port (``.dsn``), fsync on."""
    if not available():
        message = f"PostgreSQL server binaries not found in {BIN_DIR}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with Postgres(Path(tmp_path_factory.mktemp("postgres"))) as pg:
        yield pg
