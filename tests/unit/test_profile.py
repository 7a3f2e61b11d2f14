"""Profiles as tasks/profile.py loads them: every block built from the shipped ones, paths taken
from the project root, and each mistake named with its fix. (The CLI's side:
tests/integration/test_profile.py.)"""

import os
from pathlib import Path

import pytest

from tasks.extraction.inputs import source_roots
from tasks.profile import load_profile
from tasks.shared.errors import ConfigError
from tests.support.paths import ROOT


def write(tmp: Path, text: str) -> str:
    p = tmp / "p.toml"
    p.write_text(text)
    return str(p)


def test_local_profile_builds_every_block() -> None:
    os.chdir(ROOT)
    p = load_profile("local")
    assert p.inference.dialect == "llama.cpp" and p.inference.base_url is None
    assert p.graph.describe().startswith("FalkorDB graph 'slm' (embedded")
    assert set(source_roots(p.sources)) == {"transcripts", "research", "contacts"}
    assert p.compute.state_dir == str(ROOT / ".slm-nightly")


def test_profiles_resolve_the_same_from_another_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name finds profiles/NAME.toml, and relative paths inside any profile are taken from the
    project root, wherever the command runs."""
    monkeypatch.chdir(tmp_path)
    p = load_profile("local")
    assert p.path == ROOT / "profiles" / "local.toml"
    assert p.state_dir == ROOT / ".slm-nightly"
    assert p.compute.state_dir == str(ROOT / ".slm-nightly")
    assert p.graph.data_dir == str(ROOT / ".slm-nightly" / "graph")
    assert source_roots(p.sources) == {s: ROOT / "examples" / s
                                 for s in ("transcripts", "research", "contacts")}
    assert p.corpus.root == str(ROOT / "examples" / "corpus")
    assert p.training.artifact_store == str(ROOT / ".slm-nightly" / "artifacts")
    # a profile elsewhere: its relative paths still mean the project's; absolute ones stay
    other = load_profile(write(tmp_path, f'state_dir = "{tmp_path}/s"\n'
                                         '[corpus]\nroot = "examples/corpus"\n'
                                         '[training]\nmodel_cache = "~/models"\n'))
    assert other.state_dir == tmp_path / "s"
    assert other.compute.state_dir == str(tmp_path / "s")
    assert other.corpus.root == str(ROOT / "examples" / "corpus")
    assert other.training.model_cache == str(Path.home() / "models")
    with pytest.raises(ConfigError, match="one of \\['gcp', 'local'\\]"):
        load_profile("nope")


@pytest.mark.parametrize(("text", "needles"), [
    ('[inference]\nmax_concurrent_requests = 0\n',
     ["[inference]", "max_concurrent_requests", "greater than or equal to 1", "Fix the field"]),
    ('[inference]\ndialect = "tgi"\n', ["dialect", "'vllm', 'llama.cpp' or 'openai'"]),
    ('[inference]\nbase_url = "localhost:9080"\n', ["base_url", "must start with http://"]),
    ('[inference]\nmax_output_tokens = 3000\ncontext_tokens = 4096\n',
     ["max_output_tokens (3000) must be under half of context_tokens"]),
    ('[inference]\nmax_concurent_requests = 4\n', ["unknown field(s) ['max_concurent_requests']"]),
    ('[graph]\ntype = "neo4j"\nuri = "http://db:7474"\n', ["uri", "bolt:// or neo4j://"]),
    ('[graph]\ntype = "postgres"\n', ["type 'postgres' is not one of ['falkordb', 'neo4j']"]),
    ('[extraction]\nmax_failed_share = 2\n', ["[extraction]", "max_failed_share"]),
    ('[nonsense]\n', ["unknown section(s) ['nonsense']"]),
    ('[inference\n', ["not valid TOML"]),
])
def test_invalid_fields_name_the_field_and_the_fix(tmp_path: Path, text: str,
                                                   needles: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        load_profile(write(tmp_path, text))
    for n in needles:
        assert n in str(e.value)


def test_missing_profile_and_missing_source_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found — pass a path"):
        load_profile(str(tmp_path / "nope.toml"))
    p = load_profile(write(tmp_path, f'[sources]\ntranscripts = "{tmp_path}/missing"\n'))
    with pytest.raises(ConfigError, match="sources.transcripts: folder .*missing does not exist"):
        source_roots(p.sources)


def test_secrets_are_secret_fields(tmp_path: Path) -> None:
    p = load_profile(write(tmp_path, '[inference]\napi_key = "sk-very-secret"\n'
                                     '[graph]\ntype = "neo4j"\npassword = "pw-very-secret"\n'))
    assert "sk-very-secret" not in repr(p.inference) and "pw-very-secret" not in repr(p.graph)
    assert p.inference.api_key is not None
    assert p.inference.api_key.get_secret_value() == "sk-very-secret"
