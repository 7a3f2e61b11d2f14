"""The night's one deadline and the budgets derived from it, each asked of the node (a node
with nothing to boot has no boot timeout; one nothing stops by itself has no max run)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.profile import Profile

# Besides its timed phases the node stays up for the scorecard, the dataset uploads, publishing
# and the stop: the margin its own max run duration allows for them.
NODE_MARGIN_SECONDS = 1800


def night_seconds(cfg: Profile, phase1_timeout_seconds: float,
                  phase2_timeout_seconds: float) -> float:
    """The night's budget when none is given: the boot timeout (a GCE node), the engine's
    readiness timeout and both phase timeouts — each phase can have all of its own."""
    boot = cfg.node.boot_timeout_seconds or 0.0
    return (boot + cfg.inference.readiness_timeout_seconds + phase1_timeout_seconds
            + phase2_timeout_seconds)


def night_budget(cfg: Profile, phase1_timeout_seconds: float,
                 phase2_timeout_seconds: float, night: float | None = None) -> float | None:
    """How long tonight's node may run before Compute stops it by itself (its max run duration,
    in case this orchestrator dies): the night's budget (`night`, or night_seconds), the stop
    and a margin. None for a local node (nothing stops this machine)."""
    stop = cfg.node.stop_timeout_seconds
    if stop is None:
        return None
    if night is None:
        night = night_seconds(cfg, phase1_timeout_seconds, phase2_timeout_seconds)
    return night + stop + NODE_MARGIN_SECONDS


def phase1_timeout(budget: float) -> float:
    """Prefect's hard limit on phase 1, a backstop only: the phase ends itself at its budget
    (in-flight requests finish, then the last writes) — a margin past it, never the clock."""
    return budget + max(120.0, 0.1 * budget)


class NightClock:
    """One deadline for the whole night: boot, readiness, phase 1 and phase 2 each get the
    smaller of their own timeout and what is left. Phase 1 (which can end `partial` on time)
    first sets aside phase 2's share: its timeout, at most half of what is left."""

    def __init__(self, budget_seconds: float) -> None:
        self.budget = budget_seconds
        self.deadline = time.time() + budget_seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.time())

    def give(self, own_seconds: float) -> float:
        return min(own_seconds, self.left())

    def give_or_none(self, own_seconds: float | None) -> float | None:
        return None if own_seconds is None else self.give(own_seconds)

    def phase1(self, own_seconds: float, phase2_seconds: float) -> float:
        left = self.left()
        return max(0.0, min(own_seconds, left - min(phase2_seconds, left / 2)))
