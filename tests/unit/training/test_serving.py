"""Which adapter tonight's extraction server loads: the promoted one only when it was trained
on the GGUF the server serves (compared by tasks/training/base_model.gguf_digest), else the
base model with the reason. No models: the "GGUFs" are small files (the digest reads bytes)."""

from __future__ import annotations

from pathlib import Path

from tasks.records import AdapterManifest, BaseRef
from tasks.training.base_model import gguf_digest
from tasks.training.registry import ArtifactStore
from tasks.training.serving import LocalServing, base_mismatch, local_serving

BUCKET = "engineering-pointsav"


def gguf(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + content)
    return path


def promote(store: ArtifactStore, base: BaseRef, with_gguf: bool = True) -> AdapterManifest:
    m = AdapterManifest(name="eng-1", bucket=BUCKET, method="sft", base=base, data_digest="d",
                        run_digest="r", dataset="x", params={}, state="done", verified=True,
                        created="2026-11-30T00:00:00+00:00", created_by="test")
    store.write_manifest(m)
    if with_gguf:
        gguf(store.adapter_dir("eng-1") / "adapter.gguf", b"lora")
    store.promote("eng-1", "test")
    return m


def test_the_recorded_digest_decides(tmp_path: Path) -> None:
    served = gguf(tmp_path / "served.gguf", b"weights")
    m = promote(ArtifactStore(tmp_path / "a"), BaseRef(spec="s", gguf="/gone.gguf",
                                                        gguf_digest=gguf_digest(served)))
    assert base_mismatch(m, served) is None  # the file it names is gone: the digest is enough
    other = gguf(tmp_path / "other.gguf", b"other weights")
    assert base_mismatch(m, other) == (
        f"adapter eng-1 ({BUCKET}) was trained on base /gone.gguf (GGUF digest "
        f"{gguf_digest(served)}), but the server serves {other} (digest {gguf_digest(other)})")


def test_an_older_manifest_is_checked_against_the_file_it_names(tmp_path: Path) -> None:
    served = gguf(tmp_path / "served.gguf", b"weights")
    m = promote(ArtifactStore(tmp_path / "a"), BaseRef(spec="s", gguf=str(served)))
    assert base_mismatch(m, served) is None
    other = gguf(tmp_path / "other.gguf", b"other weights")
    assert "was trained on base" in (base_mismatch(m, other) or "")
    served.unlink()  # nothing left to compare with
    unknown = base_mismatch(m.model_copy(update={"base": BaseRef(spec="org/m@main")}),
                            gguf(tmp_path / "x.gguf", b"x"))
    assert unknown == (f"adapter eng-1 ({BUCKET}) records no base GGUF (trained on org/m@main): "
                       f"it cannot be shown to apply to {tmp_path / 'x.gguf'}")


def test_local_serving_names_the_adapter_or_says_why_the_base(tmp_path: Path) -> None:
    served = gguf(tmp_path / "served.gguf", b"weights")
    store = ArtifactStore(tmp_path / "a")
    assert local_serving(store, BUCKET, served) == LocalServing(None)  # nothing promoted
    promote(store, BaseRef(spec="s", gguf_digest=gguf_digest(served)))
    assert local_serving(store, BUCKET, served) == LocalServing(
        store.adapter_dir("eng-1") / "adapter.gguf", (BUCKET,))
    other = gguf(tmp_path / "other.gguf", b"other")
    wrong = local_serving(store, BUCKET, other)
    assert wrong.adapter is None and wrong.names == ()
    assert wrong.note and wrong.note.endswith("— serving the base model instead (retrain the "
                                              "bucket on this base, or roll back: slm-nightly "
                                              f"adapters rollback {BUCKET})")
    peft_only = ArtifactStore(tmp_path / "b")
    promote(peft_only, BaseRef(spec="s", gguf_digest=gguf_digest(served)), with_gguf=False)
    assert local_serving(peft_only, BUCKET, served) == LocalServing(None, note=(
        f"promoted adapter eng-1 ({BUCKET}) has no GGUF export for llama.cpp — serving the "
        "base model"))


def test_the_nightly_serves_the_base_when_the_adapter_was_trained_on_another(
        tmp_path: Path) -> None:
    """tasks/night/stages.py served_adapter with the compute block's own GGUF: before this check it
    returned the promoted adapter whatever base it was trained on."""
    from tasks.night.stages import served_adapter
    from tasks.profile import load_profile
    from tests.support.profiles import toml_profile

    trained_on = gguf(tmp_path / "trained-on.gguf", b"weights")
    served = gguf(tmp_path / "served.gguf", b"other weights")
    path = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                        compute={"type": "local", "model_path": served},
                        training={"serve_bucket": BUCKET})
    cfg = load_profile(str(path))
    promote(ArtifactStore(cfg.training.artifact_store or ""),
            BaseRef(spec=str(trained_on), gguf=str(trained_on),
                    gguf_digest=gguf_digest(trained_on)))
    serving = served_adapter(cfg)
    assert serving.adapter is None and serving.note and "serving the base model" in serving.note
    same = toml_profile(tmp_path / "q.toml", state_dir=tmp_path / "state",
                        compute={"type": "local", "model_path": trained_on},
                        training={"serve_bucket": BUCKET})
    ok = served_adapter(load_profile(str(same)))
    assert ok.adapter is not None and ok.names == (BUCKET,) and ok.note is None
