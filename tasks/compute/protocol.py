"""One interface for the node, whatever it is: flows and tasks call these methods and never
ask which kind of node they hold. `node_for(block)` builds the node for a profile's compute
block (LocalCompute → LocalNode, GceCompute → GceNode); `nodes_for(block)` every node it
describes (GceCompute.nodes), the primary first; `gce_block(block)` the GCE block, for what
only a cloud has (the preflight). The one place that asks which kind of compute block it
holds (a unit test checks: tests/unit/test_kinds.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

from blocks.compute import LocalCompute
from blocks.gce import GceCompute
from blocks.inference import InferenceEndpoint
from tasks.compute.gce.lifecycle import GceNode
from tasks.compute.local import LocalNode
from tasks.records import NodeUsage
from tasks.shared.errors import ConfigError
from tasks.shared.processes import ManagedServer


@runtime_checkable
class Node(Protocol):
    """Where phase 1's inference server and phase 2's training run."""

    remote_training: bool
    """True: the GPU is on another machine, and training runs there through the node's
    deployment (tasks/night/handoff.py: train_on_node); False: in this process."""
    loads_adapters: bool
    """Whether start_inference serves the promoted LoRA adapter it is given."""

    @property
    def base_model(self) -> str | None:
        """The GGUF on this machine that training may use as its base (None: the recipe's)."""

    @property
    def cpu_threads(self) -> int:
        """Threads for CPU work on the node (adapter verification)."""

    @property
    def boot_timeout_seconds(self) -> float | None:
        """How long one boot may take; None: nothing boots (this machine)."""

    @property
    def stop_timeout_seconds(self) -> float | None:
        """How long a stop may take; None: nothing stops the node by itself (this machine), so
        it gets no max run duration (tasks/night/clock.py night_budget)."""

    def prepare(self, endpoint: InferenceEndpoint) -> list[str]:
        """Make what the node boots match the profile before it starts (GCE: the startup script
        rendered from the blocks, in every zone's metadata); what was changed."""

    def start(self, max_run_seconds: float | None = None,
              timeout_seconds: float | None = None) -> str:
        """Boot the node (or reuse one up); a description for the summary. A node that can
        stop itself (GCE: scheduling.maxRunDuration) does so after `max_run_seconds` RUNNING
        (None: its configured default); a local node ignores it. `timeout_seconds` caps the
        whole wait for the boot, fallbacks included (None: the block's boot_timeout_seconds
        for each placement tried; the nightly passes the smaller of that and what is left of
        the night's budget); a node with nothing to wait for ignores it."""

    def start_inference(self, endpoint: InferenceEndpoint, adapter: Path | None = None,
                        names: tuple[str, ...] = ()) -> str:
        """Bring the inference server up and wait until it serves; its base URL. Where the
        node loads adapters, `adapter` is served as `endpoint.model` and under each of
        `names` (the bucket's name it is published as)."""

    def stop_inference(self) -> bool:
        """Stop the inference server and wait until it is gone; whether one was up."""

    def inference_running(self) -> bool:
        """Whether the inference server answers now."""

    def request_stop(self) -> list[str]:
        """Ask for the node to stop without waiting (a cancelled run's first step); what was
        asked (zones)."""

    def stop(self) -> list[str]:
        """Stop the node and wait until it is down (idempotent); what was stopped."""

    @property
    def watch_seconds(self) -> float:
        """How often a watch of work on the node (run_on_node) checks it and its run."""

    def check_running(self) -> None:
        """Raise NodePreempted when the node this run started has gone away."""

    def running(self) -> dict[str, str]:
        """Where → status for every part of the node that is up now (empty: all stopped);
        the reaper stops a node that is up with no run using it."""

    def signal_stops(self) -> list[tuple[str, ManagedServer, Callable[[], bool]]]:
        """What to stop on this machine when the CLI is stopped by a signal, as (what, how):
        the servers of the node that run here, each with how to stop it (the local llama.cpp
        server); none for a remote node, whose teardown is the run's own."""

    def usage(self, since: float | None = None) -> NodeUsage:
        """Running seconds, GPU-hours and estimated cost since `since` (default: this run's
        start)."""

    @property
    def server_exit(self) -> Callable[[], str | None] | None:
        """Why the inference server this machine started for the run is gone, when it died
        under it (phase 1 then says how and stops asking it; inference_server.server_exit);
        None where no server of this process's runs (a remote node)."""

    def engine_here(self, state_dir: Path) -> Self | None:
        """A node like this one whose inference server runs on this machine with its state in
        `state_dir` (the eval's own engine, apart from a nightly's); None where the server
        runs on another machine (a GCE node, which the eval does not boot)."""


def gce_block(block: LocalCompute | GceCompute) -> GceCompute | None:
    """The block when it describes GCE nodes (the preflight's cloud checks); None for this
    machine."""
    return block if isinstance(block, GceCompute) else None


def node_for(block: LocalCompute | GceCompute) -> Node:
    """The node a profile's compute block describes (its primary, when it describes more)."""
    if isinstance(block, GceCompute):
        return GceNode(block)
    if isinstance(block, LocalCompute):
        return LocalNode(block)
    raise ConfigError(f"compute: no node for a {type(block).__name__} block — use a "
                      "LocalCompute or GceCompute block")


def nodes_for(block: LocalCompute | GceCompute) -> list[Node]:
    """Every node a profile's compute block describes, the primary (node_for's) first: a
    GceCompute's `nodes` instances (GceCompute.node_blocks); a LocalCompute is this one
    machine (the profile loader refuses `nodes` > 1 on it)."""
    if isinstance(block, GceCompute):
        return [GceNode(b) for b in block.node_blocks()]
    return [node_for(block)]
