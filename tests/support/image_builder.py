"""Stand-ins for what the image builder's script runs (tests/integration/test_image_build.py
says what each models), and the fake node runtime that runs the builder with them."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tasks.gcp.image import INSTALLER_URL
from tests.fakes.node_runtime import FakeNode
from tests.support.paths import ROOT

COMMIT = "4f2a9c1e7b3d5a6f8e0c2b4d6f8a0c2e4b6d8f0a"
NVCC_VERSION = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA "
                "Corporation\nBuilt on Fri_Feb_21_20:23:50_PST_2025\nCuda compilation tools, "
                "release 12.8, V12.8.93\nBuild cuda_12.8.r12.8/compiler.35583870_0\n")
MODEL_BYTES, BASE_BYTES = b"GGUF quantized Q3_K_M", b"GGUF base f16"


def _standin(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(0o755)


def standins(tmp: Path) -> dict[str, str]:
    """The stand-ins and the node paths they replace."""
    bin_ = tmp / "standins"
    calls = tmp / "CALLS"
    rec = f'echo "$(basename "$0") $*" >> {calls}\n'
    for tool in ("apt-get", "ldconfig", "mount", "umount"):
        _standin(bin_ / tool, rec)
    _standin(bin_ / "mountpoint", "exit 1\n")  # nothing mounted at any boot
    _standin(bin_ / "blkid", f"[ -e {tmp}/scratch-fs ]\n")
    _standin(bin_ / "mkfs.ext4", rec + f"touch {tmp}/scratch-fs\n")
    _standin(bin_ / "ldd", rec + f"""\
        echo "	libcudart.so.12 => /usr/local/cuda/lib64/libcudart.so.12 (0x00007f)"
        [ -e {tmp}/ldd-missing ] && echo "	libcublas.so.12 => not found"
        exit 0
        """)
    _standin(bin_ / "python3.11", rec + """\
        v=$3; mkdir -p "$v/bin" "$v/share/slm-nightly/0.3.36" "$v/lib/llama_cpp/lib"
        touch "$v/share/slm-nightly/0.3.36/convert_hf_to_gguf.py" "$v/lib/llama_cpp/lib/llama-server"
        ln -sf ../lib/llama_cpp/lib/llama-server "$v/bin/llama-server"
        for t in pip hf slm-nightly; do cp "$(dirname "$0")/venv-$t" "$v/bin/$t"; done
        cp "$(dirname "$0")/venv-python" "$v/bin/python"
        """)
    _standin(bin_ / "git", rec + f"""\
        case "$1" in
          clone) mkdir -p "$4" ;;
          -C) [ "$3" = rev-parse ] && echo {COMMIT} ;;
        esac
        exit 0
        """)
    _standin(bin_ / "venv-pip", rec)
    _standin(bin_ / "venv-hf", rec + 'mkdir -p "${@: -1}" && echo x > "${@: -1}/config.json"\n')
    _standin(bin_ / "venv-python", f"""\
        [ "$1" = -c ] && exec {os.environ.get("PYTHON", "python3")} "$@"
        echo "python $* CUDACXX=${{CUDACXX:-}}" >> {calls}
        case "$*" in
          *convert_hf_to_gguf.py*) out="${{@: -1}}"; printf '{BASE_BYTES.decode()}' > "$out" ;;
          *tasks.image.quantize*) [ -e "$3" ] && printf '{MODEL_BYTES.decode()}' > "$4" ;;
        esac
        exit 0
        """)
    _standin(bin_ / "venv-slm-nightly", rec + f"""\
        set -e; [ "${{@: -1}}" = --check ] && exit 0
        src="${{@: -1}}"; mkdir -p {tmp}/models
        cp "$src/Olmo-3-32B-Think-Q3_K_M.gguf" {tmp}/models/Olmo-3-32B-Think-Q3_K_M.gguf
        m=$(sha256sum {tmp}/models/Olmo-3-32B-Think-Q3_K_M.gguf | cut -c1-64)
        b=$(sha256sum "$src/olmo-3-7b-think-f16.gguf" | cut -c1-64)
        printf '{{"files": {{"model": {{"sha256": "%s"}}, "base_gguf": {{"sha256": "%s"}}}}}}' \
          "$m" "$b" > {tmp}/models/weights-manifest.json
        """)
    _standin(tmp / "cuda" / "nvcc", rec + f"printf '{NVCC_VERSION}'\n")
    # Google's installer: the first run of each command reboots the VM (and never returns)
    (tmp / "installer.pyz").write_text(textwrap.dedent(f"""\
        import os, subprocess, sys, time
        cmd = sys.argv[1]
        with open({str(calls)!r}, "a") as f:
            f.write("installer " + " ".join(sys.argv[1:]) + "\\n")
        mark = {str(tmp)!r} + "/installer-" + cmd
        if not os.path.exists(mark):
            open(mark, "w").close()
            subprocess.run(["reboot"])
            time.sleep(60)
        """))
    return {"/usr/local/cuda/bin/nvcc": f"{tmp}/cuda/nvcc", "/opt/slm-nightly": f"{tmp}/checkout",
            "/var/lib/slm-image-build": f"{tmp}/state", "/mnt/slm-scratch": f"{tmp}/scratch",
            "/opt/models": f"{tmp}/models", "/opt/slm-hf": f"{tmp}/hf",
            "/dev/disk/by-id/google-slm-scratch": f"{tmp}/dev-scratch",
            INSTALLER_URL: f"file://{tmp}/installer.pyz"}




def builder_node(tmp: Path, project: str,
                 project_dir: str = "/opt/slm-nightly") -> FakeNode:
    """A FakeNode that runs the builder's script with the stand-ins under `tmp`, not attached:
    attach it, or route the builder's instance to it with tests/fakes/node_runtime.py ByName
    (either gives it the fake). `project_dir`:
    the profile's node checkout (the builder clones into it), mapped under `tmp` like every
    path the script writes; the script is refused if it still names this repository, this
    machine's home or a disk device (it runs as root: the checkout step deletes its folder)."""
    env = {"PATH": f"{tmp / 'standins'}:{os.environ['PATH']}"}
    paths = {**standins(tmp), project_dir: f"{tmp}/checkout"}
    return FakeNode(tmp / "nodes", paths=paths, env=env, project=project,
                    forbid=(str(ROOT), str(Path.home()), "/dev/disk"))
