"""Issue 23, finding 11: `[compute]` switched to a saved GceCompute block, against the Prefect
test server. `slm-nightly node prepare-weights` and the guide's render snippet (§6 of
docs/operator-gcp.md, run as the guide writes it) read the loaded block's fields, not the raw
TOML; a saved block left at the default state_dir keeps its node record in the profile's own
state (finding 10)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from blocks.gce import GceCompute
from flows.cli import main
from tasks.image.layout import MANIFEST
from tasks.profile import load_profile
from tests.support.paths import ROOT
from tests.support.profiles import toml_profile
from tests.support.weights import BASE_GGUF, GGUF_NAME, REPO

pytestmark = pytest.mark.usefixtures("prefect_api")

GUIDE = ROOT / "docs" / "operator-gcp-appendix.md"
RENDER = ".venv/bin/python - <<'PY'\n"


def _save(name: str, root: Path, **fields: Any) -> None:
    GceCompute(project="my-project", zone="zone-a", instance="slm-node", inference_port=9191,
               node={"model_path": str(root / "opt/models" / GGUF_NAME),
                     "tokenizer": str(root / "opt/models/Olmo-3-32B-Think"),
                     "hf_home": str(root / "opt/slm-hf"), "model_architecture": "olmo2",
                     "project_dir": "/srv/checkout", "work_pool": "slm-node",
                     "prefect_api_url": "http://10.0.0.2:4200/api"},
               **fields).save(name, overwrite=True)


def _profile(tmp: Path, block: str, recipe: Path | None = None) -> Path:
    return toml_profile(tmp / "gcp.toml", state_dir=tmp / "state",
                        compute={"type": "gce", "block": block},
                        inference={"dialect": "llama.cpp", "model": "olmo-3-32b-think"},
                        training={"recipe": recipe} if recipe else None)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_prepare_weights_builds_where_the_saved_block_says(
        source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    node = tmp_path / "node"
    _save("weights-node", node)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"base_model: {REPO}@main\nbase_gguf: {node / 'opt/models' / BASE_GGUF}\n")
    profile = _profile(tmp_path, "weights-node", recipe)
    argv = ["node", "prepare-weights", "--profile", str(profile)]

    assert main([*argv, "--check"]) == 1  # nothing built yet: the block's model folder
    assert capsys.readouterr().out.strip().startswith(
        f"FAILED  manifest: {node / 'opt/models' / MANIFEST} not found")
    assert main([*argv, "--source", str(source), "--json"]) == 0
    capsys.readouterr()
    assert _sha(node / "opt/models" / GGUF_NAME) == _sha(source / GGUF_NAME)
    assert (node / "opt/models/Olmo-3-32B-Think/tokenizer.json").is_file()
    assert (node / "opt/slm-hf/hub/models--allenai--Olmo-3-7B-Think/refs/main").is_file()
    assert main([*argv, "--check"]) == 0
    assert "FAILED" not in capsys.readouterr().out


def test_prepare_weights_refuses_a_saved_block_that_is_not_a_gce_node(tmp_path: Path) -> None:
    from blocks.compute import LocalCompute
    from tasks.image.cli import cli_main
    from tasks.shared.errors import ConfigError
    from tests.support.weights import weights_args

    LocalCompute().save("weights-local", overwrite=True)
    profile = toml_profile(tmp_path / "p.toml", compute={"type": "local",
                                                         "block": "weights-local"})
    with pytest.raises(ConfigError) as e:
        cli_main(weights_args("--profile", str(profile), "--check"))
    assert str(e.value) == (
        f"profile {profile}: [compute] is the saved block 'weights-local', a LocalCompute with "
        "no node settings — slm-nightly node prepare-weights builds a GCE node's model folder: "
        "name a saved GceCompute block (type = \"gce\")")


def test_the_guides_render_snippet_reads_the_saved_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = GUIDE.read_text()
    assert RENDER in text, "docs/operator-gcp.md: the render snippet (§6) is gone"
    snippet = text[text.index(RENDER) + len(RENDER):]
    snippet = snippet[:snippet.index("\nPY\n")]
    assert 'load_profile("gcp")' in snippet
    _save("render-node", tmp_path / "node")
    profile = _profile(tmp_path, "render-node")
    monkeypatch.chdir(tmp_path)
    exec(snippet.replace('load_profile("gcp")', f"load_profile({str(profile)!r})"), {})
    script = (tmp_path / "startup.sh").read_text()
    assert str(tmp_path / "node" / "opt/models" / GGUF_NAME) in script  # the block's node
    assert "9191" in script  # the block's inference_port
    assert "http://10.0.0.2:4200/api" in script and "/srv/checkout/.venv/bin/prefect" in script


def test_a_saved_compute_block_keeps_its_records_in_the_profiles_state(tmp_path: Path) -> None:
    _save("state-default", tmp_path / "node")
    _save("state-own", tmp_path / "node", state_dir=str(tmp_path / "own"))
    default = load_profile(str(_profile(tmp_path, "state-default")))
    assert default.compute.state_dir == str(tmp_path / "state") == str(default.state_dir)
    assert default.compute.node.model_path == str(tmp_path / "node/opt/models" / GGUF_NAME)
    own = load_profile(str(_profile(tmp_path, "state-own")))
    assert own.compute.state_dir == str(tmp_path / "own")  # saved on purpose: kept
