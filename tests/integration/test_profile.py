import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.errors import ConfigError
from tasks.extraction.inputs import source_roots
from tasks.profile import load_profile
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


def test_importing_the_project_changes_no_environment_variable_and_the_cli_sets_its_defaults() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                        "PREFECT_SERVER_ANALYTICS_ENABLED", "DO_NOT_TRACK"}}
    code = ("import os\nbefore = dict(os.environ)\n"
            "import flows.nightly, flows.cli, flows.train, flows.reaper, blocks, tasks.graph.store\n"
            "print(sorted({k for k, _ in set(os.environ.items()) ^ set(before.items())}\n"
            "             - {'_RJEM_MALLOC_CONF'}))\n"  # Polars sets its jemalloc options itself

            )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.splitlines()
    assert out == ["[]"]
    # The CLI sets them before it first imports Prefect (whose settings are fixed on import).
    code = ("import flows.cli\ntry:\n    flows.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "from prefect.settings import get_current_settings as g\n"
            "s = g()\nprint(s.server.ephemeral.startup_timeout_seconds, s.server.analytics_enabled)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.splitlines()
    assert out[-1] == "120 False"


def test_cli_reports_config_errors_without_a_traceback(tmp_path: Path) -> None:
    bad = write(tmp_path, '[inference]\nmax_concurrent_requests = -1\n')
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--profile", bad],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "max_concurrent_requests" in proc.stderr and "Traceback" not in proc.stderr
