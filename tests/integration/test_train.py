"""Phase 2b on the CPU with real models: a tiny random Llama (SmolLM2's tokenizer) for the
training mechanics, SmolLM2-135M for the whole flow (train → export → verify → promote)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tasks.training.params import Recipe, TrainParams, build_params, resolve
from tasks.training.registry import ArtifactStore
from tests.support.paths import ROOT
from tests.support.training import MSG, cli_process, sft_parquet, train_profile, write_recipe


def dpo_parquet(path: Path, n: int = 24, n_eval: int = 4) -> Path:
    rows = [{"prompt": [{"role": "user", "content": f"Greet visitor {i}."}],
             "chosen": [{"role": "assistant", "content": "Hello, welcome!"}],
             "rejected": [{"role": "assistant", "content": "Go away."}],
             "split": "eval" if i < n_eval else "train"} for i in range(n)]
    pl.DataFrame(rows, schema={"prompt": MSG, "chosen": MSG, "rejected": MSG,
                               "split": pl.String}).write_parquet(path)
    return path


def tiny_recipe(method: str = "sft", **kw: Any) -> Recipe:
    """Recipe keys in TRL's and PEFT's words, no recipe file."""
    fields: dict[str, Any] = dict(
        max_steps=12, per_device_train_batch_size=4, learning_rate=5e-3, max_length=64,
        logging_steps=2, save_steps=100, activation_checkpointing=False, max_eval_rows=8,
        load_in_4bit=False, export_gguf=False, peft={"r": 8, "lora_alpha": 16, "lora_dropout": 0.0})
    fields.update(kw)
    return resolve(TrainParams(dataset="unused", method=method, overrides=fields))


# --- bad parameters fail at once (the recipe's keys: tests/unit/training/test_recipes.py) -------


# --- training mechanics on a tiny model ---------------------------------------------------------

def _train_tiny(recipe: Recipe, dataset: Path, base: Path, tmp: Path
                ) -> tuple[dict[str, Any], Any]:
    from tasks.training.train import _trainer, load_model, load_splits

    splits = load_splits(dataset, recipe.method, 8)
    loaded = load_model(recipe, base, cuda=False)
    model = loaded.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = _trainer(recipe, loaded, splits, tmp / "ck", False, [])
    trainer.train()
    return before, model


# The tiny Llama: 2 layers × 7 target modules × (lora_A, lora_B).
LORA_TENSORS = 2 * 7 * 2


def _only_lora_changed(model: Any, before: dict[str, Any]) -> None:
    """Every LoRA tensor moved (lora_B starts at zero, lora_A gets gradients once B is not
    zero), and not one element of a base weight did."""
    lora = {n for n, _ in model.named_parameters() if "lora_" in n}
    assert len(lora) == LORA_TENSORS
    assert {n for n, p in model.named_parameters() if p.requires_grad} == lora
    changed = {n for n, p in model.named_parameters() if not p.detach().equal(before[n])}
    assert changed == lora


def test_sft_learns_toy_task_and_only_lora_weights_change(tiny_base: Path, tmp_path: Path
                                                          ) -> None:
    from tasks.training.train import Loaded, eval_loss, load_splits

    data = sft_parquet(tmp_path / "toy.parquet")
    recipe = tiny_recipe(max_steps=20, learning_rate=1e-2)
    assert (recipe.method, recipe.max_length, recipe.beta) == ("sft", 64, 0.1)
    before, model = _train_tiny(recipe, data, tiny_base, tmp_path)
    _only_lora_changed(model, before)
    _, eval_rows = load_splits(data, "sft", 8)
    loaded = Loaded(model, _tokenizer(tiny_base))
    base_loss = eval_loss(loaded, eval_rows, recipe, None)
    new_loss = eval_loss(loaded, eval_rows, recipe, "default")
    assert new_loss < base_loss - 2.0, (base_loss, new_loss)  # learned, not noise


def _tokenizer(base: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base)


def test_dpo_trains_with_the_base_as_reference(tiny_base: Path, tmp_path: Path) -> None:
    from tasks.training.train import Loaded, eval_loss, load_splits

    data = dpo_parquet(tmp_path / "pairs.parquet")
    recipe = tiny_recipe("dpo", max_steps=8, learning_rate=1e-2)
    assert (recipe.method, recipe.max_length, recipe.beta) == ("dpo", 64, 0.1)
    _, model = _train_tiny(recipe, data, tiny_base, tmp_path)
    _, eval_rows = load_splits(data, "dpo", 8)
    loaded = Loaded(model, _tokenizer(tiny_base))
    base = eval_loss(loaded, eval_rows, recipe, None)
    new = eval_loss(loaded, eval_rows, recipe, "default")
    assert base == pytest.approx(math.log(2))  # policy == reference
    assert new < base


def test_qlora_4bit_path_on_cpu(tiny_base: Path, tmp_path: Path) -> None:
    before, model = _train_tiny(tiny_recipe(load_in_4bit=True, max_steps=3),
                                sft_parquet(tmp_path / "toy.parquet"), tiny_base, tmp_path)
    import bitsandbytes as bnb

    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) == 2 * 7  # every targeted base layer really is NF4
    _only_lora_changed(model, before)


# --- the flow: SmolLM2-135M, export, verify, register, promote -----------------------------------


def _count_calls(monkeypatch: pytest.MonkeyPatch, *names: str) -> Counter[str]:
    """Count calls of tasks.training.train functions, wherever the job or `train` call them."""
    import tasks.training.job as job_mod
    import tasks.training.train as train_mod

    calls: Counter[str] = Counter()
    for name in names:
        original = getattr(train_mod, name)

        def counted(*a: Any, _name: str = name, _f: Any = original, **k: Any) -> Any:
            calls[_name] += 1
            return _f(*a, **k)

        for mod in (train_mod, job_mod):
            monkeypatch.setattr(mod, name, counted)
    return calls


@pytest.mark.usefixtures("prefect_api")
def test_flow_trains_exports_verifies_and_promotes_then_reuses(
        base_cache: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client

    from flows.train import train
    from tasks.shared.slots import active_slots

    profile = train_profile(tmp_path, base_cache["cache"])
    data = sft_parquet(tmp_path / "toy.parquet")
    params = build_params(str(write_recipe(tmp_path)), {"dataset": str(data), "method": "sft",
                                                        "bucket": "engineering-pointsav"})
    calls = _count_calls(monkeypatch, "load_splits", "device_report")
    m = train(params=params, profile=str(profile))
    assert calls == {"load_splits": 1, "device_report": 1}  # one load, one report per run
    assert m.state == "done" and m.step == 4 and m.steps == 4
    assert m.verified is True and m.promoted is True, m.gate
    assert m.eval_loss < m.gate.eval_loss["base"]
    assert m.pairs.model_dump() == {"train": 40, "eval": 4}
    assert m.peak_mib > 100 and m.training["peak_kind"] == "rss"
    out = tmp_path / "state" / "artifacts" / "adapters" / m.name
    for f in ("adapter.gguf", "adapter.tar.gz", "loss.png", "losses.json", "verify.json",
              "peft/adapter_config.json", "peft/adapter_model.safetensors", "manifest.json"):
        assert (out / f).is_file(), f
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((out / "verify.json").read_text())
    assert report["differs_from_base"] and report["matches_peft"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["state"] == "done" and manifest["data_digest"] and manifest["created_by"]
    assert manifest["base"]["gguf"] and manifest["finished"] >= manifest["started"]
    store = ArtifactStore(tmp_path / "state" / "artifacts")
    assert store.pointer("engineering-pointsav").current == m.name
    assert store.serving("engineering-pointsav") == out / "adapter.gguf"
    assert active_slots() == 0
    with get_client(sync_client=True) as client:
        keys = {a.key for a in client.read_artifacts()}
    assert {"training-progress-engineering-pointsav", "training-loss-engineering-pointsav",
            "training-engineering-pointsav"} <= keys

    again = train(params=params, profile=str(profile))
    assert again.reused and again.name == m.name  # same data + params: no retraining

    # A stricter gate keeps the next adapter without promoting it; rollback goes back.
    strict = train_profile(tmp_path, base_cache["cache"], margin=0.9)
    kept = train(params=params, profile=str(strict), retrain=True)
    assert kept.state == "done" and not kept.promoted
    assert "does not beat" in kept.gate.reason
    assert store.pointer("engineering-pointsav").current == m.name
    store.promote(kept.name, "by hand")
    assert store.pointer("engineering-pointsav").current == kept.name
    assert store.rollback("engineering-pointsav").current == m.name


@pytest.mark.usefixtures("prefect_api")
def test_a_failed_verification_keeps_the_checkpoints_and_the_rerun_does_not_retrain(
        tiny_base: Path, base_cache: dict[str, Any], tmp_path: Path) -> None:
    """The adapter is trained on the tiny Llama but verified on SmolLM2's GGUF: llama.cpp
    refuses the shapes, the run fails after training. Before, the checkpoints were deleted
    as soon as training ended, so the next night started again from step 0."""
    from flows.train import train

    recipe = write_recipe(tmp_path, base_model=str(tiny_base), base_gguf=str(base_cache["f32"]),
                          export_gguf=True, save_steps=2)
    profile = train_profile(tmp_path, base_cache["cache"], recipe=recipe)
    params = build_params(str(recipe), {"dataset": str(sft_parquet(tmp_path / "toy.parquet")),
                                        "method": "sft", "bucket": "toy"})
    with pytest.raises(Exception, match="adapter not loaded"):
        train(params=params, profile=str(profile))
    store = ArtifactStore(tmp_path / "state" / "artifacts")
    [failed] = store.list("toy")
    assert failed.state == "failed" and failed.step == 4
    ckpts = sorted(p.name for p in store.checkpoint_dir(failed.run_digest).glob("checkpoint-*"))
    assert ckpts == ["checkpoint-2", "checkpoint-4"]
    with pytest.raises(Exception, match="adapter not loaded"):
        train(params=params, profile=str(profile))
    again = [m for m in store.list("toy") if m.name != failed.name]
    assert len(again) == 1 and again[0].state == "failed" and again[0].training is not None
    assert again[0].training["resumed_from"] == "checkpoint-4"  # resumed at the last step:
    assert again[0].checkpoint is None and again[0].step == 4  # no step trained, none saved


@pytest.mark.usefixtures("prefect_api")
def test_killed_training_resumes_from_its_checkpoint(tiny_base: Path, base_cache: dict[str, Any],
                                                     tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL

    recipe = write_recipe(tmp_path, save_steps=3, export_gguf=False,
                          sft={"max_steps": 60, "learning_rate": 0.005})
    profile = train_profile(tmp_path, base_cache["cache"], recipe=recipe)
    data = sft_parquet(tmp_path / "toy.parquet")
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PYTHONPATH": str(ROOT)}
    args = ("train", "--profile", str(profile), "--dataset", str(data), "--method", "sft",
            "--base-model", str(tiny_base), "--bucket", "toy")
    proc = cli_process(*args, env=env)
    ckpts = tmp_path / "state" / "artifacts" / "checkpoints"
    while not list(ckpts.glob("*/checkpoint-*/trainer_state.json")):  # (pytest's timeout bounds it)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The test harness's server runs no lease reaper: release the dead run's `gpu` slot the way
    # an operator would (`prefect gcl update gpu --active-slots 0`); a real server does it
    # itself when the 60 s lease runs out (tests/integration/test_teardown.py).
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit("gpu", GlobalConcurrencyLimitUpdate(active_slots=0))
    saved = max(int(p.parent.name.split("-")[1])
                for p in ckpts.glob("*/checkpoint-*/trainer_state.json"))
    assert 3 <= saved < 60

    rerun = cli_process(*args, env=env)
    out, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, out[-3000:]
    store = ArtifactStore(tmp_path / "state" / "artifacts")
    done = [m for m in store.list("toy") if m.state == "done"]
    assert len(done) == 1 and done[0].training is not None
    assert done[0].training["resumed_step"] >= saved
    assert done[0].training["resumed_from"] == f"checkpoint-{done[0].training['resumed_step']}"
    assert done[0].step == 60
    # kill -9 left it `running` (no chance to say, and the test server has no lease reaper to
    # crash its flow run); the rerun saw its process gone and marked it.
    killed = [m for m in store.list("toy") if m.state != "done"]
    assert len(killed) == 1 and killed[0].state == "failed"
    assert killed[0].owner is not None and killed[0].owner.pid == proc.pid
    assert killed[0].message.startswith(
        f"reconciled: its process {proc.pid} on {killed[0].owner.host} is gone (killed or "
        "crashed) while the job was running; was running at step ")


@pytest.mark.usefixtures("prefect_api")
def test_cancelled_training_saves_a_checkpoint_ends_cancelled_and_frees_the_slot(
        tiny_base: Path, base_cache: dict[str, Any], tmp_path: Path) -> None:
    """A real cancellation: the run is executed by a Prefect runner (`train.serve`), the
    API is asked to cancel, the runner SIGTERMs the run's process."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Cancelling

    from tasks.shared.slots import active_slots

    recipe = write_recipe(tmp_path, save_steps=4, export_gguf=False,
                          sft={"max_steps": 400, "learning_rate": 0.005})
    profile = train_profile(tmp_path, base_cache["cache"], recipe=recipe)
    params = build_params(str(recipe), {"dataset": str(sft_parquet(tmp_path / "toy.parquet")),
                                        "method": "sft", "bucket": "toy",
                                        "base_model": str(tiny_base)})
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()),
           "PYTHONPATH": str(ROOT), "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", "from flows.train import train; "
         "train.serve(name='cancel-test', print_starting_message=False)"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # the waits below end with the run or the server; pytest's timeout bounds them
        run = None
        while run is None:
            try:
                run = run_deployment("train/cancel-test", timeout=0, parameters={
                    "params": params.model_dump(), "profile": str(profile)})
            except Exception:  # noqa: BLE001 - the deployment is not registered yet
                assert server.poll() is None
                time.sleep(1)
        ckpts = tmp_path / "state" / "artifacts" / "checkpoints"
        with get_client(sync_client=True) as client:
            while not list(ckpts.glob("*/checkpoint-*/trainer_state.json")):
                assert not client.read_flow_run(run.id).state.is_final()
                time.sleep(0.5)
            client.set_flow_run_state(run.id, Cancelling(), force=True)
            while not (state := client.read_flow_run(run.id).state).is_final():
                time.sleep(1)
        assert state.is_cancelled(), state
        store = ArtifactStore(tmp_path / "state" / "artifacts")
        (m,) = store.list("toy")
        assert m.state == "cancelled", m
        last = max(int(p.parent.name.split("-")[1])
                   for p in ckpts.glob("*/checkpoint-*/trainer_state.json"))
        assert m.checkpoint is not None and m.checkpoint.step == last and 0 < last < 400
        assert last >= m.step - 1  # the step reached at the stop was checkpointed
        assert active_slots() == 0
    finally:
        server.terminate()
        try:
            out, _ = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            out, _ = server.communicate()
        print(out[-4000:])  # shown by pytest when the test fails
