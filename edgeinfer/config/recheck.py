"""``model.recheck``: when a backend decision measured under load is measured again."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from ._types import ConfigStruct

__all__ = ["RecheckConfig"]

Share = Annotated[float, Meta(ge=0.01, le=1)]
Seconds = Annotated[float, Meta(ge=0, le=86400)]
Ratio = Annotated[float, Meta(gt=1, le=100)]


class RecheckConfig(ConfigStruct, frozen=True):
    """Re-checking the measured backend decision (``probe: true``) while the model serves.

    A decision measured while other processes kept the CPUs busy is marked
    ``measured_under_load`` (``edgeinfer info``, the status topic's backend entry, the log) and
    is provisional: its best candidates are timed again, interleaved, once the box has been
    idle for a while, and the model switches between two frames when a runner-up is clearly
    faster; the cached decision is updated. Live latency drifting from the measured one
    triggers the same re-check for any decision.

    Attributes:
        enabled: Re-check at all.
        busy_share: Other processes' share of the CPUs (0-1; one core burnt of 2 is 0.5) at
            or over which a measurement is ``measured_under_load``.
        idle_share: Under this share the box counts as idle.
        idle_for_s: A provisional decision is re-checked after the box was idle this long.
        after_s: Never re-check in a model's first seconds of serving.
        drift_ratio: Live median latency over this many times the measured median...
        drift_for_s: ...for this long triggers a re-check.
        budget_s: How long one re-check may measure.
        max_rechecks: Re-checks per model per process, at most.
        min_interval_s: Seconds between two re-checks of one model, at least.
        switch_gain: Switch only when the serving choice's median is at least this many times
            the runner-up's (1.1: the runner-up 10 % faster), with a stable ranking.
        poll_s: How often the load and the live latency are read.
    """

    enabled: bool = True
    busy_share: Share = 0.25
    idle_share: Share = 0.10
    idle_for_s: Seconds = 30.0
    after_s: Seconds = 60.0
    drift_ratio: Ratio = 1.5
    drift_for_s: Seconds = 60.0
    budget_s: Annotated[float, Meta(ge=0.1, le=600)] = 6.0
    max_rechecks: Annotated[int, Meta(ge=0, le=100)] = 3
    min_interval_s: Seconds = 300.0
    switch_gain: Ratio = 1.10
    poll_s: Annotated[float, Meta(ge=0.01, le=3600)] = 5.0

    def to_dict(self) -> dict[str, Any]:
        """The fields as ``load_model(recheck=...)`` takes them."""
        return {f: getattr(self, f) for f in self.__struct_fields__}
