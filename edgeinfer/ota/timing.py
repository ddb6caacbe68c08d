"""The speed check of an OTA trial (``docs/ota.md``, "Verification"): the candidate and the
current model timed in turns, at the moment of the decision, in the same worker conditions.

A box doing other work slows every run by a factor that changes from second to second, so a
latency measured at another moment says little: the candidate and the current model run in
alternate order (current then candidate, then candidate then current, ...), each round gives
one paired ratio, and the verdict rests on the median of those ratios with a distribution-free
95 % interval (the binomial order statistics of the sign test). Rounds go on until the interval
settles the question or the time budget is spent:

- ``too_slow``: the whole interval lies above ``max_slowdown`` (and the slowdown is also more
  than ``floor_ms`` in absolute terms);
- ``ok``: the whole interval lies at or below ``max_slowdown`` (or the absolute slowdown is
  surely below ``floor_ms``);
- ``inconclusive``: the budget ran out first. Noise is never a reason to refuse: the trial
  passes and says so.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CONFIDENCE", "MIN_ROUNDS", "SpeedVerdict", "compare_latency", "median_bounds"]

CONFIDENCE = 0.95
MIN_ROUNDS = 6  # the fewest paired ratios whose median a 95 % sign-test interval can bound
MAX_ROUNDS = 400


@dataclass(frozen=True, slots=True)
class SpeedVerdict:
    """The outcome of ``compare_latency``.

    Attributes:
        verdict: ``"ok"``, ``"too_slow"`` or ``"inconclusive"``.
        rounds: Rounds run (each times both models once).
        current_ms: Median latency of the current model over the rounds.
        candidate_ms: Median latency of the candidate over the rounds.
        ratio: Median of the paired ratios candidate / current.
        low, high: The 95 % interval of that median (``nan`` under ``MIN_ROUNDS``).
        max_slowdown: The limit it was judged against.
        seconds: Time spent timing.
    """

    verdict: str
    rounds: int
    current_ms: float
    candidate_ms: float
    ratio: float
    low: float
    high: float
    max_slowdown: float
    seconds: float

    def describe(self) -> str:
        """One line for logs, checks and the status message."""
        spread = ("" if math.isnan(self.low) else
                  f", 95 % interval {self.low:.2f}-{self.high:.2f}x")
        measured = (f"{self.ratio:.2f}x the current model's time (median {self.candidate_ms:.2f}"
                    f" vs {self.current_ms:.2f} ms, timed in turns over {self.rounds} rounds in "
                    f"{self.seconds:.1f} s{spread}; limit {self.max_slowdown:g}x)")
        if self.verdict == "inconclusive":
            return (f"latency too noisy to conclude: {measured}; not refused for noise, "
                    f"the update goes on")
        return f"latency {measured}"


def median_bounds(values: list[float], confidence: float = CONFIDENCE
                  ) -> tuple[float, float] | None:
    """A distribution-free interval of the median of ``values``: the k-th smallest and k-th
    largest value, k the largest with ``2 * P(Binomial(n, 1/2) < k) <= 1 - confidence``.
    ``None`` when there are too few values for any k."""
    n, s = len(values), sorted(values)
    k, below = 0, 0.0  # below: P(X <= k - 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2.0 ** n  # P(X <= k)
        if 2 * nxt > 1 - confidence:
            break
        below, k = nxt, k + 1
    return (s[k - 1], s[n - k]) if k else None


def compare_latency(run_current: Callable[[], object], run_candidate: Callable[[], object], *,
                    max_slowdown: float, floor_ms: float, min_rounds: int, budget_s: float,
                    check: Callable[[], None] = lambda: None,
                    max_rounds: int = MAX_ROUNDS) -> SpeedVerdict:
    """Time both models in turns until the verdict is clear, ``budget_s`` is spent or
    ``max_rounds`` ran (at least ``min_rounds``, and ``MIN_ROUNDS``, unless the budget ends it).

    Args:
        run_current, run_candidate: One inference each, on their inputs (warmed up already).
        max_slowdown: The largest candidate / current ratio accepted.
        floor_ms: A slowdown counts only when it is also more than this in milliseconds.
        min_rounds: Rounds before the first verdict.
        budget_s: Time the rounds may take; past it, an unsettled comparison is inconclusive.
        check: Called after every run (the trial's watchdog raises there).
        max_rounds: Rounds at most.
    """
    clock = time.perf_counter
    start = clock()
    current: list[float] = []
    candidate: list[float] = []
    verdict = "inconclusive"
    first = max(min_rounds, MIN_ROUNDS)
    while len(current) < max_rounds:
        order = (run_current, run_candidate) if len(current) % 2 == 0 else \
            (run_candidate, run_current)
        took = []
        for run in order:
            t0 = clock()
            run()
            took.append((clock() - t0) * 1000)
            check()
        if len(current) % 2 == 1:
            took.reverse()
        current.append(took[0])
        candidate.append(took[1])
        if len(current) >= first:
            verdict = _judge(current, candidate, max_slowdown, floor_ms)
            if verdict != "inconclusive":
                break
        if clock() - start > budget_s:
            break
    ratios = [b / a if a > 0 else math.inf for a, b in zip(current, candidate, strict=True)]
    bounds = median_bounds(ratios) or (math.nan, math.nan)
    return SpeedVerdict(verdict=verdict, rounds=len(current),
                        current_ms=statistics.median(current),
                        candidate_ms=statistics.median(candidate),
                        ratio=statistics.median(ratios), low=bounds[0], high=bounds[1],
                        max_slowdown=max_slowdown, seconds=clock() - start)


def _judge(current: list[float], candidate: list[float], max_slowdown: float,
           floor_ms: float) -> str:
    pairs = list(zip(current, candidate, strict=True))
    ratios = median_bounds([b / a if a > 0 else math.inf for a, b in pairs])
    extra = median_bounds([b - a for a, b in pairs])
    if ratios is None or extra is None:
        return "inconclusive"
    if ratios[0] > max_slowdown and extra[0] > floor_ms:
        return "too_slow"
    if ratios[1] <= max_slowdown or extra[1] <= floor_ms:
        return "ok"
    return "inconclusive"
