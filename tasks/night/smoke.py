"""The node smoke's steps (flows/smoke.py): a few rows to train on, the phases as they run,
one structured request, one training step on the node, and the node's environment against
this one's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tasks.extraction.calls import run_sync
from tasks.extraction.inputs import llm_client, response_schema
from tasks.extraction.prompt import system_prompt
from tasks.night.handoff import train_on_node, train_params
from tasks.night.phases import timed
from tasks.records import SmokePhase
from tasks.shared.environment import REBUILD, describe, differences, recorded

if TYPE_CHECKING:
    from tasks.profile import Profile

# A few rows in the scorecard's SFT dataset shape (tasks/training/train.py: load_splits). A
# timestamp in each makes every smoke's data new: the train flow reuses an adapter already
# trained on the same data and parameters, which would train nothing.
SMOKE_ROWS = 4


def smoke_dataset(folder: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    rows = [{"messages": [{"role": "user", "content": f"Smoke test {stamp}: say {i}."},
                          {"role": "assistant", "content": f"{i}"}],
             "split": "eval" if i == SMOKE_ROWS - 1 else "train"} for i in range(SMOKE_ROWS)]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"smoke-{stamp}.parquet"
    pl.DataFrame(rows).write_parquet(path)
    return path


def _print(message: str) -> None:
    print(message, flush=True)


class Smoke:
    """The phases as they run (SmokePhase records), each told to `say` as it starts and ends
    (default: printed at once, to the terminal and the flow's log)."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self.say = say or _print
        self.phases: list[SmokePhase] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[SmokePhase]:
        record = SmokePhase(phase=name)
        self.phases.append(record)
        self.say(f"smoke: {name} …")

        def ended(seconds: float, e: BaseException | None) -> None:
            record.status = "ok" if e is None else "failed"
            if e is not None:
                record.detail = f"{type(e).__name__}: {e}"
            record.seconds = round(seconds, 1)
            self.say(f"smoke: {name} {record.status} ({record.seconds} s)"
                     + (f": {record.detail}" if record.detail else ""))

        with timed(ended):
            yield record


def one_request(cfg: Profile, base_url: str) -> str:
    """One structured request through phase 1's client, as extraction sends it."""
    user = ("Document: smoke (transcripts)\n---\nAnn Lee, an engineer at Acme Ltd, met "
            "Bob Stone in Leeds to plan the bridge survey.")
    ontology = cfg.extraction.ontology()

    async def ask() -> Any:
        async with llm_client(cfg.inference, base_url) as client:
            client.max_retries = min(client.max_retries, 1)
            return await client.extract(system_prompt(ontology), user,
                                        response_schema(cfg.inference, ontology),
                                        ontology=ontology)

    answer = run_sync(ask())
    return (f"{len(answer.entities)} entities, {len(answer.relationships)} relationships "
            f"from {cfg.inference.model}")


def one_step(cfg: Profile, profile: str, timeout_seconds: float) -> str:
    """One training step on a few rows on the node, through its deployment (the dataset handed
    over as the nightly hands it)."""
    dataset = smoke_dataset(cfg.state_dir / "smoke")
    params = train_params(cfg, profile, {"dataset": str(dataset), "bucket": "smoke",
                                         "method": "sft", "max_steps": 1})
    row = train_on_node(cfg, profile, params, timeout_seconds, label="smoke",
                        created_by="smoke", promote=False)
    if row.state != "done":
        raise RuntimeError(f"the node's training run ended {row.state}: {row.message}")
    return f"adapter {row.name}: step {row.step}/{row.steps}, loss {row.loss} (not promoted)"


def environment(cfg: Profile, since: str) -> str:
    """The environment the node's run recorded (tasks/shared/environment.py) against this one."""
    if not cfg.training.gcs_block:
        return "not compared: the profile names no bucket the node could report to"
    node = recorded(cfg.training.gcs_block)
    if node is None or str(node.get("at", "")) < since:
        raise RuntimeError("the node's training run recorded no environment in the bucket "
                           "(records/node-environment.json)")
    refused, said = differences(describe(), node)
    if refused:
        raise RuntimeError(f"the node's environment {node['digest']} does not fit this "
                           f"checkout's code: {'; '.join(refused)} — fix: {REBUILD}")
    return (f"the node's environment {node['digest']} fits this checkout's pyproject.toml"
            + (f"; within its ranges: {'; '.join(said)}" if said else ""))
