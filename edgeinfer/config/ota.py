"""Typed config of the ``ota:`` section: which keys a device trusts for model updates, the
groups it belongs to, and the limits of verification and the health gate (``docs/ota.md``).
Field names are a contract."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from ._types import ConfigStruct, GroupName, MiB, Seconds

__all__ = ["HealthConfig", "OtaConfig", "VerifyConfig"]


class VerifyConfig(ConfigStruct, frozen=True):
    """The trial run of a candidate model in an isolated worker.

    Attributes:
        memory_limit_mb: The worker's memory limit (``null``: none, e.g. for GPU providers).
        timeout_s: Loading plus the trial runs must finish within this.
        max_slowdown: Refuse a candidate surely more than this many times slower than the
            current model, both timed in turns in the same trial.
        runs: The fewest rounds of that comparison (each times both models once; 6 at the
            least for a verdict).
        compare_s: The most time the comparison takes; one still too noisy to conclude then
            lets the update go on (it says so), never refuses it.
    """

    memory_limit_mb: MiB | None = 512.0
    timeout_s: Seconds = 120.0
    max_slowdown: Annotated[float, Meta(ge=1.0, le=1000.0)] = 2.0
    runs: Annotated[int, Meta(ge=1, le=1000)] = 5
    compare_s: Seconds = 10.0


class HealthConfig(ConfigStruct, frozen=True):
    """The gate after a swap that commits the update or rolls it back.

    Attributes:
        min_inferences: Successful inferences that commit the update ...
        window_s: ... if they happen within this many seconds.
        max_error_rate: Errors per inference above this roll the update back.
    """

    min_inferences: Annotated[int, Meta(ge=1, le=1_000_000)] = 20
    window_s: Seconds = 60.0
    max_error_rate: Annotated[float, Meta(ge=0, le=1)] = 0.05


class OtaConfig(ConfigStruct, frozen=True):
    """Signed model updates over MQTT (needs an ``mqtt:`` section).

    Attributes:
        trusted_keys: Public keys whose signatures are accepted: paths of ``.pub`` files from
            ``edgeinfer keygen`` (relative to the config file) or ``ed25519:<base64>`` lines.
        allow_unsigned: Accept unsigned updates. Development only: a warning at every boot.
        groups: Fleet groups whose pushes this device takes.
        max_model_mb: Largest model accepted (default: ``runtime.max_model_mb``).
        keep_versions: Models kept per name besides the current and previous ones.
        transfer_timeout_s: A transfer that gets no chunk for this long expires.
        verify: The trial run's limits.
        health: The health gate after a swap.
    """

    trusted_keys: list[Annotated[str, Meta(min_length=1)]] = []
    allow_unsigned: bool = False
    groups: list[GroupName] = []
    max_model_mb: MiB | None = None
    keep_versions: Annotated[int, Meta(ge=1, le=100)] = 3
    transfer_timeout_s: Seconds = 900.0
    verify: VerifyConfig = msgspec.field(default_factory=VerifyConfig)
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)

    def __post_init__(self) -> None:
        if not self.trusted_keys and not self.allow_unsigned:
            raise ValueError("ota: list the public keys to trust in trusted_keys "
                             "(or set allow_unsigned: true, for development only)")
        for g in self.groups:
            if "\n" in g:
                raise ValueError("a group name must not contain a newline")
