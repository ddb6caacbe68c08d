"""`Host`: what the control plane (``control/``, ``ota/``, ``web/``) sees of the daemon.

The daemon (``edgeinfer.daemon.Daemon``) implements it; the MQTT link, the command handlers,
the status documents, the OTA agent and its updater receive a `Host` and never the daemon
itself, so they import nothing above them and a test can hand them a small stand-in.

    host.pipelines                  # the running pipelines (read; replaced under exclusive())
    host.config                     # the config in force (a reload replaces it)
    with host.exclusive(): ...      # no reload, restart or model swap runs meanwhile
    host.start_pipeline(name)       # a configured pipeline that is not running
    host.restart_pipeline(name)     # rebuild one from its config (and the OTA store)
    host.announce()                 # publish the retained birth again (its models changed)

The types named below are only read by the type checker: this module stays at the bottom layer
and imports nothing of the package at run time.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .config import Config
    from .pipeline import Pipeline

__all__ = ["Host"]


class Host(Protocol):
    """The daemon as the control plane sees it."""

    @property
    def config(self) -> Config:
        """The config in force; a reload replaces it."""
        ...

    @property
    def pipelines(self) -> list[Pipeline]:
        """The running pipelines. Read it again after `exclusive`: a reload replaces it."""
        ...

    @property
    def failed(self) -> dict[str, str]:
        """Configured pipelines not running -> why (a failed start or restart)."""
        ...

    @property
    def restarts(self) -> dict[str, int]:
        """Internal restarts of stuck pipelines so far, per pipeline."""
        ...

    @property
    def device_id(self) -> str: ...

    def exclusive(self) -> AbstractContextManager[None]:
        """Held while the pipelines are replaced: a reload, a restart, a model swap."""
        ...

    def start_pipeline(self, name: str) -> Pipeline:
        """Start configured pipeline ``name`` that is not running.

        Raises:
            ConfigError: no such pipeline is configured.
            EdgeInferError: it cannot start.
        """
        ...

    def restart_pipeline(self, name: str) -> None:
        """Rebuild pipeline ``name`` from its config; a failure shows in `failed`."""
        ...

    def announce(self) -> None:
        """Tell the world again what runs here (the retained MQTT birth), e.g. after a model
        update; nothing without MQTT."""
        ...

    def reload(self) -> dict[str, Any]:
        """Re-read the config file; restart the pipelines whose config changed.

        Raises:
            ConfigError: the file is invalid or a changed pipeline cannot start.
        """
        ...

    def update_stats(self) -> dict[str, Any] | None:
        """The OTA agent's stats, or ``None`` without an ``ota:`` section."""
        ...

    def status(self) -> dict[str, Any]:
        """What the ``status`` command answers."""
        ...

    def command(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        """Run a command that arrived other than by MQTT (the web view).

        Raises:
            CommandError: an unknown, disallowed or signed-only verb, or a bad request.
        """
        ...
