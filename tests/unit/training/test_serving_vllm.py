"""Publishing promoted adapters by name to a vLLM endpoint, through its runtime LoRA API (the
fake in tests/fakes/vllm_server.py follows vLLM's source, failure modes included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blocks.serving import ServingEndpoint
from tasks.records import AdapterManifest, BaseRef
from tasks.shared.errors import ServingError
from tasks.training.registry import ArtifactStore
from tasks.training.serving import _Client, publish, publish_promoted
from tests.fakes.vllm_server import FakeVllm

BUCKET = "engineering-pointsav"
BASE = "allenai/Olmo-3-7B-Think@main"


def promote(store: ArtifactStore, name: str, bucket: str = BUCKET, base: str = BASE) -> Path:
    """A finished, verified adapter with a PEFT folder, promoted (no training: publishing
    reads only the manifest and the files)."""
    m = AdapterManifest(name=name, bucket=bucket, method="sft", base=BaseRef(spec=base),
                        data_digest="d", run_digest="r", dataset="x.parquet", params={},
                        state="done", verified=True, created="2026-11-30T00:00:00+00:00",
                        created_by="test")
    store.write_manifest(m)
    peft = store.adapter_dir(name) / "peft"
    peft.mkdir(parents=True)
    (peft / "adapter_config.json").write_text(json.dumps({"r": 8}))
    store.promote(name, "test")
    return peft


def endpoint(fake: FakeVllm, **kw: object) -> ServingEndpoint:
    fields: dict[str, object] = {"buckets": [BUCKET], **kw}
    return ServingEndpoint(kind="vllm", base_url=fake.url + "/v1", base_model=BASE,
                           **fields)  # type: ignore[arg-type]


def lora_calls(fake: FakeVllm) -> list[tuple[str, dict[str, object]]]:
    return [(path, body) for method, path, body in fake.calls if "lora" in path]


def test_the_promoted_adapter_is_loaded_under_the_bucket_name_and_answers(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    peft = promote(store, "eng-1")
    with FakeVllm() as fake:
        res = publish(endpoint(fake), store, BUCKET)
        assert res.state == "served" and res.loaded and res.answered, res.message
        assert (res.adapter, res.base, res.lora_path) == ("eng-1", BASE, str(peft))
        assert lora_calls(fake) == [("/v1/load_lora_adapter",
                                     {"lora_name": BUCKET, "lora_path": str(peft)})]
        card = next(c for c in fake.cards() if c["id"] == BUCKET)
        assert (card["root"], card["parent"]) == (str(peft), "olmo-3-7b")
        assert fake.calls[-1][2]["model"] == BUCKET  # the check asked by the name
        # the answer came from the adapter's name (the fake says which model answered)
        assert res.message.startswith(f"answers by name {BUCKET!r} ('ready (olmo-3-7b + /")

        # The next night, nothing new: no load (vLLM would refuse the name), still checked.
        again = publish(endpoint(fake), store, BUCKET)
        assert again.state == "served" and not again.loaded and again.answered
        assert len(lora_calls(fake)) == 1


def test_a_new_promotion_replaces_the_adapter_by_unload_then_load(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1")
    with FakeVllm() as fake:
        assert publish(endpoint(fake), store, BUCKET).state == "served"
        peft2 = promote(store, "eng-2")
        res = publish(endpoint(fake), store, BUCKET)
        assert res.state == "served" and res.loaded and res.adapter == "eng-2", res.message
        assert [p for p, _ in lora_calls(fake)] == ["/v1/load_lora_adapter",
                                                     "/v1/unload_lora_adapter",
                                                     "/v1/load_lora_adapter"]
        assert fake.loras == {BUCKET: str(peft2)}
        # Rolled back to the base model: the name is withdrawn, not left on the old adapter.
        store.rollback(BUCKET)
        store.rollback(BUCKET)
        gone = publish(endpoint(fake), store, BUCKET)
        assert gone.state == "withdrawn" and fake.loras == {}


def test_runtime_lora_updating_off_is_named_with_the_fix(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1")
    with FakeVllm(runtime_lora=False) as fake:
        res = publish(endpoint(fake), store, BUCKET)
    assert res.state == "failed" and not res.loaded and not res.answered
    assert res.message == ("the server has no runtime LoRA API (404 on /v1/load_lora_adapter): "
                           "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and "
                           "--enable-lora")


def test_a_path_the_server_cannot_see_names_adapter_root(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1")
    with FakeVllm() as fake:
        res = publish(endpoint(fake, adapter_root="/mnt/nowhere/adapters"), store, BUCKET)
    assert res.state == "failed" and res.lora_path == "/mnt/nowhere/adapters/eng-1/peft"
    assert "HTTP 404 NotFoundError: Loading lora engineering-pointsav failed: No adapter found " \
           "for /mnt/nowhere/adapters/eng-1/peft" in res.message
    assert "set [serving] adapter_root" in res.message


def test_an_adapter_of_another_base_is_not_loaded(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1", base="allenai/Olmo-3-32B-Think@main")
    with FakeVllm() as fake:
        res = publish(endpoint(fake), store, BUCKET)
        assert lora_calls(fake) == []
    assert res.state == "failed" and "trained on base allenai/Olmo-3-32B-Think@main" in res.message
    assert f"the endpoint serves {BASE} — not loaded" in res.message


def test_api_key_is_sent_and_a_wrong_one_is_named(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1")
    with FakeVllm(api_key="s3cret") as fake:
        ok = publish(endpoint(fake, api_key="s3cret"), store, BUCKET)
        wrong = publish(endpoint(fake, api_key="nope"), store, BUCKET)
    assert ok.state == "served", ok.message
    assert wrong.state == "failed" and "401 — the endpoint wants another api key" in wrong.message
    assert "s3cret" not in wrong.message and "nope" not in wrong.message


def test_vllm_failure_answers_each_give_a_clear_error(tmp_path: Path) -> None:
    """Duplicate load, unknown unload, unknown model in a chat completion: vLLM's own words."""
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text("{}")
    with FakeVllm() as fake:
        client = _Client(endpoint(fake))
        client.lora("load", {"lora_name": "a", "lora_path": str(peft)})
        with pytest.raises(ServingError, match="HTTP 400 InvalidUserInput: The lora adapter 'a' "
                                               "has already been loaded"):
            client.lora("load", {"lora_name": "a", "lora_path": str(peft)})
        with pytest.raises(ServingError, match="HTTP 404 NotFoundError: The lora adapter 'b' "
                                               "cannot be found"):
            client.lora("unload", {"lora_name": "b"})
        with pytest.raises(ServingError, match="model='b' failed: HTTP 404 NotFoundError: The "
                                               "model `b` does not exist"):
            client.answer("b", "hi")
    with pytest.raises(ServingError, match="is the serving endpoint up"):
        client.models()  # the server is gone


def test_every_configured_bucket_is_published_and_one_without_promotion_is_skipped(
        tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1")
    with FakeVllm() as fake:
        out = publish_promoted(endpoint(fake, buckets=[BUCKET, "apprenticeship-pointsav"]), store)
    assert {k: v.state for k, v in out.items()} == {BUCKET: "served",
                                                    "apprenticeship-pointsav": "skipped"}


def test_the_nightly_publishes_after_phase_2_and_a_failure_does_not_fail_it(
        tmp_path: Path) -> None:
    """tasks/night/training.py publish_phase with a profile's [serving] section: the result is in the run
    summary (and its text); an endpoint that refuses is reported, not raised, and the
    promotion stands."""
    from prefect.logging import disable_run_logger

    from tasks.night.summary import new_summary, render_text
    from tasks.night.training import publish_phase
    from tasks.profile import load_profile
    from tests.support.profiles import toml_profile

    with FakeVllm(runtime_lora=False) as off, FakeVllm() as fake:
        for server, state in ((fake, "served"), (off, "failed")):
            path = toml_profile(tmp_path / f"{state}.toml", state_dir=tmp_path / "state",
                                compute={"type": "local"},
                                serving={"kind": "vllm", "base_url": server.url,
                                         "base_model": BASE, "buckets": [BUCKET]})
            cfg = load_profile(str(path))
            store = ArtifactStore(cfg.training.artifact_store or "")
            if store.promoted(BUCKET) is None:
                promote(store, "eng-1")
            summary = new_summary(cfg.name)
            with disable_run_logger():
                publish_phase(summary, cfg)
            assert summary.published is not None
            assert summary.published[BUCKET].state == state
            assert summary.phases["publish"].status == "completed"
            assert store.pointer(BUCKET).current == "eng-1"  # promoted, whatever happened
            text = render_text(summary)
            assert f"Served by name {BUCKET}: {state.upper()} (eng-1 on {server.url})" in text
        assert summary.phases["publish"].note == f"not served by name: {BUCKET}"
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in text


def test_the_server_reads_its_own_copy_and_a_manifest_without_peft_is_refused(
        tmp_path: Path) -> None:
    """With GCS as the store's truth the orchestrator may hold only the manifest: what the
    manifest lists decides, and the server loads from adapter_root (its own mount)."""
    store = ArtifactStore(tmp_path / "artifacts")
    promote(store, "eng-1")
    m = store.manifest("eng-1")
    m.files = {"peft": "peft", "tarball": "adapter.tar.gz"}
    store.write_manifest(m)
    mount = tmp_path / "server-mount" / "adapters"
    (store.adapter_dir("eng-1") / "peft").rename(tmp_path / "elsewhere")  # not on this disk
    (mount / "eng-1" / "peft").mkdir(parents=True)
    (mount / "eng-1" / "peft" / "adapter_config.json").write_text("{}")
    with FakeVllm() as fake:
        res = publish(endpoint(fake, adapter_root=str(mount)), store, BUCKET)
        assert res.state == "served" and res.lora_path == f"{mount}/eng-1/peft", res.message
        m.files = {"gguf": "adapter.gguf"}  # a GGUF-only adapter: nothing vLLM can load
        store.write_manifest(m)
        fake.loras.clear()
        res = publish(endpoint(fake, adapter_root=str(mount)), store, BUCKET)
    assert res.state == "failed" and res.message == (
        "adapter eng-1 has no peft export to serve on vllm (its manifest's files: "
        "{'gguf': 'adapter.gguf'})")
