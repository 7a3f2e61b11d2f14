"""What the image builder's script runs (tests/integration/test_image_build.py says which are
real and which stand in), and the fake node runtime that runs the builder with them."""

from __future__ import annotations

import os
from pathlib import Path

from tests.fakes.hf_hub import FakeHub
from tests.fakes.node_runtime import FakeNode
from tests.support import apt
from tests.support.paths import ROOT

NVCC_VERSION = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA "
                "Corporation\nBuilt on Tue_May_27_02:21:03_PDT_2025\nCuda compilation tools, "
                "release 12.9, V12.9.86\nBuild cuda_12.9.r12.9/compiler.36037853_0\n")
# llama.cpp's converters as the venv installs them (tasks/engine/llama_build.py)
CONVERTERS = ROOT / ".venv" / "share" / "slm-nightly" / "llama.cpp-0.3.36"


def standins(tmp: Path) -> dict[str, str]:
    """The stand-ins and the node paths they replace."""
    bin_ = tmp / "standins"
    calls = tmp / "CALLS"
    rec = f'echo "$(basename "$0") $*" >> {calls}\n'
    # ldconfig(8) with no argument rebuilds the loader's cache from /etc/ld.so.conf.d (a
    # missing folder there is only a warning, exit 0); the stand-in takes the plain call alone
    apt.write(bin_ / "ldconfig", rec + """\
        [ $# = 0 ] || { echo "ldconfig stand-in: only the plain call is modelled" >&2; exit 2; }
        """)
    apt.standins(bin_, calls, apt.UBUNTU_2204)
    # The scratch disk, attached empty (a file stands for the device), and the tools that
    # format and mount it, with their exit codes: mkfs.ext4 (mke2fs(8): a missing device is
    # "The file DEV does not exist and no size was specified.", exit 1), blkid (blkid(8): 2 when
    # the device has no file system), mount and umount (mount(8), umount(8): 32, "mount failure",
    # for a missing mount point or device, a device without a file system, one mounted already;
    # "not mounted" for umount), mountpoint -q (mountpoint(1): 32, not a mount point). What is
    # mounted lives in the node's /run ($FAKE_NODE_DIR/run), which each boot clears.
    (tmp / "dev-scratch").touch()
    table = '"$FAKE_NODE_DIR/run/mounts"'
    apt.write(bin_ / "mkfs.ext4", rec + """\
        dev="${@: -1}"
        [ -e "$dev" ] || { echo "The file $dev does not exist and no size was specified." >&2
          exit 1; }
        echo ext4 > "$dev"
        """)
    apt.write(bin_ / "blkid", '[ "$(cat "$1" 2>/dev/null)" = ext4 ] || exit 2\n')
    apt.write(bin_ / "mountpoint", f'grep -qx -- "${{@: -1}}" {table} 2>/dev/null || exit 32\n')
    apt.write(bin_ / "mount", rec + f"""\
        dev=$1 dir=$2
        fail() {{ echo "mount: $dir: $*" >&2; exit 32; }}
        [ -d "$dir" ] || fail "mount point does not exist."
        [ -e "$dev" ] || fail "special device $dev does not exist."
        [ "$(cat "$dev")" = ext4 ] || fail "wrong fs type, bad option, bad superblock on $dev."
        ! grep -qx -- "$dir" {table} 2>/dev/null || fail "$dev already mounted on $dir."
        echo "$dir" >> {table}
        """)
    apt.write(bin_ / "umount", rec + f"""\
        grep -qx -- "$1" {table} 2>/dev/null || {{ echo "umount: $1: not mounted." >&2; exit 32; }}
        grep -vx -- "$1" {table} > {table}.new; mv {table}.new {table}
        """)
    apt.write(bin_ / "ldd", rec + f"""\
        echo "	libcudart.so.12 => /usr/local/cuda/lib64/libcudart.so.12 (0x00007f)"
        [ -e {tmp}/ldd-missing ] && echo "	libcublas.so.12 => not found"
        exit 0
        """)
    # GNU make, for the clone's `make install` (tests/integration/test_node_install.py runs the
    # real one, from /, for the cpu variant; here the CUDA variant cannot build). Modelled on GNU
    # make's manual ("Options Summary", "Errors"): -C DIR reads DIR/Makefile; without a makefile
    # "No targets specified and no makefile found", a target without a rule "No rule to make
    # target 'T'", both "Stop." with exit 2. The recipe's effect is the venv the Makefile's
    # install leaves (its tools stand in below); its llama_build refuses a variant it lacks
    # (argparse's "invalid choice", exit 2).
    apt.write(bin_ / "make", rec + """\
        dir=$PWD; target=; vars=()
        while [ $# -gt 0 ]; do
          case "$1" in
            -C) dir=$2; shift ;;
            *=*) vars+=("$1") ;;
            *) target=$1 ;;
          esac
          shift
        done
        if [ ! -f "$dir/Makefile" ]; then
          echo "make: *** No targets specified and no makefile found.  Stop." >&2; exit 2
        fi
        if ! grep -q "^${target:-install}:" "$dir/Makefile"; then
          echo "make: *** No rule to make target '$target'.  Stop." >&2; exit 2
        fi
        for v in "${vars[@]}"; do
          case "$v" in
            LLAMA_VARIANT=cpu|LLAMA_VARIANT=cuda) ;;
            LLAMA_VARIANT=*)
              echo "llama_build: error: argument --variant: invalid choice: '${v#*=}'" >&2
              echo "make: *** [Makefile: install] Error 2" >&2; exit 2 ;;
          esac
        done
        echo "make-env CUDACXX=${CUDACXX:-} SLM_BUILD_CACHE=${SLM_BUILD_CACHE:-}" >> """
              + str(calls) + """
        v=$dir/.venv; here=$(dirname "$0")
        mkdir -p "$v/bin" "$v/share/slm-nightly" "$v/lib/llama_cpp/lib"
        ln -sfn """ + str(CONVERTERS) + """ "$v/share/slm-nightly/llama.cpp-0.3.36"
        touch "$v/lib/llama_cpp/lib/llama-server"
        ln -sf ../lib/llama_cpp/lib/llama-server "$v/bin/llama-server"
        for t in hf slm-nightly; do cp "$here/venv-$t" "$v/bin/$t"; done
        cp "$here/venv-python" "$v/bin/python"
        touch "$v/.installed-stamp"
        """)
    # the real `hf` (huggingface_hub's CLI, this project's pin), against the FakeHub at
    # HF_ENDPOINT; its calls recorded
    apt.write(bin_ / "venv-hf", rec + f'exec {ROOT / ".venv" / "bin" / "hf"} "$@"\n')
    # the venv's python is this project's (its converters, llama.cpp's quantizer through the
    # pinned llama-cpp-python): convert_hf_to_gguf.py and tasks.image.quantize run for real on
    # the hub's tiny OLMo 3; each call recorded with the compiler the step was given
    apt.write(bin_ / "venv-python", f"""\
        [ "$1" = -c ] || echo "python $* CUDACXX=${{CUDACXX:-}}" >> {calls}
        exec {ROOT / ".venv" / "bin" / "python"} "$@"
        """)
    # `node prepare-weights --source`: tasks/image/weights.py loads the tokenizer folder with
    # AutoTokenizer, offline, in a child process; without tokenizer.json (or tokenizer.model)
    # transformers raises OSError and the command fails
    apt.write(bin_ / "venv-slm-nightly", rec + f"""\
        set -e; [ "${{@: -1}}" = --check ] && exit 0
        src="${{@: -1}}"; mkdir -p {tmp}/models
        if [ ! -f "$src/Olmo-3-32B-Think/tokenizer.json" ]; then
          echo "node prepare-weights: the tokenizer $src/Olmo-3-32B-Think does not load" >&2
          exit 1
        fi
        cp "$src/Olmo-3-32B-Think-Q3_K_M.gguf" {tmp}/models/Olmo-3-32B-Think-Q3_K_M.gguf
        cp "$src/olmo-3-7b-think-f16.gguf" {tmp}/models/olmo-3-7b-think-f16.gguf
        m=$(sha256sum {tmp}/models/Olmo-3-32B-Think-Q3_K_M.gguf | cut -c1-64)
        b=$(sha256sum {tmp}/models/olmo-3-7b-think-f16.gguf | cut -c1-64)
        printf '{{"files": {{"model": {{"sha256": "%s"}}, "base_gguf": {{"sha256": "%s"}}}}}}' \
          "$m" "$b" > {tmp}/models/weights-manifest.json
        """)
    apt.write(tmp / "cuda" / "bin" / "nvcc", rec + f"printf '{NVCC_VERSION}'\n")
    return {"/usr/local/cuda/bin/nvcc": f"{tmp}/cuda/bin/nvcc",
            "/opt/slm-nightly": f"{tmp}/checkout",
            "/var/lib/slm-image-build": f"{tmp}/state", "/mnt/slm-scratch": f"{tmp}/scratch",
            "/opt/models": f"{tmp}/models", "/opt/slm-hf": f"{tmp}/hf",
            "/dev/disk/by-id/google-slm-scratch": f"{tmp}/dev-scratch"}


def hub(model: Path) -> FakeHub:
    """The Hugging Face Hub the builder downloads from: `model` (an HF folder: the tiny OLMo 3
    of tests/support/olmo3_tiny.py, weights, config and tokenizer) as the served model at
    revisions 0123abc and main, and as the training base at main."""
    return FakeHub({"allenai/Olmo-3-32B-Think": {"0123abc": model, "main": model},
                    "allenai/Olmo-3-7B-Think": {"main": model}})


class BuilderNode(FakeNode):
    """The builder's FakeNode with the hub it downloads from (`hub`), served until close()."""

    hub: FakeHub

    def close(self) -> None:
        super().close()
        self.hub.__exit__()


def builder_node(tmp: Path, project: str, model: Path, storage: str,
                 project_dir: str = "/opt/slm-nightly") -> BuilderNode:
    """A FakeNode that runs the builder's script with the stand-ins under `tmp`, not attached:
    attach it, or route the builder's instance to it with tests/fakes/node_runtime.py ByName
    (either gives it the fake). `project_dir`:
    the profile's node checkout (the builder unpacks the checkout into it), mapped under `tmp`
    like every path the script writes; the script is refused if it still names this
    repository, this machine's home or a disk device (it runs as root: the checkout step deletes
    its folder). `storage`: the URL of the Cloud Storage API the builder fetches the checkout
    from (the world's bucket proxy, tests/fakes/gcs_iam.py). `model`: the HF folder the hub
    serves (hub())."""
    served = hub(model).__enter__()
    env = {"PATH": f"{tmp / 'standins'}:{os.environ['PATH']}", "HF_ENDPOINT": served.url,
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    paths = {**standins(tmp), project_dir: f"{tmp}/checkout",
             "https://storage.googleapis.com": storage}
    node = BuilderNode(tmp / "nodes", paths=paths, env=env, project=project,
                       forbid=(str(ROOT), str(Path.home()), "/dev/disk"))
    node.hub = served
    return node
