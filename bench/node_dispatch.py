"""What sending a flow to the node costs: the train flow on its reuse path (already trained on
this data → returns at once), called in-process vs through `run_deployment` on `train/node`
and a real process worker (tasks/compute/node.py: run_on_node) — both inside a parent flow, against
a real `prefect server start`. The difference is the per-bucket dispatch overhead of the
orchestrator → node path: worker polling, a process spawn, imports, result via an artifact.

    python bench/node_dispatch.py [--query-seconds 10] [--runs 3]

`--query-seconds` is the worker's PREFECT_WORKER_QUERY_SECONDS (Prefect's default: 10).

The deployment is prefect.yaml's `train/node` with one change: its flow runs pull the code from
this checkout (set_working_directory) instead of the GCS bucket the production deploy pushes it
to. What the bench measures is the pool's dispatch; a node's pull_from_gcs of the code (~2 MB)
comes on top, and its time is the node's network to GCS, which no emulator here stands for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import PREFECT, ROOT, prefect_server, report


def node_deployment(tmp: Path) -> Path:
    """A prefect file holding prefect.yaml's train/node, pulled from this checkout."""
    import yaml

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    (node,) = [d for d in spec["deployments"] if d["entrypoint"] == "flows/train.py:train"
               and d["work_pool"]["name"] == "slm-node"]
    for key in ("push", "version"):  # the version is the push step's output
        node.pop(key, None)
    node["pull"] = [{"prefect.deployments.steps.set_working_directory": {
        "directory": str(ROOT)}}]
    path = tmp / "prefect.yaml"
    path.write_text(yaml.safe_dump({"name": spec["name"], "deployments": [node]}),
                    encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--query-seconds", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from blocks.compute import LocalCompute
    from flows.scorecard import scorecard
    from flows.train import train
    from tasks.compute.local import LocalNode
    from tasks.compute.node import Watch, run_on_node
    from tasks.engine.llama_cpp import default_model_path
    from tasks.training.params import build_params

    tmp = Path(tempfile.mkdtemp(prefix="node-dispatch-"))
    recipe = tmp / "recipe.yaml"
    recipe.write_text(textwrap.dedent("""
        peft: {r: 4, lora_alpha: 8, lora_dropout: 0.0}
        activation_checkpointing: false
        per_device_train_batch_size: 2
        max_length: 96
        max_eval_rows: 2
        export_gguf: false
        sft: {max_steps: 1, learning_rate: 0.005}
    """))
    profile = tmp / "bench.toml"
    profile.write_text(textwrap.dedent(f"""
        state_dir = "{tmp / 'state'}"
        [compute]
        type = "local"
        [graph]
        type = "falkordb"
        data_dir = "{tmp / 'graph'}"
        [corpus]
        root = "{ROOT / 'examples' / 'corpus'}"
        floor = 250
        [training]
        recipe = "{recipe}"
        base_model = "{default_model_path()}"
        serve_bucket = ""
    """))
    with prefect_server(tmp / "prefect-home", PREFECT_LOGGING_LEVEL="WARNING") as env, \
            temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        for argv in (["work-pool", "create", "slm-node", "--type", "process", "--overwrite"],
                     ["--no-prompt", "deploy", "--prefect-file", str(node_deployment(tmp)),
                      "--name", "train/node"]):
            done = subprocess.run([PREFECT, *argv], cwd=ROOT, env=env, capture_output=True,
                                  text=True)
            if done.returncode:
                sys.exit(f"node_dispatch: prefect {' '.join(argv)} exited {done.returncode}:\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        card = scorecard(profile=str(profile))
        bucket = card.training_pending[0]
        dataset = next((tmp / "state" / "datasets" / bucket).glob("*.parquet"))
        params = build_params(str(recipe), {"dataset": str(dataset), "bucket": bucket,
                                            "method": "sft"}, where="bench")
        t = time.perf_counter()
        first = train(params=params, profile=str(profile))  # the real training, once
        train_s = time.perf_counter() - t
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "slm-node", "--type", "process"], cwd=ROOT,
            env={**env, "PREFECT_WORKER_QUERY_SECONDS": str(args.query_seconds)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            local_s: list[float] = []
            node_s: list[float] = []
            phases: list[dict[str, float]] = []

            @flow(name="dispatch-bench")
            def parent() -> None:
                for i in range(args.runs):
                    t = time.perf_counter()
                    m = train(params=params, profile=str(profile))
                    local_s.append(time.perf_counter() - t)
                    assert m.reused and m.name == first.name
                    t = time.perf_counter()
                    row = run_on_node(LocalNode(LocalCompute()), "train/node",
                                      {"params": params.model_dump(mode="json"),
                                       "profile": str(profile)}, 600, label=f"bench-{i}",
                                      watch=Watch(poll_seconds=0.2))
                    node_s.append(time.perf_counter() - t)
                    assert row.reused and row.name == first.name and row.node_run
                    with get_client(sync_client=True) as c:
                        r = c.read_flow_run(row.node_run.id)
                    assert r.start_time and r.end_time
                    phases.append({"queued_to_start_s": (r.start_time - r.created).total_seconds(),
                                   "start_to_end_s": (r.end_time - r.start_time).total_seconds()})

            parent()
        finally:
            worker.terminate()
            worker.wait(30)
    loc, nod = statistics.median(local_s), statistics.median(node_s)
    report({"bench": "node_dispatch", "runs": args.runs, "cpus": os.cpu_count(),
            "worker_query_seconds": args.query_seconds, "training_once_s": round(train_s, 1),
            "in_process_s": [round(x, 2) for x in local_s],
            "through_node_pool_s": [round(x, 2) for x in node_s],
            "node_run_queued_to_start_s": [round(p["queued_to_start_s"], 2) for p in phases],
            "node_run_start_to_end_s": [round(p["start_to_end_s"], 2) for p in phases],
            "median_in_process_s": round(loc, 2), "median_through_node_pool_s": round(nod, 2),
            "dispatch_overhead_s": round(nod - loc, 2),
            "ratio_node_vs_in_process": round(nod / loc, 1)})


if __name__ == "__main__":
    sys.exit(main())
