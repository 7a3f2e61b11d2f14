"""A manifest never stays `running` for a run that is gone: flow runs in real Prefect states (the
session's test server), manifests in a real artifact store, and the CLI's `--state` filter."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from prefect import flow

from tasks.training.reconcile import reconcile_store
from tasks.training.registry import ArtifactStore
from tests.support.records import manifest


@flow(name="train")
def _stand_in() -> None:
    """Only its name matters: flow runs are created for it, never executed."""


def _flow_run(state: object) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(_stand_in, state=state)  # type: ignore[arg-type]
    return str(run.id)


@pytest.mark.usefixtures("prefect_api")
def test_manifests_of_gone_runs_are_marked_and_the_cli_filters_by_state(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from prefect.states import Cancelled, Crashed, Failed, Running

    from flows.cli import main
    from tests.support.profiles import toml_profile

    store = ArtifactStore(tmp_path / "artifacts")
    runs = {"preempted": _flow_run(Crashed(message="Instance preempted")),
            "cancelled": _flow_run(Cancelled()),
            "failed": _flow_run(Failed(message="boom")),
            "live": _flow_run(Running()),
            "missing": str(uuid.uuid4())}
    for name, run_id in runs.items():
        store.write_manifest(manifest(name, flow_run_id=run_id, steps=100, step=40))
    out = {r.name: (r.was, r.now) for r in reconcile_store(store)}
    assert out == {"preempted": ("running", "failed"), "cancelled": ("running", "cancelled"),
                   "failed": ("running", "failed"), "missing": ("running", "failed")}
    stored = {m.name: m for m in store.list()}
    assert stored["live"].state == "running"
    assert stored["preempted"].message == (
        "reconciled: its flow run crashed — the node was preempted or stopped, or the process "
        "was killed (Instance preempted); was running at step 40/100")
    assert stored["missing"].message.startswith(
        f"reconciled: its flow run {runs['missing']} is not on the Prefect API")
    assert reconcile_store(store) == []  # done once: a second pass changes nothing

    profile = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                           training={"artifact_store": tmp_path / "artifacts"})
    capsys.readouterr()
    assert main(["adapters", "list", "--profile", str(profile), "--state", "failed",
                 "--json"]) == 0
    import json

    listed = json.loads(capsys.readouterr().out)
    assert sorted(r["name"] for r in listed) == ["failed", "missing", "preempted"]
    assert main(["adapters", "list", "--profile", str(profile), "--state", "running"]) == 0
    text = capsys.readouterr().out
    assert "live" in text and "preempted" not in text
    with pytest.raises(SystemExit):  # not a state: argparse names the choices
        main(["adapters", "list", "--profile", str(profile), "--state", "stuck"])
