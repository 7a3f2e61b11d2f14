"""Issue 23, finding 10: each profile keeps its own state, and $SLM_NIGHTLY_PROFILE makes a
profile (`gcp` on the orchestrator) the default of every `slm-nightly --profile` that has one;
finding 11: a section with `block` refuses the inline keys it would otherwise ignore."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from flows.cli import build_parser, main
from flows.cli.parsing import PROFILE_ENV
from tasks.shared.errors import ConfigError
from tests.support.paths import ROOT
from tests.support.profiles import toml_profile
from tests.support.weights import weights_args

# every subcommand whose --profile has a default, with that default
DEFAULTS = {
    ("run",): "local",
    ("graph", "stats"): "local",
    ("graph", "query", "MATCH (n) RETURN n"): "local",
    ("graph", "snapshot"): "local",
    ("graph", "restore"): "local",
    ("adapters", "list"): "local",
    ("adapters", "show", "a"): "local",
    ("adapters", "promote", "a"): "local",
    ("adapters", "rollback", "engineering-pointsav"): "local",
    ("adapters", "download", "a"): "local",
    ("train",): "local",
    ("status",): "local",
    ("preflight",): "gcp",
    ("node", "smoke"): "gcp",
    ("node", "prepare-weights"): "gcp",
}


@pytest.fixture(autouse=True)
def _no_profile_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_ENV, raising=False)


@pytest.mark.parametrize("argv", list(DEFAULTS), ids=" ".join)
def test_without_the_variable_each_command_keeps_its_shipped_default(argv: tuple[str, ...]
                                                                     ) -> None:
    assert build_parser().parse_args(list(argv)).profile == DEFAULTS[argv]


@pytest.mark.parametrize("argv", list(DEFAULTS), ids=" ".join)
def test_the_variable_is_the_default_and_an_explicit_profile_wins(
        argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(PROFILE_ENV, "gcp")
    args = build_parser().parse_args(list(argv))
    assert args.profile == "gcp" and type(args.profile) is str
    monkeypatch.setenv(PROFILE_ENV, "local")
    assert build_parser().parse_args(list(argv)).profile == "local"
    # --profile on the command line wins, even when it names the shipped default
    for explicit in (DEFAULTS[argv], str(tmp_path / "mine.toml")):
        monkeypatch.setenv(PROFILE_ENV, "elsewhere")
        assert build_parser().parse_args([*argv, "--profile", explicit]).profile == explicit


def test_the_orchestrator_case_adapters_and_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """What finding 10 saw: on the orchestrator `adapters promote` and `graph stats` must reach
    production's store and graph without `--profile gcp`."""
    monkeypatch.setenv(PROFILE_ENV, "gcp")
    parser = build_parser()
    assert parser.parse_args(["adapters", "promote", "x"]).profile == "gcp"
    assert parser.parse_args(["adapters", "rollback", "engineering-pointsav"]).profile == "gcp"
    assert parser.parse_args(["graph", "stats"]).profile == "gcp"
    assert parser.parse_args(["graph", "stats", "--profile", "local"]).profile == "local"
    monkeypatch.setenv(PROFILE_ENV, "")  # set but empty: as if unset
    assert parser.parse_args(["graph", "stats"]).profile == "local"


def test_scorecard_and_train_preflight_keep_no_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --profile they apply the production rules and the production node, on any
    machine: the variable does not change what they check."""
    monkeypatch.setenv(PROFILE_ENV, "local")
    parser = build_parser()
    assert parser.parse_args(["scorecard", "--corpus", "c"]).profile is None
    assert parser.parse_args(["train", "preflight"]).profile is None
    assert parser.parse_args(["train", "preflight", "--profile", "gcp"]).profile == "gcp"


def _profile_actions(parser: argparse.ArgumentParser, prog: str = "slm-nightly"
                     ) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out |= _profile_actions(sub, f"{prog} {name}")
        elif action.dest == "profile":
            out[prog] = action
    return out


def test_the_help_names_the_default_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROFILE_ENV, "gcp")  # the help and the reference never depend on it
    actions = _profile_actions(build_parser())
    assert actions["slm-nightly adapters promote"].help == (
        "profiles/NAME.toml or a path (default: $SLM_NIGHTLY_PROFILE when set, else local)")
    assert actions["slm-nightly preflight"].help == (
        "profiles/NAME.toml or a path (default: $SLM_NIGHTLY_PROFILE when set, else gcp)")
    assert actions["slm-nightly node prepare-weights"].help == (
        "profiles/NAME.toml or a path: [compute.node] paths and the [training] recipe's "
        "base_model (default: $SLM_NIGHTLY_PROFILE when set, else gcp)")
    assert actions["slm-nightly adapters promote"].default == "local"
    for prog, action in actions.items():
        if action.default is None:
            assert prog in ("slm-nightly scorecard", "slm-nightly train preflight")
            assert "$SLM_NIGHTLY_PROFILE does not apply" in (action.help or "")
        else:
            assert f"$SLM_NIGHTLY_PROFILE when set, else {action.default})" in (action.help or "")


def test_a_variable_that_names_no_profile_says_so(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(PROFILE_ENV, "gpc")
    assert main(["adapters", "list"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"slm-nightly: SLM_NIGHTLY_PROFILE='gpc' names no profile "
        f"({ROOT / 'profiles' / 'gpc.toml'} not found) — set it to one of ['gcp', 'local'] or a "
        "path to a .toml file, unset it, or pass --profile")


def test_the_gcp_and_local_profiles_keep_their_own_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shipped profiles, loaded: production's records never land in the local state."""
    from pydantic import SecretStr

    from blocks.graph import Neo4jGraph
    from tasks.profile import load_profile
    from tasks.status import records_place

    def saved(cls: Any, name: str) -> Neo4jGraph:  # the saved 'slm-neo4j', without a server
        assert name == "slm-neo4j"
        return Neo4jGraph(uri="neo4j://graph.internal:7687", password=SecretStr("pw"))

    monkeypatch.setattr(Neo4jGraph, "load", classmethod(saved))
    monkeypatch.delenv("SLM_YOYO_WEIGHTS_GCS_BUCKET", raising=False)
    local, gcp = load_profile("local"), load_profile("gcp")
    assert local.state_dir == ROOT / ".slm-nightly"
    assert gcp.state_dir == ROOT / ".slm-nightly-gcp"
    assert gcp.compute.state_dir == str(ROOT / ".slm-nightly-gcp")
    assert gcp.training.artifact_store == str(ROOT / ".slm-nightly-gcp" / "artifacts")
    assert local.training.artifact_store == str(ROOT / ".slm-nightly" / "artifacts")
    # `slm-nightly status` reads the same folders
    assert records_place("gcp").state_dir == gcp.state_dir
    assert records_place("local").state_dir == local.state_dir
    assert ".slm-nightly-gcp/" in (ROOT / ".gitignore").read_text().splitlines()


# --- finding 11: a saved block is the whole section ------------------------------------------

SLUGS = {"compute": "slm-gce-compute", "inference": "slm-inference-endpoint",
         "graph": "slm-neo4j-graph", "sources": "slm-document-sources",
         "serving": "slm-serving-endpoint"}
TABLES: dict[str, dict[str, Any]] = {
    "compute": {"type": "gce", "block": "slm-gce", "zone": "us-central1-b",
                "node": {"model_path": "/opt/models/m.gguf"}},
    "inference": {"block": "slm-engine", "model": "olmo", "max_concurrent_requests": 8},
    "graph": {"type": "neo4j", "block": "slm-neo4j", "uri": "neo4j://elsewhere:7687"},
    "sources": {"block": "slm-docs", "transcripts": "/srv/t"},
    "serving": {"block": "slm-serving", "base_url": "http://s:8000"},
}


@pytest.mark.parametrize("section", list(TABLES))
def test_a_saved_block_with_other_keys_is_refused_naming_them(section: str,
                                                              tmp_path: Path) -> None:
    from tasks.profile import load_profile

    path = toml_profile(tmp_path / "p.toml", state_dir=tmp_path / "state",
                        **{section: TABLES[section]})
    ignored = sorted(set(TABLES[section]) - {"type", "block"})
    with pytest.raises(ConfigError) as e:
        load_profile(str(path))  # refused before any block loads: no Prefect API here
    assert str(e.value) == (
        f"profile {path}: [{section}] loads the saved block "
        f"'{SLUGS[section]}/{TABLES[section]['block']}' and would ignore its other key(s) "
        f"{ignored} — put those fields in the saved block, or remove `block` to build "
        f"[{section}] from the inline keys")


def test_the_shipped_gcp_comment_names_the_rule() -> None:
    text = (ROOT / "profiles" / "gcp.toml").read_text()
    assert "a key left beside `block` is refused, not ignored" in text


def test_prepare_weights_with_a_saved_block_and_inline_node_keys_is_refused(
        tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.image.cli import cli_main

    path = toml_profile(tmp_path / "p.toml", compute=TABLES["compute"])
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}), \
            pytest.raises(ConfigError) as e:
        cli_main(weights_args("--profile", str(path), "--check"))
    assert str(e.value) == (
        f"profile {path}: [compute] loads the saved block 'slm-gce-compute/slm-gce' and would "
        "ignore its other key(s) ['node', 'zone'] — put those fields in the saved block, or "
        "remove `block` to build [compute] from the inline keys")


def test_prepare_weights_with_a_saved_block_needs_the_prefect_api(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.image.cli import cli_main

    path = toml_profile(tmp_path / "p.toml", compute={"type": "gce", "block": "slm-gce"})
    with temporary_settings(restore_defaults={PREFECT_API_URL}), \
            pytest.raises(ConfigError) as e:
        cli_main(weights_args("--profile", str(path), "--check"))
    assert str(e.value) == (
        f"profile {path}: [compute] is the saved block 'slm-gce' and PREFECT_API_URL is not "
        "set — set PREFECT_API_URL to the server it is saved on (under sudo: `sudo env "
        "PREFECT_API_URL=… slm-nightly node prepare-weights …`), or write the [compute.node] "
        "keys in the profile")
