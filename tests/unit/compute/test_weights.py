"""The weights command (tasks/image/cli.py) as a command line: the node's paths
and the base model come from the profile's TOML and its recipe (no saved block, no Prefect API),
and nothing is copied or loaded when there is nothing to check. The building and checking
themselves are tests/integration/test_weights.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tasks.image.cli import add_arguments, cli_main
from tasks.image.layout import COMMAND, MANIFEST
from tasks.shared.errors import ConfigError
from tests.support.profiles import toml_profile

REPO = "allenai/Olmo-3-7B-Think"
GGUF_NAME = "Olmo-3-32B-Think-Q3_K_M.gguf"


def test_the_command_reads_the_profile_and_checks_without_a_manifest(tmp_path: Path,
                                                                     capsys: Any) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"base_model: {REPO}@main\nbase_gguf: {tmp_path}/opt/models/b.gguf\n")
    models = tmp_path / "opt/models"
    profile = toml_profile(tmp_path / "p.toml", compute={
        "type": "gce", "node": {"model_path": models / GGUF_NAME, "tokenizer": models / "tok",
                                "hf_home": tmp_path / "hf", "model_architecture": "olmo2"}},
        training={"recipe": recipe})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert cli_main(parser.parse_args(["--profile", str(profile), "--check"])) == 1
    assert capsys.readouterr().out.strip() == (
        f"FAILED  manifest: {models / MANIFEST} not found — build the folder with "
        f"`{COMMAND} --source …` first")
    with pytest.raises(ConfigError, match="needs --source"):
        cli_main(parser.parse_args(["--profile", str(profile)]))
    old = tmp_path / "old.toml"
    old.write_text('[compute]\ntype = "gce"\n[compute.vllm]\nmodel_path = "/m.gguf"\n')
    with pytest.raises(ConfigError, match=r"\[compute.vllm\] is now \[compute.node\]"):
        cli_main(parser.parse_args(["--profile", str(old), "--check"]))
