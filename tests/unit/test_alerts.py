"""automations/nightly-alerts.yaml: valid Prefect automations, the exact triggers, and what
`alerts install` changes in them (no server: tests/integration/test_alerts.py runs them)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from uuid import UUID

import pytest

from tasks.night.alerts import PLACEHOLDER, load_file, prepare
from tasks.shared.errors import ConfigError


def test_the_file_is_what_prefect_automation_create_reads() -> None:
    from prefect.events.schemas.automations import AutomationCore

    items = load_file()
    assert [AutomationCore.model_validate(a).name for a in items] == [
        "slm-nightly — night failed", "slm-nightly — no night completed in 26 h"]
    assert {str(a["actions"][0]["block_document_id"]) for a in items} == {str(PLACEHOLDER)}


def test_install_fills_in_the_block_and_the_deployment() -> None:
    block = UUID("12345678-1234-5678-1234-567812345678")
    failed, stale = prepare(load_file(), block, "nightly/staging")
    related = [{"prefect.resource.role": "flow", "prefect.resource.name": "nightly"},
               {"prefect.resource.role": "deployment", "prefect.resource.name": "staging"}]
    t = stale.trigger
    assert (t.posture, t.within, t.threshold, t.expect, t.after, t.for_each) == (
        "Proactive", timedelta(seconds=93600), 1, {"prefect.flow-run.Completed"},
        {"prefect.flow-run.Completed"}, set())
    assert [s.root for s in t.match_related] == related
    r = failed.trigger
    assert (r.posture, r.within, r.expect) == ("Reactive", timedelta(0), {
        "prefect.flow-run.Failed", "prefect.flow-run.Crashed", "prefect.flow-run.TimedOut"})
    assert [s.root for s in r.match_related] == related
    assert [a.block_document_id for a in failed.actions + stale.actions] == [block, block]
    assert load_file()[0]["trigger"]["match_related"][1]["prefect.resource.name"] == \
        "production"  # prepare works on a copy


def test_a_file_without_automations_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "a.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(ConfigError, match="no `automations:` list"):
        load_file(bad)
