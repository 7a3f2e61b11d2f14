"""llama.cpp's build: the flags (a portable x86-64 baseline, never -march=native), the cache key
they make, where the cache lives, and what the check reads off the library."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from tasks.engine import llama_build as lb
from tasks.engine import llama_cpp as lc
from tasks.shared.errors import ConfigError
from tasks.shared.paths import PROJECT_ROOT


def test_the_cpu_build_is_the_baseline_and_never_native() -> None:
    f = lb.flags("cpu")
    assert "-DGGML_NATIVE=OFF" in f
    on = {x.removeprefix("-D").removesuffix("=ON") for x in f
          if x.endswith("=ON") and x.startswith("-DGGML_")}
    assert on == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}
    # every wider x86 extension is named off, so a change of ggml's defaults cannot add it
    for ext in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI", "AMX_TILE",
                "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{ext}=OFF" in f
    assert not any("march" in x or "NATIVE=ON" in x for x in f)


# `nvcc --version` of CUDA 12.8 (its first line to its last), as the toolkit prints it
NVCC_12_8 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""


@pytest.fixture
def cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in nvcc named by $CUDACXX: its --version, and nvcc's refusal of anything else
    (what nvcc prints with no input file)."""
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"#!/bin/sh\nif [ \"$*\" = --version ]; then cat <<'EOF'\n{NVCC_12_8}EOF\n"
                    "else echo 'nvcc fatal   : No input files specified; use option --help for "
                    "more information' >&2; exit 1; fi\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(fake))
    return fake


def test_the_cuda_build_keeps_the_cpu_baseline(cuda: Path) -> None:
    assert lb.flags("cuda") == [*lb.flags("cpu"), "-DGGML_CUDA=ON",
                                "-DCMAKE_CUDA_ARCHITECTURES=89",
                                f"-DCMAKE_CUDA_COMPILER={cuda}"]
    assert lb.flags() == lb.flags("cpu") and lb.build_key("0.3.36") == lb.build_key(
        "0.3.36", "cpu")
    with pytest.raises(ConfigError, match="unknown llama.cpp build variant 'rocm'.*cpu, cuda"):
        lb.flags("rocm")


def test_the_cuda_key_names_the_compiler_and_its_release(cuda: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert lb.cuda_release(cuda) == "12.8.93"
    key = lb.build_key("0.3.36", "cuda", "x86_64")
    cuda.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    assert lb.build_key("0.3.36", "cuda", "x86_64") != key  # another toolkit: another build
    assert lb.build_key("0.3.36", "cpu", "x86_64") == "840c3259b4047677"  # the CPU's: as it was
    cuda.write_text("#!/bin/sh\necho 'gcc (Debian 12.2.0-14) 12.2.0'\n")
    with pytest.raises(ConfigError, match="printed no release .* is it NVIDIA's nvcc"):
        lb.build_key("0.3.36", "cuda", "x86_64")
    monkeypatch.setenv("CUDACXX", str(cuda.parent / "missing"))
    with pytest.raises(ConfigError, match=r"no CUDA compiler at .*/missing — install the CUDA "
                                          "toolkit .* or set CUDACXX"):
        lb.flags("cuda")


def test_without_cudacxx_the_compiler_is_nvcc_on_path_else_the_toolkits_own(
        cuda: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sudo` resets PATH (ggml-org/llama.cpp#13527): nvcc is found on PATH when it is there,
    else where NVIDIA's installer puts it, and named to CMake either way."""
    monkeypatch.delenv("CUDACXX")
    monkeypatch.setenv("PATH", f"{cuda.parent}:/usr/bin:/bin")
    assert lb.nvcc() == cuda
    installed = tmp_path / "usr-local-cuda" / "bin" / "nvcc"
    installed.parent.mkdir(parents=True)
    installed.write_text(cuda.read_text())
    installed.chmod(0o755)
    monkeypatch.setattr(lb, "CUDA_NVCC", installed)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # what sudo's secure_path leaves
    assert lb.nvcc() == installed
    assert lb.flags("cuda")[-1] == f"-DCMAKE_CUDA_COMPILER={installed}"
    installed.chmod(0o644)  # there, but not executable
    with pytest.raises(ConfigError, match=f"no CUDA compiler at {installed} "):
        lb.nvcc()
    cuda.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n")
    with pytest.raises(ConfigError) as e:
        lb.cuda_release(cuda)
    assert str(e.value) == (f"llama.cpp cuda build: {cuda} --version printed no release "
                            "(\'nvcc: NVIDIA (R) Cuda compiler driver\') — is it NVIDIA's nvcc?")


def test_the_key_changes_with_the_pin_the_flags_and_the_machine(cuda: Path) -> None:
    key = lb.build_key("0.3.36", "cpu", "x86_64")
    # The key of the build every development machine has cached (its folder in
    # ~/.cache/slm-nightly/llama-cpp-python: the wheel with its libraries and llama-server,
    # built once since issue 36): when this changes, every machine compiles llama.cpp again —
    # do it on purpose (new flags, a new pin), never by a refactor.
    assert key == "840c3259b4047677"
    others = {lb.build_key("0.3.37", "cpu", "x86_64"), lb.build_key("0.3.36", "cuda", "x86_64"),
              lb.build_key("0.3.36", "cpu", "aarch64")}
    assert key not in others and len(others) == 3


def test_a_change_of_flags_targets_or_wheel_args_changes_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = lb.build_key("0.3.36", "cpu", "x86_64")
    with monkeypatch.context() as m:
        m.setattr(lb, "BASELINE", (*lb.BASELINE[:-1], "-DGGML_AMX_BF16=ON"))
        assert lb.build_key("0.3.36", "cpu", "x86_64") != before
    with monkeypatch.context() as m:
        m.setattr(lb, "TARGETS", ("llama",))
        assert lb.build_key("0.3.36", "cpu", "x86_64") != before
    with monkeypatch.context() as m:
        m.setattr(lb, "WHEEL_CMAKE_ARGS", "-DLLAMA_BUILD=OFF")
        assert lb.build_key("0.3.36", "cpu", "x86_64") != before
    assert lb.build_key("0.3.36", "cpu", "x86_64") == before


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
                                              tmp_path: Path, cuda: Path) -> None:
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


def test_one_build_makes_shared_libraries_that_find_each_other_and_the_server() -> None:
    f = lb.flags("cpu")
    assert f[:len(lb.BASELINE)] == list(lb.BASELINE)
    # shared, as llama_cpp loads them; $ORIGIN run paths so nothing needs LD_LIBRARY_PATH
    assert {"-DBUILD_SHARED_LIBS=ON", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
            "-DCMAKE_INSTALL_RPATH=$ORIGIN", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"} <= set(f)
    assert "-DBUILD_SHARED_LIBS=OFF" not in f
    assert lb.TARGETS == ("llama", "llama-server")
    # llama-cpp-python's own CMake compiles nothing: its bundled build is off
    assert lb.WHEEL_CMAKE_ARGS == "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
    with pytest.raises(ConfigError, match="unknown llama.cpp build variant 'rocm'"):
        lb.flags("rocm")


def test_the_wheel_gets_the_built_files_with_their_modes_and_record_lines(
        tmp_path: Path) -> None:
    wheel = tmp_path / "llama_cpp_python-9.9.9-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_cpp/__init__.py", "x = 1\n")
        z.writestr("llama_cpp_python-9.9.9.dist-info/RECORD",
                   "llama_cpp/__init__.py,sha256=abc,6\n"
                   "llama_cpp_python-9.9.9.dist-info/RECORD,,\n")
    lib = tmp_path / "libllama.so"
    lib.write_bytes(b"\x7fELF-lib")
    lib.chmod(0o644)
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF-server")
    server.chmod(0o755)
    lb.add_to_wheel(wheel, {"llama_cpp/lib/libllama.so": lib,
                            "llama_cpp/lib/llama-server": server})
    with zipfile.ZipFile(wheel) as z:
        assert z.read("llama_cpp/lib/llama-server") == b"\x7fELF-server"
        assert (z.getinfo("llama_cpp/lib/llama-server").external_attr >> 16) & 0o777 == 0o755
        assert (z.getinfo("llama_cpp/lib/libllama.so").external_attr >> 16) & 0o777 == 0o644
        record = z.read("llama_cpp_python-9.9.9.dist-info/RECORD").decode().splitlines()
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"\x7fELF-lib").digest()).rstrip(b"=")
    # the old lines kept, the new ones before RECORD's own line (which stays last)
    assert record == ["llama_cpp/__init__.py,sha256=abc,6",
                      f"llama_cpp/lib/libllama.so,sha256={digest.decode()},8",
                      record[2], "llama_cpp_python-9.9.9.dist-info/RECORD,,"]
    assert record[2].startswith("llama_cpp/lib/llama-server,sha256=")
    assert record[2].endswith(",11")
    with pytest.raises(lb.BuildError, match="already holds llama_cpp/lib/libllama.so"):
        lb.add_to_wheel(wheel, {"llama_cpp/lib/libllama.so": lib})


def test_the_server_is_linked_from_the_installed_wheel_and_relinked_when_it_differs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import os

    monkeypatch.delenv(lc.SERVER_ENV, raising=False)
    lib = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    with pytest.raises(lb.BuildError, match=r"llama_cpp/lib/llama-server is missing or not "
                                            r"executable .* run it with --rebuild"):
        lb.install_server(lib, prefix=tmp_path / "venv")
    (lib / "llama-server").write_text("#!/bin/sh\necho built\n")
    (lib / "llama-server").chmod(0o755)
    dest = lb.install_server(lib, prefix=tmp_path / "venv")
    assert dest == tmp_path / "venv" / "bin" / "llama-server"
    assert os.readlink(dest) == "../lib/python3.11/site-packages/llama_cpp/lib/llama-server"
    assert lc.require_server(tmp_path / "venv") == dest
    assert capsys.readouterr().out.startswith("llama.cpp: linked ")
    lb.install_server(lib, prefix=tmp_path / "venv")
    assert "already linked" in capsys.readouterr().out
    # a copy left by an older install (a regular file) is replaced by the link
    dest.unlink()
    dest.write_bytes(b"old")
    lb.install_server(lib, prefix=tmp_path / "venv")
    assert dest.is_symlink() and dest.read_bytes() == b"#!/bin/sh\necho built\n"
    lc.server_path(tmp_path / "venv")
    with pytest.raises(ConfigError) as e:
        lc.require_server(tmp_path / "elsewhere")
    assert str(e.value) == (f"llama-server: {tmp_path}/elsewhere/bin/llama-server is not "
                            "installed — run `make` (or `python -m tasks.engine.llama_build install`; "
                            "`--variant cuda` on a GPU node)")
    monkeypatch.setenv(lc.SERVER_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"\$SLM_LLAMA_SERVER points at .*/nowhere, which is "
                                          "not an executable file"):
        lc.require_server()


def _key_of(spec: dict) -> str:
    """build_key's definition: sha256 of the spec as sorted JSON, 16 hex characters."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def test_the_cuda_key_hashes_the_toolkit_release_beside_the_cpu_spec(cuda: Path) -> None:
    spec = {"dist": "llama-cpp-python", "version": "0.3.36", "flags": lb.flags("cpu"),
            "targets": ["llama", "llama-server"], "wheel": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF",
            "machine": "x86_64"}
    assert _key_of(spec) == lb.build_key("0.3.36", "cpu", "x86_64") == "840c3259b4047677"
    # cuda: its flags (with the compiler's path) and the release `nvcc --version` prints
    assert lb.build_key("0.3.36", "cuda", "x86_64") == _key_of(
        {**spec, "flags": lb.flags("cuda"), "cuda": "12.8.93"})


def _small_wheel(path: Path, record: str, compression: int = 0) -> Path:
    with zipfile.ZipFile(path, "w", compression) as z:
        z.writestr("llama_cpp/__init__.py", "x = 1\n")
        z.writestr("llama_cpp_python-9.9.9.dist-info/RECORD", record)
    return path


def test_the_added_files_have_a_fixed_time_and_the_wheel_is_compressed(tmp_path: Path) -> None:
    wheel = _small_wheel(tmp_path / "llama_cpp_python-9.9.9-py3-none-linux_x86_64.whl",
                         "llama_cpp_python-9.9.9.dist-info/RECORD,,\n", zipfile.ZIP_DEFLATED)
    lib = tmp_path / "libllama.so"
    lib.write_bytes(b"\x7fELF" * 64)
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF-server")
    lb.add_to_wheel(wheel, {"llama_cpp/lib/libllama.so": lib,
                            "llama_cpp/lib/llama-server": server})
    with zipfile.ZipFile(wheel) as z:
        # the same bytes whenever it is built: a fixed date, not the build's clock
        for name in ("llama_cpp/lib/libllama.so", "llama_cpp/lib/llama-server"):
            assert z.getinfo(name).date_time == (2020, 1, 1, 0, 0, 0)
        # every member deflated, the rewritten RECORD too
        assert {i.filename: i.compress_type for i in z.infolist()} == {
            "llama_cpp/__init__.py": zipfile.ZIP_DEFLATED,
            "llama_cpp/lib/libllama.so": zipfile.ZIP_DEFLATED,
            "llama_cpp/lib/llama-server": zipfile.ZIP_DEFLATED,
            "llama_cpp_python-9.9.9.dist-info/RECORD": zipfile.ZIP_DEFLATED}
    # nothing left beside the wheel
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "libllama.so", "llama-server", "llama_cpp_python-9.9.9-py3-none-linux_x86_64.whl"]


def test_a_temp_file_left_by_an_interrupted_rewrite_is_replaced(tmp_path: Path) -> None:
    wheel = _small_wheel(tmp_path / "w-9.9.9-py3-none-any.whl",
                         "llama_cpp_python-9.9.9.dist-info/RECORD,,\n")
    stale = tmp_path / "w-9.9.9-py3-none-any.tmp"
    stale.write_bytes(b"half a zip")
    lib = tmp_path / "libllama.so"
    lib.write_bytes(b"lib")
    lb.add_to_wheel(wheel, {"llama_cpp/lib/libllama.so": lib})
    assert not stale.exists()
    with zipfile.ZipFile(wheel) as z:
        assert z.read("llama_cpp/lib/libllama.so") == b"lib"


def test_record_lines_go_at_the_end_when_records_own_line_is_not_last(tmp_path: Path) -> None:
    lib = tmp_path / "libllama.so"
    lib.write_bytes(b"\x7fELF-lib")
    line = lb._record_line("llama_cpp/lib/libllama.so", b"\x7fELF-lib")
    wheel = _small_wheel(tmp_path / "a-9.9.9-py3-none-any.whl",
                         "llama_cpp_python-9.9.9.dist-info/RECORD,,\n"
                         "llama_cpp/__init__.py,sha256=abc,6\n")
    lb.add_to_wheel(wheel, {"llama_cpp/lib/libllama.so": lib})
    with zipfile.ZipFile(wheel) as z:
        assert z.read("llama_cpp_python-9.9.9.dist-info/RECORD").decode() == (
            "llama_cpp_python-9.9.9.dist-info/RECORD,,\n"
            "llama_cpp/__init__.py,sha256=abc,6\n"
            f"{line}\n")
    # an empty RECORD gets the new line alone
    empty = _small_wheel(tmp_path / "b-9.9.9-py3-none-any.whl", "")
    lb.add_to_wheel(empty, {"llama_cpp/lib/libllama.so": lib})
    with zipfile.ZipFile(empty) as z:
        assert z.read("llama_cpp_python-9.9.9.dist-info/RECORD").decode() == f"{line}\n"


def test_a_record_line_is_path_unpadded_urlsafe_sha256_and_size() -> None:
    # sha256(b"") = e3b0c442...b855: base64 "47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU="
    assert lb._record_line("a/b.so", b"") == \
        "a/b.so,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0"


def test_a_wheel_without_one_record_or_already_holding_the_files_is_refused(
        tmp_path: Path) -> None:
    lib = tmp_path / "libllama.so"
    lib.write_bytes(b"lib")
    bare = tmp_path / "bare-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(bare, "w") as z:
        z.writestr("llama_cpp/__init__.py", "x = 1\n")
    with pytest.raises(lb.BuildError) as e:
        lb.add_to_wheel(bare, {"llama_cpp/lib/libllama.so": lib})
    assert str(e.value) == f"{bare}: 0 RECORD files, expected 1"
    wheel = _small_wheel(tmp_path / "c-9.9.9-py3-none-any.whl",
                         "llama_cpp_python-9.9.9.dist-info/RECORD,,\n")
    lb.add_to_wheel(wheel, {"llama_cpp/lib/libllama.so": lib, "llama_cpp/lib/llama-server": lib})
    with pytest.raises(lb.BuildError) as e:
        lb.add_to_wheel(wheel, {"llama_cpp/lib/llama-server": lib,
                                "llama_cpp/lib/libllama.so": lib})
    assert str(e.value) == (f"{wheel} already holds llama_cpp/lib/libllama.so, "
                            "llama_cpp/lib/llama-server")
