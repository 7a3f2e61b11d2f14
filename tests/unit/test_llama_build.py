"""llama.cpp's build: the flags (a portable x86-64 baseline, never -march=native), the cache key
they make, where the cache lives, and what the check reads off the library."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks import llama_build as lb
from tasks import llama_cpp as lc
from tasks.errors import ConfigError
from tasks.paths import PROJECT_ROOT


def test_the_cpu_build_is_the_baseline_and_never_native() -> None:
    f = lb.flags("cpu")
    assert "-DGGML_NATIVE=OFF" in f
    on = {x.removeprefix("-D").removesuffix("=ON") for x in f if x.endswith("=ON")}
    assert on == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}
    # every wider x86 extension is named off, so a change of ggml's defaults cannot add it
    for ext in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI", "AMX_TILE",
                "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{ext}=OFF" in f
    assert not any("march" in x or "NATIVE=ON" in x for x in f)


def test_the_cuda_build_keeps_the_cpu_baseline() -> None:
    assert lb.flags("cuda") == [*lb.flags("cpu"), "-DGGML_CUDA=on"]
    assert lb.flags() == lb.flags("cpu") and lb.build_key("0.3.36") == lb.build_key(
        "0.3.36", "cpu")
    with pytest.raises(ConfigError, match="unknown llama.cpp build variant 'rocm'.*cpu, cuda"):
        lb.flags("rocm")


def test_the_key_changes_with_the_pin_the_flags_and_the_machine() -> None:
    key = lb.build_key("0.3.36", "cpu", "x86_64")
    # The key of the wheel every development machine has cached (its folder in
    # ~/.cache/slm-nightly/llama-cpp-python, built 2026-12-01): when this changes, every
    # machine compiles llama.cpp again — do it on purpose (new flags, a new pin), never by a
    # refactor.
    assert key == "e2024beca8c7d77d"
    others = {lb.build_key("0.3.37", "cpu", "x86_64"), lb.build_key("0.3.36", "cuda", "x86_64"),
              lb.build_key("0.3.36", "cpu", "aarch64")}
    assert key not in others and len(others) == 3


def test_a_change_of_flags_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = lb.build_key("0.3.36", "cpu", "x86_64")
    monkeypatch.setattr(lb, "BASELINE", (*lb.BASELINE[:-1], "-DGGML_AMX_BF16=ON"))
    assert lb.build_key("0.3.36", "cpu", "x86_64") != before


def test_the_pin_is_read_from_pyproject(tmp_path: Path) -> None:
    p = tmp_path / "pyproject.toml"
    p.write_text('[project]\ndependencies = ["prefect==3.9.1", "llama-cpp-python[server]==0.3.36",'
                 ' "polars>=1.0"]\n')
    assert lb.pin(p) == "0.3.36"
    p.write_text('[project]\ndependencies = ["llama-cpp-python[server] == 0.3.37"]\n')
    assert lb.pin(p) == "0.3.37"
    p.write_text('[project]\ndependencies = ["llama-cpp-python>=0.3"]\n')
    with pytest.raises(ConfigError) as e:
        lb.pin(p)
    assert str(e.value) == (f"{p}: no `llama-cpp-python==VERSION` in [project] dependencies — "
                            "pin it exactly: the build cache is keyed by the pin")


def test_the_project_pin_is_the_one_in_pyproject() -> None:
    text = (PROJECT_ROOT / "pyproject.toml").read_text()
    assert f'"llama-cpp-python[server]=={lb.pin()}"' in text


def test_the_cache_lives_outside_the_checkout(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.delenv(lb.CACHE_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lb.cache_root() == tmp_path / "home" / ".cache" / "slm-nightly"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert lb.cache_root() == tmp_path / "xdg" / "slm-nightly"
    monkeypatch.setenv(lb.CACHE_ENV, str(tmp_path / "mine"))
    entry = lb.entry_dir("0.3.36", "cuda")
    assert entry == tmp_path / "mine" / "llama-cpp-python" / \
        f"0.3.36-cuda-{lb.build_key('0.3.36', 'cuda')}"
    assert lb.entry_dir("0.3.36") == tmp_path / "mine" / "llama-cpp-python" / \
        f"0.3.36-cpu-{lb.build_key('0.3.36', 'cpu')}"


def test_a_finished_entry_is_reused_without_building(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv(lb.CACHE_ENV, str(tmp_path))
    entry = lb.entry_dir("9.9.9", "cpu")
    entry.mkdir(parents=True)
    (entry / "build.json").write_text(json.dumps({"key": lb.build_key("9.9.9")}))
    assert lb.cached_wheel(entry) is None  # a record without its wheel: nothing to install
    (entry / "build.json").unlink()
    wheel = entry / "llama_cpp_python-9.9.9-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"PK")
    # no build.json: an interrupted build, not a cache hit
    assert lb.cached_wheel(entry) is None
    (entry / "build.json").write_text(json.dumps({"key": lb.build_key("9.9.9")}))

    def no_pip(*a: object, **k: object) -> None:
        raise AssertionError("built although the cache holds the wheel")

    monkeypatch.setattr(lb, "_run_logged", no_pip)
    assert lb.build("9.9.9", "cpu") == wheel


def test_features_are_the_ones_compiled_in() -> None:
    info = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
            "AVX512 = 0 | AMX_INT8 = 0 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
    assert lc.features(info) == {"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2",
                                 "LLAMAFILE", "OPENMP", "REPACK"}
    assert lc.features("CPU : AVX512 = 1 | AMX_INT8 = 1 |") == {"AVX512", "AMX_INT8"}


def test_the_server_build_is_the_same_baseline_static_and_without_the_web_ui() -> None:
    f = lb.server_flags("cpu")
    assert f[:len(lb.BASELINE)] == list(lb.BASELINE)
    assert {"-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"} <= set(f)
    assert lb.server_flags("cuda") == [*f, "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=89"]
    with pytest.raises(ConfigError, match="unknown llama.cpp build variant 'rocm'"):
        lb.server_flags("rocm")
    # The key of the llama-server every development machine has cached (built 2026-12-01):
    # when it changes every machine compiles the server again — on purpose only.
    key = lb.server_key("0.3.36", "cpu", "x86_64")
    assert key == "9dab24fd3b97e31f"
    assert key != lb.build_key("0.3.36", "cpu", "x86_64")
    assert len({key, lb.server_key("0.3.37", "cpu", "x86_64"),
                lb.server_key("0.3.36", "cuda", "x86_64")}) == 3


def test_a_finished_server_entry_is_reused_and_the_binary_found(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(lb.CACHE_ENV, str(tmp_path / "cache"))
    entry = lb.server_entry("9.9.9")
    assert entry == tmp_path / "cache" / "llama-server" / \
        f"9.9.9-cpu-{lb.server_key('9.9.9')}"
    entry.mkdir(parents=True)
    (entry / "llama-server").write_bytes(b"\x7fELF")
    assert lb.cached_server(entry) is None  # no build.json: an interrupted build
    (entry / "build.json").write_text("{}")
    assert lb.cached_server(entry) == entry / "llama-server"
    monkeypatch.setattr(lb, "_run_logged", lambda *a, **k: pytest.fail("built again"))
    assert lb.build_server("9.9.9") == entry / "llama-server"

    monkeypatch.delenv(lc.SERVER_ENV, raising=False)
    assert lc.server_path(tmp_path / "venv") == tmp_path / "venv" / "bin" / "llama-server"
    with pytest.raises(ConfigError) as e:
        lc.require_server(tmp_path / "venv")
    assert str(e.value) == (f"llama-server: {tmp_path}/venv/bin/llama-server is not installed — "
                            "run `make` (or `python -m tasks.llama_build install`; `--variant "
                            "cuda` on a GPU node)")
    monkeypatch.setenv(lc.SERVER_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"\$SLM_LLAMA_SERVER points at .*/nowhere, which is "
                                          "not an executable file"):
        lc.require_server()


def test_the_installed_server_is_executable_and_replaced_only_when_it_differs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # Stop 30's CI: install copied the binary through files.replacing, whose chmod gave it
    # the mode of an ordinary new file (0644), and `make`'s check then found no llama-server.
    import os

    from tasks.files import file_sha256

    monkeypatch.setenv(lb.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(lc.SERVER_ENV, raising=False)
    monkeypatch.setattr(lb, "pin", lambda: "9.9.9")
    entry = lb.server_entry("9.9.9")
    entry.mkdir(parents=True)
    binary = entry / "llama-server"
    binary.write_bytes(b"#!/bin/sh\necho built\n")
    binary.chmod(0o755)
    (entry / "build.json").write_text(json.dumps({"key": "k1", "sha256": file_sha256(binary)}))
    umask = os.umask(0o022)
    try:
        rec = lb.install_server(prefix=tmp_path / "venv")
        dest = tmp_path / "venv" / "bin" / "llama-server"
        assert rec["path"] == str(dest)
        assert dest.stat().st_mode & 0o777 == 0o755
        assert lc.require_server(tmp_path / "venv") == dest
        assert "installing llama-server (cpu, key k1)" in capsys.readouterr().out
        # an older, non-executable copy is replaced and made executable
        dest.write_bytes(b"old")
        dest.chmod(0o644)
        lb.install_server(prefix=tmp_path / "venv")
        assert dest.read_bytes() == binary.read_bytes()
        assert dest.stat().st_mode & 0o777 == 0o755
        lb.install_server(prefix=tmp_path / "venv")
        assert "already installed" in capsys.readouterr().out.splitlines()[-1]
    finally:
        os.umask(umask)
