"""The installed llama.cpp as `make` leaves it: built by tasks/engine/llama_build.py for the x86-64
baseline (the library's own feature list and its machine code say so), installed from the
keyed cache without rebuilding, and checked by evaluating a prompt. A library that cannot
evaluate one (a stand-in that executes an illegal instruction, SIGILL) fails the check with the
signal, the library and its flags."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp
import pytest

from tasks.engine import llama_build as lb
from tasks.engine import llama_cpp as lc
from tests.support.paths import ROOT

LIB = Path(llama_cpp.__file__).parent / "lib"


def test_the_installed_library_is_the_baseline_build() -> None:
    rec = lc.installed_record()
    assert rec is not None, "llama-cpp-python was not installed by tasks.engine.llama_build"
    assert rec["cmake_args"] == " ".join(lb.flags("cpu"))
    assert rec["key"] == lb.build_key(lb.pin(), "cpu")
    res = lc.check()
    feats = lc.features(res["system_info"])
    assert {"AVX", "AVX2", "FMA", "F16C", "BMI2"} <= feats, feats
    assert not [f for f in feats if f.startswith(("AVX512", "AMX", "AVX_VNNI"))], feats
    assert res["tokens"] >= 200 and res["n_tokens"] == res["tokens"]
    assert res["lib"] == str(LIB)


def test_the_cpu_library_holds_no_amx_or_avx512_instruction() -> None:
    """No runtime-dispatched variant either: one CPU library, and not one AMX tile instruction
    (tileloadd, tdpbssd, ldtilecfg …) or 512-bit register in its code."""
    # one CPU backend: libggml-cpu.so and its versioned names (copies: a wheel holds no links),
    # no per-CPU variant (libggml-cpu-haswell.so, -sapphirerapids …)
    cpu = sorted(LIB.glob("libggml-cpu*"))
    assert {p.name.split(".so")[0] for p in cpu} == {"libggml-cpu"}, cpu
    assert len({p.read_bytes() for p in cpu}) == 1
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(cpu[0])],
                          capture_output=True, text=True, check=True).stdout
    assert "vfmadd" in code  # the disassembly is real: FMA is in the baseline
    for insn in ("tileloadd", "tdpb", "ldtilecfg", "%zmm"):
        assert insn not in code, insn


def test_an_unchanged_key_installs_nothing_again() -> None:
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tasks.engine.llama_build", "install"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"llama.cpp: llama-cpp-python {lb.pin()} (cpu, key "
                               f"{lb.build_key(lb.pin())}) already installed")
    assert time.monotonic() - started < 30


def test_a_fresh_environment_installs_the_cached_wheel_without_compiling(tmp_path: Path) -> None:
    """A fresh clone's new .venv on a machine that built this key once: pip installs the wheel
    from ~/.cache/slm-nightly, nothing compiles."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True)
    # pip from this environment, the package under test into the new one
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "tasks.engine.llama_build", "install"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "building" not in r.stdout and "compiling" not in r.stdout
    assert f"llama.cpp: installing llama_cpp_python-{lb.pin()}-" in r.stdout
    record = lc.record_path(venv)
    assert record.is_file() and lb.build_key(lb.pin()) in record.read_text()


def test_a_library_that_dies_with_sigill_fails_the_check(sigill_preload: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", sigill_preload)
    with pytest.raises(lc.BuildError) as e:
        lc.check()
    msg = str(e.value)
    assert msg.startswith("llama.cpp crashed with signal 4 (SIGILL) evaluating a prompt of a "
                          "few hundred tokens with SmolLM2-135M-Instruct.Q4_1.gguf")
    assert f"\n  library: {LIB / 'libggml-cpu.so'}\n" in msg
    assert f"\n  built with: {' '.join(lb.flags('cpu'))}\n" in msg
    assert f"\n  LD_PRELOAD: {sigill_preload}" in msg
    assert "python -m tasks.engine.llama_build install --rebuild" in msg


def test_the_make_step_fails_at_once_with_the_reason(sigill_preload: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tasks.engine.llama_build", "check"], cwd=ROOT,
                       env={**os.environ, "LD_PRELOAD": sigill_preload},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert r.stderr.startswith("error: llama.cpp crashed with signal 4 (SIGILL)")
    ok = subprocess.run([sys.executable, "-m", "tasks.engine.llama_build", "check"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("llama.cpp check: evaluated ")
    assert "\nllama.cpp check: llama-server answered a 359-token prompt (" in ok.stdout


def test_a_server_that_dies_with_sigill_fails_the_check(server_sigill_preload: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine binary is checked too: a llama-server that dies on its first prompt fails
    `make` with the signal (the recv stand-in of tests/integration/conftest.py)."""
    monkeypatch.setenv("LD_PRELOAD", server_sigill_preload)
    with pytest.raises(lc.BuildError) as e:
        lc.check_server()
    assert str(e.value).startswith(f"{lc.server_path()} died (signal 4 (SIGILL)) evaluating a "
                                   "prompt of a few hundred tokens with "
                                   "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert str(e.value).endswith("fix: `python -m tasks.engine.llama_build install --rebuild`")
