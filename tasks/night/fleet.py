"""The night's nodes as one fleet: a step on every node at once, the primary's failure failing
it and another's leaving that node out, their usage as one, and their teardown — every node
stopped, each on its own, whatever happened."""

from __future__ import annotations

from typing import Any

from tasks.compute.node import compute_down, node_usage
from tasks.compute.protocol import Node
from tasks.night.phases import phase
from tasks.night.summary import cost_summary
from tasks.profile import load_profile
from tasks.records import NodeUsage, RunSummary, ZoneSpan
from tasks.shared.errors import NodePreempted


def each(task: Any, nodes: list[Node], **kwargs: Any) -> list[Any]:
    """`task(node, **kwargs)` on every node — at once when there are several — and each one's
    result or the exception it raised (the caller decides what a failure costs)."""
    if len(nodes) == 1:
        try:
            return [task(nodes[0], **kwargs)]
        except Exception as e:  # noqa: BLE001 - returned to the caller, who re-raises
            return [e]
    futures = [task.submit(n, **kwargs) for n in nodes]
    out: list[Any] = []
    for f in futures:
        try:
            out.append(f.result())
        except Exception as e:  # noqa: BLE001 - returned to the caller, who re-raises
            out.append(e)
    return out


def raise_first(results: list[Any]) -> None:
    """The first failure of `each`'s results, raised."""
    for r in results:
        if isinstance(r, BaseException):
            raise r


def drop_failed(nodes: list[Node], results: list[Any], what: str, logger: Any
                ) -> tuple[list[Node], list[Any]]:
    """The primary node failing fails the step; another node failing is left out of tonight's
    phase 1 (it is stopped with the rest at the end) with a warning."""
    if isinstance(results[0], BaseException):
        raise results[0]
    kept = [(n, r) for n, r in zip(nodes, results, strict=True)
            if not isinstance(r, BaseException)]
    for i, r in enumerate(results[1:], 2):
        if isinstance(r, BaseException):
            logger.warning("node %d left out of tonight's phase 1 (%s failed): %s: %s", i, what,
                           type(r).__name__, r)
    return [n for n, _ in kept], [r for _, r in kept]


def merge_usage(usages: list[NodeUsage | None]) -> NodeUsage | None:
    """Every node's usage as one: RUNNING seconds, GPU-hours and cost add up; each node's zones
    kept (a node after the first is named in its keys)."""
    got = [(i, u) for i, u in enumerate(usages, 1) if u]
    if not got:
        return None
    if len(usages) == 1:
        return got[0][1]
    zones: dict[str, ZoneSpan] = {}
    for i, u in got:
        for zone, z in u.zones.items():
            zones[zone if i == 1 else f"{zone} (node {i})"] = z
    notes = [f"node {i}: {u.note}" for i, u in got if u.note]
    missing = [str(i) for i, u in enumerate(usages, 1) if not u]
    if missing:
        notes.append(f"usage unavailable for node {', '.join(missing)}")
    return NodeUsage(running_seconds=sum(u.running_seconds for _, u in got),
                     gpu_hours=sum(u.gpu_hours for _, u in got),
                     estimated_usd=sum(u.estimated_usd for _, u in got),
                     zones=zones, note="; ".join(notes))


def node_lost(node: Node) -> NodePreempted | None:
    """The node went away under phase 1 (spot preemption): what failed is its doing."""
    try:
        node.check_running()
    except NodePreempted as e:
        return e
    except Exception:  # noqa: BLE001 - cannot tell: the phase's own outcome stands
        return None
    return None


def stop_nodes_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """The nightly's backstop for cancellation and crashes: its teardown may not have run.
    Every node of the run's profile is stopped, each on its own (one that fails leaves no
    other up)."""
    try:
        nodes = load_profile(flow_run.parameters.get("profile", "local")).nodes
    except Exception as e:  # noqa: BLE001 - a hook must not raise
        print(f"nightly teardown hook could not load the profile to stop its nodes: {e}")
        return
    for i, node in enumerate(nodes, 1):
        try:
            node.stop()
        except Exception as e:  # noqa: BLE001 - a hook must not raise
            print(f"nightly teardown hook could not stop node {i}: {e}")


class Fleet:
    """Tonight's nodes, the primary (phase 2's) first, and each one's usage once it is down."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.usages: dict[int, NodeUsage | None] = {}  # a node's index → its usage, once down

    def down_extra(self) -> None:
        """Every node but the primary down: only the primary's worker may take phase 2's node
        runs."""
        results = each(compute_down, self.nodes[1:])
        for i, r in enumerate(results, 1):
            if not isinstance(r, BaseException):
                self.usages[i] = r
        raise_first(results)

    def down(self, summary: RunSummary, logger: Any) -> None:
        """The teardown: every node not yet down is first asked to stop without waiting (a
        cancelled run has 30 s of grace before SIGKILL), then stopped and waited for; the cost
        of all of them goes to the summary, whatever happened."""
        if "compute_up" not in summary.phases:  # the preflight failed: nothing booted
            summary.set_phase("compute_down", "skipped", note="nothing was booted")
            return
        with phase(summary, "compute_down"):
            left = [i for i in range(len(self.nodes)) if i not in self.usages]
            stopping = [self.nodes[i] for i in left]
            for n in stopping:
                _request_stop(n, logger)
            try:
                results = each(compute_down, stopping)
                self.usages.update((i, None if isinstance(r, BaseException) else r)
                                   for i, r in zip(left, results, strict=True))
                raise_first(results)
            except BaseException:
                # Cancellation can refuse new task runs: stop the nodes directly.
                self._stop_directly(stopping, left, logger)
                raise
            finally:
                summary.cost = cost_summary(merge_usage(
                    [self.usages.get(i) for i in range(len(self.nodes))]), summary)

    def _stop_directly(self, nodes: list[Node], index: list[int], logger: Any) -> None:
        """Each node stopped without Prefect tasks (a cancelled run may not start new ones),
        each in its own try: one that cannot be stopped does not leave the others up."""
        for i, n in zip(index, nodes, strict=True):
            try:
                n.stop()
            except Exception as e:  # noqa: BLE001 - the next node still gets its stop
                logger.error("node %d could not be stopped: %s: %s", i + 1, type(e).__name__, e)
            self.usages[i] = node_usage(n, logger)


def _request_stop(node: Node, logger: Any) -> None:
    """Ask for the stop without waiting; compute_down then waits for it."""
    try:
        node.request_stop()
    except Exception as e:  # noqa: BLE001 - compute_down retries the stop and reports
        logger.warning("stop request failed (compute_down retries): %s", e)
