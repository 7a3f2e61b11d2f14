"""The node's smoke test, the operator's first command on a new project
(`slm-nightly node smoke --profile gcp`): boot the GCE node, wait for its engine, send one
structured request, release the GPU, run one training step on a few rows through the node's
deployment (the dataset pushed as the nightly pushes it), and stop the node — whatever
happened before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow

from flows.nightly import NIGHTLY_SLOT_WAIT_SECONDS, night_budget
from tasks.compute.gpu import NIGHTLY_LIMIT, holders, nightly_slot
from tasks.errors import ConfigError
from tasks.profile import Profile, load_profile

# A few rows in the scorecard's SFT dataset shape (tasks/training/train.py: load_splits). A
# timestamp in each makes every smoke's data new: the train flow reuses an adapter already
# trained on the same data and parameters, which would train nothing.
SMOKE_ROWS = 4


def smoke_dataset(folder: Path) -> Path:
    import polars as pl

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    rows = [{"messages": [{"role": "user", "content": f"Smoke test {stamp}: say {i}."},
                          {"role": "assistant", "content": f"{i}"}],
             "split": "eval" if i == SMOKE_ROWS - 1 else "train"} for i in range(SMOKE_ROWS)]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"smoke-{stamp}.parquet"
    pl.DataFrame(rows).write_parquet(path)
    return path


class Smoke:
    """The phases as they run: each (name, status, detail, seconds), told to `say` at once."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.phases: list[dict[str, Any]] = []

    @contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        record: dict[str, Any] = {"phase": name, "status": "running", "detail": ""}
        self.phases.append(record)
        started = time.monotonic()
        self.say(f"smoke: {name} …")
        try:
            yield record
            record["status"] = "ok"
        except BaseException as e:
            record["status"] = "failed"
            record["detail"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            record["seconds"] = round(time.monotonic() - started, 1)
            self.say(f"smoke: {name} {record['status']} ({record['seconds']} s)"
                     + (f": {record['detail']}" if record["detail"] else ""))


def _one_request(cfg: Profile, base_url: str) -> str:
    """One structured request through phase 1's client, as extraction sends it."""
    from tasks.extraction.extract import run_sync
    from tasks.extraction.inputs import llm_client, response_schema
    from tasks.extraction.prompt import system_prompt

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


def _one_step(cfg: Profile, profile: str, timeout_seconds: float) -> str:
    """One training step on a few rows on the node, through its deployment."""
    from tasks.compute.node import run_on_node
    from tasks.files import file_sha256
    from tasks.training.params import build_params

    dataset = smoke_dataset(cfg.state_dir / "smoke")
    params = build_params(cfg.training.recipe, {
        "dataset": str(dataset), "bucket": "smoke", "method": "sft", "max_steps": 1,
        "base_model": cfg.training.base_model or cfg.node.base_model},
        where=f"profile {profile} [training]")
    parameters: dict[str, Any] = {"params": params.model_dump(mode="json"), "profile": profile,
                                  "created_by": "smoke", "promote": False}
    if cfg.training.gcs_block:  # as the nightly hands a dataset to the node
        from tasks.gcs_sync import upload_file

        key = f"datasets/smoke/{dataset.name}"
        upload_file(cfg.training.gcs_block, dataset, key)
        parameters.update(dataset_gcs_key=key, dataset_sha256=file_sha256(dataset))
    row = run_on_node(cfg.node, cfg.training.node_deployment, parameters, timeout_seconds,
                      label="smoke", pickup_seconds=cfg.training.node_pickup_seconds)
    if row.state != "done":
        raise RuntimeError(f"the node's training run ended {row.state}: {row.message}")
    return f"adapter {row.name}: step {row.step}/{row.steps}, loss {row.loss} (not promoted)"


def _environment(cfg: Profile, since: str) -> str:
    """The environment the node's run recorded (tasks/environment.py) against this one."""
    from tasks.environment import REBUILD, describe, differences, recorded

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


@flow(name="node-smoke")
def node_smoke(profile: str = "gcp", train_timeout_seconds: int = 3600) -> dict[str, Any]:
    """Boot → engine → one request → engine down → one training step → the node's environment
    against this one → stop (always), holding
    the `nightly` slot throughout. Returns {phases, verdict, error}; never raises for a failed
    phase."""
    cfg = load_profile(profile)
    if not cfg.node.remote_training:
        raise ConfigError(f"node smoke: profile {profile} has no remote node ([compute] type "
                          "= \"gce\"); the local node is tested by `slm-nightly run`")
    node = cfg.node
    smoke = Smoke(lambda m: print(m, flush=True))
    error = None
    with ExitStack() as stack:
        # The node is the smoke's, as it is a nightly's: the `nightly` slot tells the reaper
        # (hourly, and at every nightly's start) to leave it up, and a nightly that starts
        # meanwhile waits for the slot, then fails with its holder named.
        try:
            stack.enter_context(nightly_slot(timeout_seconds=NIGHTLY_SLOT_WAIT_SECONDS))
        except TimeoutError:
            held = "; ".join(holders(NIGHTLY_LIMIT)) or "no holder recorded on this machine"
            error = (f"the 'nightly' slot is held (holders: {held}): a nightly run or another "
                     "smoke owns the node — wait for it, or cancel it")
            print(f"smoke: failed — {error}", flush=True)
            return {"phases": [], "verdict": "failed", "error": error}
        return _phases(cfg, profile, node, smoke, train_timeout_seconds)


def _phases(cfg: Profile, profile: str, node: Any, smoke: Smoke,
            train_timeout_seconds: int) -> dict[str, Any]:
    error = None
    try:
        with smoke.phase("boot") as p:  # Compute stops it by itself should this process die
            written = node.prepare(cfg.inference)  # the script the profile renders
            p["detail"] = node.start(night_budget(cfg, 0, train_timeout_seconds)) + (
                f"; startup script rewritten in {', '.join(written)}" if written else "")
        with smoke.phase("engine") as p:
            base_url = node.start_inference(cfg.inference)
            p["detail"] = f"ready at {base_url}"
        with smoke.phase("request") as p:
            p["detail"] = _one_request(cfg, base_url)
        with smoke.phase("engine down") as p:
            node.stop_inference()
            p["detail"] = "the GPU is free"
        started = datetime.now(UTC).isoformat(timespec="seconds")
        with smoke.phase("train") as p:
            p["detail"] = _one_step(cfg, profile, train_timeout_seconds)
        with smoke.phase("environment") as p:
            p["detail"] = _environment(cfg, since=started)
    except Exception as e:  # noqa: BLE001 - recorded in its phase; the node stops below
        error = f"{type(e).__name__}: {e}"
    finally:
        with smoke.phase("stop") as p:
            p["detail"] = f"stopped: {', '.join(node.stop()) or 'already down'}"
    verdict = "passed" if error is None else "failed"
    print(f"smoke: {verdict}" + (f" — {error}" if error else ""), flush=True)
    return {"phases": smoke.phases, "verdict": verdict, "error": error}
