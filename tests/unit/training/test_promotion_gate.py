"""The promotion gate and promote(): ties keep the old adapter; only a finished, verified (or
GGUF-less) adapter is promoted. Losses are binary fractions, so the boundaries are exact."""

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tasks.records import PromotedPointer
from tasks.shared.errors import ConfigError
from tasks.training.registry import ArtifactStore, gate


def test_a_new_loss_below_the_margin_is_promoted() -> None:
    ok, why = gate({"new": 0.75, "base": 1.0}, 0.125)  # must be < 0.875
    assert ok and why == "eval loss 0.7500 beats base 1.0000 by at least 12.5%"


def test_a_tie_at_the_margin_is_not_promoted() -> None:
    ok, why = gate({"new": 0.875, "base": 1.0}, 0.125)
    assert not ok
    assert why == ("eval loss 0.8750 does not beat the base model's 1.0000 by 12.5% — kept, "
                   "not promoted")


def test_an_equal_loss_with_no_margin_is_not_promoted() -> None:
    assert gate({"new": 0.5, "base": 0.5}, 0.0)[0] is False
    assert gate({"new": 0.4999, "base": 0.5}, 0.0)[0] is True


def test_the_promoted_adapter_must_be_beaten_too() -> None:
    ok, why = gate({"new": 0.5, "base": 2.0, "promoted": 0.5625}, 0.125)  # needs < 0.4921875
    assert not ok and "the promoted model's 0.5625" in why
    ok, why = gate({"new": 0.25, "base": 2.0, "promoted": 0.5}, 0.125)
    assert ok and why == "eval loss 0.2500 beats base 2.0000, promoted 0.5000 by at least 12.5%"


def test_the_base_must_be_beaten_even_when_the_promoted_one_is() -> None:
    ok, why = gate({"new": 1.0, "base": 1.0, "promoted": 4.0}, 0.0)
    assert not ok and "the base model's 1.0000" in why


def test_other_losses_are_no_rivals() -> None:
    assert gate({"new": 0.5, "base": 1.0, "train": 0.1}, 0.0)[0] is True


def test_a_nan_loss_is_never_promoted() -> None:
    assert gate({"new": math.nan, "base": 1.0}, 0.0)[0] is False
    assert gate({"new": 0.5, "base": math.nan}, 0.0)[0] is False


def adapter(store: ArtifactStore, name: str, **fields: Any) -> None:
    """An adapter's manifest on disk, as the training flow leaves it."""
    manifest = {"version": 1, "name": name, "bucket": "eng", "method": "sft",
                "base": {"spec": "tiny"}, "data_digest": "d", "run_digest": "r",
                "dataset": "data.parquet", "params": {}, "created_by": "test",
                "state": "done", "verified": True, "created": "2026-11-30T00:00:00+00:00",
                **fields}
    path = store.adapter_dir(name) / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(("state", "verified"), [
    ("done", False), ("running", True), ("failed", None), ("queued", None), ("cancelled", True)])
def test_only_a_finished_adapter_that_passed_verification_is_promoted(
        tmp_path: Path, state: str, verified: bool | None) -> None:
    store = ArtifactStore(tmp_path)
    adapter(store, "a1", state=state, verified=verified)
    with pytest.raises(ConfigError) as e:
        store.promote("a1", "by hand")
    assert str(e.value) == (f"adapter a1: state '{state}', verified {verified} — only a finished "
                            "adapter that passed verification (or has no GGUF to verify) can be "
                            "promoted")
    assert store.pointer("eng") == PromotedPointer()  # nothing promoted
    assert not (tmp_path / "promoted").exists()


@pytest.mark.parametrize("verified", [True, None])  # None: no GGUF was exported to verify
def test_a_verified_or_gguf_less_adapter_is_promoted(tmp_path: Path, verified: bool | None
                                                     ) -> None:
    store = ArtifactStore(tmp_path)
    adapter(store, "a1", verified=verified)
    ptr = store.promote("a1", "gate passed")
    assert (ptr.current, ptr.reason, ptr.history) == ("a1", "gate passed", [])
    assert store.pointer("eng").current == "a1"
    promotions = json.loads((store.adapter_dir("a1") / "manifest.json").read_text())["promotions"]
    assert [p["reason"] for p in promotions] == ["gate passed"]


def test_promotion_history_and_rollback(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    for name in ("a1", "a2"):
        adapter(store, name)
    store.promote("a1", "first")
    ptr = store.promote("a2", "second")
    assert ptr.current == "a2" and [h.name for h in ptr.history] == ["a1"]
    again = store.promote("a2", "once more")  # already current: nothing changes
    assert again == ptr
    assert len(json.loads((store.adapter_dir("a2") / "manifest.json").read_text())["promotions"]) == 1
    assert store.rollback("eng").current == "a1"
    assert store.rollback("eng").current is None
    with pytest.raises(ConfigError, match="nothing is promoted"):
        store.rollback("eng")


def test_promoting_an_unknown_adapter_names_the_known_ones(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    adapter(store, "a1")
    with pytest.raises(ConfigError, match=r"adapter 'nope': no manifest .* known adapters: \['a1'\]"):
        store.promote("nope", "x")


def test_the_pointer_keeps_every_earlier_adapter_with_times(tmp_path: Path) -> None:
    from datetime import datetime

    store = ArtifactStore(tmp_path)
    for name in ("a1", "a2", "a3"):
        adapter(store, name)
        store.promote(name, f"gate passed for {name}")
    ptr = store.pointer("eng")
    assert (ptr.current, ptr.reason) == ("a3", "gate passed for a3")
    assert [h.name for h in ptr.history] == ["a2", "a1"]  # newest first
    for stamp in [ptr.since, *(h.until for h in ptr.history)]:
        assert datetime.fromisoformat(stamp).tzinfo is not None
    # an operator reads the pointer file: indented, like the manifests
    path = tmp_path / "promoted" / "eng.json"
    text = path.read_text()
    assert text.startswith('{\n  "current": "a3",\n  "since": "')
    assert [sorted(h) for h in json.loads(text)["history"]] == [["name", "until"]] * 2
    assert PromotedPointer.model_validate_json(text) == ptr
    # a pointer file written before the record (its keys in the old order) still reads
    old = {"current": "a3", "history": [{"name": "a2", "until": "2026-11-30T01:00:00+00:00"}],
           "since": "2026-11-30T01:00:00+00:00", "reason": "gate passed for a3"}
    path.write_text(json.dumps(old, indent=2))
    assert store.pointer("eng").model_dump() == old
    path.write_text(json.dumps({"current": None, "history": []}, indent=2))
    assert store.pointer("eng") == PromotedPointer()
    assert PromotedPointer().to_json() == json.dumps({"current": None, "history": []}, indent=2)


def test_promotion_gate_both_ways() -> None:
    ok, why = gate({"base": 3.5, "new": 3.2}, 0.05)
    assert ok and "beats base 3.5000" in why
    ok, why = gate({"base": 3.5, "new": 3.4}, 0.05)  # better, but not by 5 %
    assert not ok and "does not beat the base" in why
    ok, why = gate({"base": 3.5, "promoted": 3.1, "new": 3.2}, 0.0)
    assert not ok and "promoted model's 3.1000" in why
