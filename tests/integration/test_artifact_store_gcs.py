"""GCS as the artifact store's truth, against the storage emulator (with GCS's generation
preconditions: tests/support/gcs_preconditions.py): the bucket from SLM_YOYO_WEIGHTS_GCS_BUCKET,
promotions two writers cannot both win, checkpoints a node in another zone resumes from, and
the orchestrator's `adapters` commands."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.cli import main as cli
from tasks.profile import load_profile
from tasks.shared.errors import ConfigError
from tasks.shared.gcs_sync import ENV_BUCKET, GcsFolder
from tasks.training.registry import ArtifactStore
from tests.fakes.gcs import GcsEmulator
from tests.support.paths import ROOT
from tests.support.profiles import toml_profile
from tests.support.training import cli_process, sft_parquet, train_profile, write_recipe


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    with GcsEmulator(tmp_path_factory.mktemp("gcs")) as emulator:
        yield emulator


@pytest.fixture
def bucket_env(gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch, request: Any) -> str:
    """SLM_YOYO_WEIGHTS_GCS_BUCKET as the operators set it (gs://, a folder of its own per
    test) and application-default credentials for the emulator."""
    for key, value in gcs.adc().items():
        monkeypatch.setenv(key, value)
    folder = request.node.name.replace("_", "-")[:40]
    monkeypatch.setenv(ENV_BUCKET, f"gs://slm-corpus/{folder}/")
    return folder


_CLOCK = itertools.count()


def adapter(store: ArtifactStore, name: str, bucket: str = "eng", **fields: Any) -> None:
    """A finished adapter as a training run leaves it: files, then its `done` manifest."""
    from tasks.records import AdapterManifest

    peft = store.adapter_dir(name) / "peft"
    peft.mkdir(parents=True, exist_ok=True)
    (peft / "adapter_model.safetensors").write_bytes(f"weights of {name}".encode())
    (store.adapter_dir(name) / "adapter.gguf").write_bytes(f"gguf of {name}".encode())
    store.write_manifest(AdapterManifest.parse({
        "version": 1, "name": name, "bucket": bucket, "method": "sft", "base": {"spec": "tiny"},
        "data_digest": "d", "run_digest": "r", "dataset": "data.parquet", "params": {},
        "created_by": "test", "state": "done", "verified": True,
        "created": f"2026-11-30T00:00:{next(_CLOCK):02d}+00:00",  # oldest first: call order
        "files": {"peft": "peft", "gguf": "adapter.gguf"}, **fields}, name))


def test_the_emulator_refuses_writes_whose_generation_precondition_fails(gcs: GcsEmulator
                                                                           ) -> None:
    """The fake behaves as GCS documents (tests/support/gcs_preconditions.py)."""
    from google.api_core.exceptions import PreconditionFailed

    folder = GcsFolder(gcs.bucket(), "preconditions")
    folder.write("p.json", b"1", if_generation_match=0)  # 0: only while there is none
    with pytest.raises(PreconditionFailed):
        folder.write("p.json", b"2", if_generation_match=0)
    got = folder.read("p.json")
    assert got is not None and got[0] == b"1"
    with pytest.raises(PreconditionFailed):
        folder.write("p.json", b"3", if_generation_match=got[1] + 1)
    folder.write("p.json", b"4", if_generation_match=got[1])
    assert folder.read("p.json")[0] == b"4"  # type: ignore[index]


@pytest.mark.usefixtures("prefect_api")
def test_the_operators_variable_names_the_bucket_for_artifacts_records_and_corpus(
        bucket_env: str, gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    from tasks.corpus.handoff import sync_corpus
    from tasks.shared.gcs_sync import mirror_records

    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "examples" / "corpus", corpus)
    profile = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                           corpus={"root": corpus})
    cfg = load_profile(str(profile))
    url = f"gs://slm-corpus/{bucket_env}"
    assert cfg.gcs_block == cfg.training.gcs_block == cfg.corpus.gcs_block == url
    synced = sync_corpus(corpus, cfg.corpus.gcs_block)
    corpus_files = len([p for p in corpus.rglob("*") if p.is_file()])
    assert synced is not None and (synced.prefix, synced.uploaded, synced.error) == (
        f"{bucket_env}/corpus", corpus_files, None)
    (cfg.state_dir / "runs").mkdir(parents=True)
    (cfg.state_dir / "runs" / "last-run.json").write_text("{}")
    records = mirror_records(cfg.state_dir, cfg.gcs_block)
    assert records is not None and (records.uploaded, records.error) == (1, None)
    adapter(ArtifactStore(tmp_path / "cache", cfg.training.gcs_block), "a1")
    names = {b.name for b in gcs.bucket().list_blobs(bucket_env)}
    assert {f"{bucket_env}/records/runs/last-run.json",
            f"{bucket_env}/artifacts/adapters/a1/manifest.json",
            f"{bucket_env}/artifacts/adapters/a1/peft/adapter_model.safetensors"} <= names

    monkeypatch.setenv(ENV_BUCKET, "slm-corpus")  # a bare bucket name works too
    bare = load_profile(str(profile))
    assert bare.training.gcs_block == "gs://slm-corpus"
    adapter(ArtifactStore(tmp_path / "cache2", bare.training.gcs_block), "bare-a1")
    assert gcs.bucket().get_bucket().get_blob("artifacts/adapters/bare-a1/manifest.json")
    monkeypatch.setenv(ENV_BUCKET, "gs://Not_A_Bucket/x")
    with pytest.raises(ConfigError, match="SLM_YOYO_WEIGHTS_GCS_BUCKET='gs://Not_A_Bucket/x': "
                                          "not a GCS bucket"):
        load_profile(str(profile))


def _racing(stores: list[ArtifactStore]) -> list[int]:
    """Make the stores' first pointer reads meet before any of them writes (the race two zones
    can run into), and count the writes GCS refused."""
    meet = threading.Barrier(len(stores), timeout=30)
    refused = [0]
    for store in stores:
        read, write, first = store._read_pointer, store._write_pointer, [True]

        def read_then_meet(bucket: str, read: Any = read, first: list[bool] = first) -> Any:
            got = read(bucket)
            if first[0]:
                first[0] = False
                meet.wait()
            return got

        def counted(*args: Any, write: Any = write) -> bool:
            ok = bool(write(*args))
            refused[0] += not ok
            return ok

        store._read_pointer = read_then_meet  # type: ignore[method-assign]
        store._write_pointer = counted  # type: ignore[method-assign]
    return refused


def _in_threads(*calls: Any) -> list[Any]:
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as e:  # noqa: BLE001 - returned for the test to look at
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_two_promoters_in_two_zones_cannot_both_win(bucket_env: str, tmp_path: Path) -> None:
    block = f"gs://slm-corpus/{bucket_env}"
    seed = ArtifactStore(tmp_path / "seed", block)
    for name in ("a1", "a2"):
        adapter(seed, name)
    zone_a, zone_b = ArtifactStore(tmp_path / "a", block), ArtifactStore(tmp_path / "b", block)
    refused = _racing([zone_a, zone_b])
    results = _in_threads(lambda: zone_a.promote("a1", "zone a"),
                          lambda: zone_b.promote("a2", "zone b"))
    assert not any(isinstance(r, Exception) for r in results), results
    assert refused[0] == 1  # both read "nothing promoted"; GCS took one write and refused one
    ptr = ArtifactStore(tmp_path / "orchestrator", block).pointer("eng")
    # The refused promoter read again and promoted over the winner: no promotion was lost.
    assert [ptr.current, *(h.name for h in ptr.history)] in (["a1", "a2"],
                                                                     ["a2", "a1"])

    # Two rollbacks at once: one goes back one step, the other is refused, not applied twice.
    zone_a, zone_b = ArtifactStore(tmp_path / "a", block), ArtifactStore(tmp_path / "b", block)
    refused = _racing([zone_a, zone_b])
    results = _in_threads(lambda: zone_a.rollback("eng"), lambda: zone_b.rollback("eng"))
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and "changed while rolling back" in str(errors[0])
    assert refused[0] == 1
    after = ArtifactStore(tmp_path / "orchestrator", block).pointer("eng")
    assert (after.current, after.history) == (ptr.history[0].name, [])


def test_checkpoints_upload_state_last_and_restore_the_newest_complete_one(
        bucket_env: str, tmp_path: Path) -> None:
    block = f"gs://slm-corpus/{bucket_env}"
    node = ArtifactStore(tmp_path / "node", block)
    run = node.checkpoint_dir("digest1")
    for step in (2, 4):
        ckpt = run / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        for f in ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json",
                  "training_args.bin", "zz_rng_state.pth"):
            (ckpt / f).write_text(f"{f} at {step}")
        report = node.save_checkpoint(ckpt)
        assert report is not None and report.error is None and report.uploaded == 5
    shutil.rmtree(run / "checkpoint-2")  # the Trainer rotates it away: its copy goes too
    (run / "checkpoint-6").mkdir()
    (run / "checkpoint-6" / "adapter_model.safetensors").write_text("6")
    report = node.save_checkpoint(run / "checkpoint-6")  # preempted before trainer_state.json
    assert report is not None and report.removed == ["checkpoint-2"]
    blobs = node.remote.list("checkpoints/digest1")  # type: ignore[union-attr]
    assert sorted(blobs) == sorted(
        [f"checkpoints/digest1/checkpoint-4/{f}" for f in (
            "adapter_model.safetensors", "optimizer.pt", "trainer_state.json",
            "training_args.bin", "zz_rng_state.pth")]
        + ["checkpoints/digest1/checkpoint-6/adapter_model.safetensors"])
    generations = {k.rsplit("/", 1)[1]: int(b.generation) for k, b in blobs.items()
                   if "checkpoint-4" in k}
    assert max(generations, key=generations.__getitem__) == "trainer_state.json"

    fresh = ArtifactStore(tmp_path / "other-zone", block)  # an empty disk
    assert fresh.restore("digest1") == "checkpoint-4"  # 6 has no trainer_state.json
    got = fresh.checkpoint_dir("digest1")
    assert sorted(p.name for p in got.iterdir()) == ["checkpoint-4"]
    assert (got / "checkpoint-4" / "optimizer.pt").read_text() == "optimizer.pt at 4"
    assert fresh.restore("digest1") is None  # already there
    assert fresh.drop_checkpoints("digest1") is None
    assert fresh.remote.list("checkpoints/digest1") == {}  # type: ignore[union-attr]
    assert not got.exists()


def test_the_orchestrator_lists_shows_promotes_rolls_back_and_downloads_from_gcs(
        bucket_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = ArtifactStore(tmp_path / "node", f"gs://slm-corpus/{bucket_env}")
    adapter(node, "e1", bucket="engineering-pointsav")
    adapter(node, "e2", bucket="engineering-pointsav")
    node.promote("e1", "gate passed")
    profile = str(toml_profile(tmp_path / "orch.toml", state_dir=tmp_path / "orch"))

    def run(*args: str) -> str:
        assert cli(["adapters", *args, "--profile", profile]) == 0
        return capsys.readouterr().out

    rows = json.loads(run("list", "--json"))
    assert [(r["name"], r["state"], r["promoted"]) for r in rows] == [
        ("e1", "done", True), ("e2", "done", False)]
    assert json.loads(run("show", "e2"))["files"] == {"peft": "peft", "gguf": "adapter.gguf"}
    assert json.loads(run("promote", "e2"))["current"] == "e2"
    assert node.pointer("engineering-pointsav").current == "e2"  # what a node reads
    assert json.loads(run("rollback", "engineering-pointsav"))["current"] == "e1"
    out = tmp_path / "got"
    assert run("download", "e2", "--to", str(out)).strip().endswith(str(out))
    assert (out / "peft" / "adapter_model.safetensors").read_bytes() == b"weights of e2"
    assert json.loads((out / "manifest.json").read_text())["promotions"][0]["reason"] == \
        "by hand: operator decision"
    assert ArtifactStore(tmp_path / "serve", node.gcs_block).serving(
        "engineering-pointsav").read_bytes() == b"gguf of e1"  # type: ignore[union-attr]
    assert cli(["adapters", "show", "nope", "--profile", profile]) == 2
    assert f"no manifest at gs://slm-corpus/{bucket_env}/artifacts/adapters/nope" in \
        capsys.readouterr().err


@pytest.mark.usefixtures("prefect_api")
def test_a_node_in_another_zone_resumes_the_preempted_run_from_gcs(
        bucket_env: str, gcs: GcsEmulator, tiny_base: Path,  # noqa: F811 - the fixture
        base_cache: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Zone A is preempted (kill -9) after its first checkpoint reached GCS; the next night's
    node in zone B starts with an empty state dir and the same bucket, resumes from A's
    checkpoint and finishes at max_steps; the orchestrator lists the adapter from GCS."""
    from prefect.settings import PREFECT_API_URL

    from flows.train import train
    from tasks.training.params import build_params

    max_steps = 60
    zones = {z: tmp_path / f"zone-{z}" for z in "ab"}
    for root in zones.values():
        root.mkdir()
        recipe = write_recipe(root, save_steps=3, export_gguf=False,
                              sft={"max_steps": max_steps, "learning_rate": 0.005})
        train_profile(root, base_cache["cache"], recipe=recipe)
        sft_parquet(root / "toy.parquet")
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PYTHONPATH": str(ROOT)}
    proc = cli_process("train", "--profile", str(zones["a"] / "train.toml"), "--dataset",
                str(zones["a"] / "toy.parquet"), "--method", "sft", "--base-model",
                str(tiny_base), "--bucket", "toy", env=env)
    remote = GcsFolder(gcs.bucket(folder=bucket_env), "artifacts")

    def complete() -> list[int]:
        return sorted(int(k.split("/")[2].split("-")[1]) for k in remote.list("checkpoints")
                      if k.endswith("/trainer_state.json"))

    while not complete():  # (pytest's timeout bounds it)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    with get_client(sync_client=True) as client:  # as in test_train: the dead run's gpu slot
        client.update_global_concurrency_limit("gpu", GlobalConcurrencyLimitUpdate(active_slots=0))
    newest = complete()[-1]
    assert 3 <= newest < max_steps

    assert not (zones["b"] / "state").exists()  # zone B: an empty disk, the same bucket
    params = build_params(str(zones["b"] / "recipe.yaml"), {
        "dataset": str(zones["b"] / "toy.parquet"), "bucket": "toy", "method": "sft",
        "base_model": str(tiny_base)})
    m = train(params=params, profile=str(zones["b"] / "train.toml"), created_by="cli")
    assert m.state == "done"
    assert (m.training["resumed_from"], m.training["resumed_step"]) == (
        f"checkpoint-{newest}", newest)
    assert m.step == m.steps == max_steps  # where an uninterrupted run ends
    assert complete() == []  # a done run's checkpoints are gone from GCS too

    orchestrator = toml_profile(tmp_path / "orch.toml", state_dir=tmp_path / "orch")
    assert cli(["adapters", "list", "--json", "--bucket", "toy",
                "--profile", str(orchestrator)]) == 0
    rows = {r["name"]: r["state"] for r in json.loads(capsys.readouterr().out)}
    assert rows[m.name] == "done" and len(rows) == 2  # and zone A's unfinished job
