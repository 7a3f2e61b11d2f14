"""A quiet terminal: `slm-nightly run` shows the project's own lines (phases, documents, training
steps, the summary) and sends the libraries' output to the run's log file; `--verbose` shows
everything, as before.

The real CLI as `make run` starts it (its own temporary Prefect server, PREFECT_HOME under tmp),
the fake OpenAI server for extraction, the session's FalkorDB, and real training of one bucket
on SmolLM2-135M from a fresh model cache, where the library output comes from (FutureWarnings,
bitsandbytes' logger, Prefect's own engine lines; the training code itself silences llama.cpp's
tensor conversion and transformers' bars). ~3 min on 2 idle cores. Every kind of library output
(fd-level writes, llama.cpp's loader, tqdm, child processes) is routed in a fast test of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import FakeOpenAI
from tests.support.paths import ROOT
from tests.support.prefect import seeded
from tests.support.profiles import extraction_profile

SLM = str(Path(sys.executable).parent / "slm-nightly")
BUCKET = "engineering-pointsav"
# What libraries print and the project never does.
LIBRARY_LINES = {
    "llama.cpp's model loader": "llama_model_loader",
    "a Python warning": "Warning",
    "a tqdm bar": "it/s]",
    "Prefect's engine": "Finished in state",
}


# Each kind of output a run's libraries produce, the real way, inside route(): llama.cpp's
# loader through llama-cpp-python (vocabulary only: fast), a tqdm bar, a FutureWarning, a
# library logger, a child process and C code writing to fd 2, a library's print(); then a
# record logged from the project's code (compiled under tasks/, as get_run_logger() calls
# there are), one from Prefect's engine, and a CLI line.
ROUTED = """
import ctypes, logging, subprocess, sys, warnings
from pathlib import Path

import llama_cpp
from tqdm import tqdm

from tasks.engine.llama_cpp import default_model_path
from tasks.runtime import logs

with logs.route(Path(sys.argv[1]), verbose=sys.argv[2] == "verbose") as log:
    llama_cpp.Llama(model_path=str(default_model_path()), vocab_only=True, verbose=True)
    for _ in tqdm(range(3)):
        pass
    warnings.warn("an old API", FutureWarning)
    logging.getLogger("transformers.modeling_utils").warning("a library logger line")
    subprocess.run(["sh", "-c", "echo a child process line >&2"], check=True)
    ctypes.CDLL(None).write(2, b"a C-level line\\n", 15)
    print("a library print")
    exec(compile("logging.getLogger('prefect.engine').warning('our own line')",
                 str(logs.ROOT / "tasks" / "compute" / "node.py"), "exec"))
    logging.getLogger("prefect.engine").warning("Finished in state Completed()")
    print("a CLI line", file=log.out)
print(f"run log: {log.path}")
"""
ROUTED_LIBRARY = ["llama_model_loader", "print_info", "it/s]", "FutureWarning: an old API",
                  "a library logger line", "a child process line", "a C-level line",
                  "a library print", "Finished in state Completed()"]


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_route_sends_each_kind_of_library_output_to_the_log(tmp_path: Path, mode: str) -> None:
    r = subprocess.run([sys.executable, "-c", ROUTED, str(tmp_path), mode], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    terminal, log = r.stdout, run_log(r.stdout)
    assert log.parent == tmp_path / "runs"
    text = log.read_text()
    assert "our own line" in terminal and "a CLI line" in terminal
    assert ("our own line" in text) and ("a CLI line" not in text)
    for marker in ROUTED_LIBRARY:
        if mode == "quiet":
            assert marker not in terminal, terminal
            assert marker in text, f"no {marker!r} in the run log:\n{text[-3000:]}"
        else:  # as before the run log existed: all on the terminal
            assert marker in terminal, terminal


def profile(tmp: Path, fake: FakeOpenAI, falkordb: int, train: bool,
            model_cache: Path | None = None) -> Path:
    """Two short documents; with `train`, a corpus where only BUCKET passes (the other bucket
    is empty), so one adapter trains, with the local recipe cut to 2 SFT steps (on the
    session's dequantized SmolLM2, `model_cache`, where given)."""
    src = tmp / "docs"
    (src / "research").mkdir(parents=True)
    for i in range(2):
        (src / "research" / f"note-{i}.md").write_text(
            f"# Note {i}\n\nGrace Hopper met the compiler group on day {i}.\n")
    corpus = tmp / "corpus"
    shutil.copytree(ROOT / "examples" / "corpus" / BUCKET, corpus / BUCKET)
    (corpus / "apprenticeship-pointsav").mkdir()
    recipe = yaml.safe_load((ROOT / "recipes" / "local.yaml").read_text())
    recipe["sft"]["max_steps"] = 2
    (tmp / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    path = extraction_profile(tmp, base_url=fake.url, falkordb_port=falkordb,
                         graph=f"quiet_{tmp.name}"[:60].replace("-", "_"), sources=src,
                         request_timeout=30.0)
    path.write_text(path.read_text() + f"""
[corpus]
root = "{corpus}"
floor = 200

[training]
recipe = "{tmp / 'recipe.yaml'}"
enabled = {'true' if train else 'false'}
""" + (f'model_cache = "{model_cache}"\n' if model_cache else ""))
    return path


def run_cli(tmp: Path, *extra: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(seeded(tmp / "prefect-home")), PREFECT_LOGGING_LEVEL="INFO")
    r = subprocess.run([SLM, "run", "--profile", str(tmp / "profile.toml"), *extra], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1500)
    return r.returncode, r.stdout


def run_log(terminal: str) -> Path:
    found = re.findall(r"^run log: (\S+\.log)$", terminal, re.M)
    assert len(found) == 1, terminal[-3000:]
    return Path(found[0])


@pytest.mark.timeout(1800)  # measured 10+ min with six engineers' jobs on the 2 cores
def test_quiet_terminal_keeps_library_output_in_the_run_log_and_verbose_shows_it(
        tmp_path: Path, falkordb: int, base_cache: dict) -> None:
    with FakeOpenAI() as fake:
        quiet, verbose = tmp_path / "quiet", tmp_path / "verbose"
        for tmp in (quiet, verbose):
            tmp.mkdir()
            profile(tmp, fake, falkordb, train=tmp == quiet, model_cache=base_cache["cache"])

        code, terminal = run_cli(quiet)
        print(terminal)  # what a user sees (pytest -rP shows it)
        assert code == 0, terminal[-3000:]
        log = run_log(terminal)
        assert log.parent == quiet / "state" / "runs"
        text = log.read_text(errors="replace")
        for what, marker in LIBRARY_LINES.items():
            assert marker not in terminal, f"{what} on the terminal:\n{terminal}"
        # What this run's libraries still print (training silences llama.cpp's conversion and
        # transformers' bars at the source, tasks/training): the run log has it. Every other
        # kind: test_route_sends_each_kind_of_library_output_to_the_log.
        assert "FutureWarning" in text and "Finished in state Completed()" in text, text[-3000:]
        # The project's own lines stay: documents, the training steps, the summary.
        assert re.search(r"^\S+ \| INFO +\| .* 2/2 research/note-\d\.md — ok$", terminal, re.M), \
            terminal
        assert re.search(r"\| INFO +\| .* step 2/2 +loss ", terminal), terminal
        assert f"Training {BUCKET}: " in terminal and "Phases:" in terminal, terminal
        # 62 lines measured here (2 documents, one bucket trained, the summary).
        assert len(terminal.splitlines()) < 80, terminal

        # --verbose, without the (slow) training: Prefect's engine lines are the library
        # output left; test_route_sends_each_kind_of_library_output_to_the_log[verbose] has the
        # other kinds.
        code, terminal = run_cli(verbose, "--verbose")
        assert code == 0, terminal[-3000:]
        assert "Finished in state Completed()" in terminal, terminal
        assert "2/2 research/note-" in terminal, terminal
        assert run_log(terminal).parent == verbose / "state" / "runs"
