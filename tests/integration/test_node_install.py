"""The image builder's install step, run for real: the rendered `do_install` of
tasks/gcp/image_build.sh, as Google's runner starts a startup script — as root, in /, with only
PATH and HOME set (the guest agent's google_metadata_script_runner sets no working directory) —
on this checkout as the builder gets it: packed by `gcp image build` (tasks/gcp/code.py) and
unpacked, with no .git (the build installs from the archive alone). Real: bash, make,
python3.11, pip, the Makefile's install (llama_build's cpu variant from the machine's build
cache, the project and PyTorch by uv, llama.cpp's converters, the install
check). Only the variant differs from the node
(cuda needs nvcc): the same line, the same Makefile.

The old builder ran `$VENV/bin/python -m tasks.engine.llama_build` from / in a bare venv
("No module named 'tasks'"): the same step here would fail."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from blocks.node_serve import NodeServeSettings
from tasks.engine.llama_build import cache_root
from tasks.gcp.code import Checkout, pack
from tasks.gcp.image import BuildOptions, image_build
from tasks.gcp.spec import GcpSpec
from tests.support.paths import ROOT

SPEC = GcpSpec(project="acme-ml", zones=["us-central1-a"], bucket="acme-slm")
CHECKOUT = Checkout("acme-slm", ("Makefile",), b"a tar.gz")


def _install_step(clone: Path, variant: str) -> str:
    """The body of the rendered script's do_install, for a build of `variant`."""
    node = NodeServeSettings(project_dir=str(clone))
    build = image_build(SPEC, node, "allenai/Olmo-3-7B-Think@main", "/opt/b.gguf",
                        BuildOptions(checkout=CHECKOUT, model="allenai/Olmo-3-32B-Think"))
    script = replace(build, variant=variant).script()
    return script.split("do_install() {\n", 1)[1].split("\n}\n", 1)[0]


def test_the_install_step_is_makes_install_and_runs_from_root(tmp_path: Path) -> None:
    clone = tmp_path / "slm-nightly"
    clone.mkdir()
    archive = tmp_path / "checkout.tar.gz"
    archive.write_bytes(pack(ROOT, SPEC.bucket).data)
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(clone), "--touch"], check=True)
    assert not (clone / ".git").exists()
    step = _install_step(clone, "cpu")
    assert step.strip().startswith("CUDACXX=/usr/local/cuda/bin/nvcc SLM_BUILD_CACHE=")
    assert step.rstrip().endswith(
        'make -C "$PROJECT_DIR" install PYTHON=python3.11 LLAMA_VARIANT=cpu')
    # the scratch disk's build cache is this machine's (a compile here would take minutes)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "build-cache").symlink_to(cache_root())
    env = {"PATH": os.environ["PATH"], "HOME": str(Path.home())}
    done = subprocess.run(
        ["bash", "-c", f"set -Eeuo pipefail\nPROJECT_DIR={clone}\nSCRATCH={scratch}\n{step}"],
        cwd="/", env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    venv = clone / ".venv"
    assert (venv / ".installed-stamp").is_file()
    assert (venv / "bin" / "llama-server").resolve().is_file()
    assert list((venv / "share" / "slm-nightly").glob("*/convert_hf_to_gguf.py"))
    # every module compiled at install, as pip does: a process that may not write .pyc (this
    # machine's PYTHONDONTWRITEBYTECODE, the node's service user) would otherwise compile torch,
    # transformers and Prefect at each start
    site = next((venv / "lib").glob("python3*/site-packages"))
    for package in ("torch", "transformers", "prefect", "polars"):
        pyc = site / package / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
        assert pyc.is_file(), f"{pyc} missing: the install compiled no bytecode"
    # the environment is the clone's: its python imports the project and llama.cpp's binding
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import tasks, llama_cpp; print(tasks.__file__)"],
                         cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(clone / "tasks" / "__init__.py")


# kmod's modinfo (tools/modinfo.c): `-F version NAME` prints the field of the installed module;
# a module the kernel's tree lacks is "modinfo: ERROR: Module NAME not found.", exit 1
MODINFO = """#!/bin/bash
[ "$1 $2" = "-F version" ] || { echo "modinfo stand-in: -F version NAME only" >&2; exit 2; }
if [ -n "$DRIVER" ] && [ "$3" = nvidia ]; then echo "$DRIVER"; exit 0; fi
echo "modinfo: ERROR: Module $3 not found." >&2; exit 1
"""


def test_the_cuda_install_ends_by_checking_that_the_driver_runs_pytorchs_cuda(
        tmp_path: Path) -> None:
    """A driver too old for the installed PyTorch's CUDA stops the node's install naming the
    fix (the Deep Learning VM family's driver branch), minutes into an image build rather than
    at a night's training; the cpu variant does not ask."""
    import torch

    recipe = {v: subprocess.run(["make", "-n", "-B", "-C", str(ROOT), "install",
                                 f"LLAMA_VARIANT={v}"], capture_output=True, text=True,
                                check=True).stdout for v in ("cpu", "cuda")}
    assert "test cuda != cuda || .venv/bin/python -m tasks.engine.cuda_driver" in recipe["cuda"]
    assert "test cpu != cuda || " in recipe["cpu"]
    (tmp_path / "modinfo").write_text(MODINFO)
    (tmp_path / "modinfo").chmod(0o755)

    def run(driver: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "DRIVER": driver}
        return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m",
                               "tasks.engine.cuda_driver"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    cuda = torch.version.cuda
    assert cuda is not None and cuda.split(".")[0] in ("12", "13")  # PyPI's default build
    none = run("")
    assert none.returncode == 1
    assert none.stderr.startswith("no NVIDIA driver on this machine (modinfo: ERROR: Module "
                                  "nvidia not found.) — ")
    old = run("520.61.05")  # older than either branch's minimum
    assert old.returncode == 1
    assert (f"PyTorch {torch.__version__} is built for CUDA {cuda}, which needs an NVIDIA "
            "driver of ") in old.stderr and "set [gcp] base_image" in old.stderr
    fits = run("580.95.05")
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.startswith(f"cuda driver: 580.95.05 runs PyTorch {torch.__version__}'s "
                                  f"CUDA {cuda}")
