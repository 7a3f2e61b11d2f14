"""The node record (<state_dir>/gce-<instance>.json): which zone this run's node is in, so a
later call — the teardown hook, the reaper, another process — stops the right one."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blocks.gce import GceCompute
from tasks.compute.gce.placement import ProvisioningModel
from tasks.shared.files import write_atomic


@dataclass
class NodeRecord:
    zone: str
    instance: str
    ip: str
    model: ProvisioningModel


class RecordFile:
    """The block's node record: the node this run started (None once stopped) and what the
    run keeps beside it (started_at, attempts, last_node)."""

    def __init__(self, block: GceCompute) -> None:
        self.path = Path(block.state_dir) / f"gce-{block.instance}.json"

    def write(self, node: NodeRecord | None, **extra: Any) -> None:
        data = {"node": asdict(node) if node else None, **extra}
        write_atomic(self.path, json.dumps(data))

    def read(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return {}

    def node(self) -> NodeRecord | None:
        n = self.read().get("node")
        return NodeRecord(**n) if n else None
