"""The image builder's install step, run for real: the rendered `do_install` of
tasks/gcp/image_build.sh, as Google's runner starts a startup script — as root, in /, with only
PATH and HOME set (the guest agent's google_metadata_script_runner sets no working directory) —
on this checkout as the builder gets it: packed by `gcp image build` (tasks/gcp/code.py) and
unpacked, with no .git (the build installs from the archive alone). Real: bash, make,
python3.11, pip, the Makefile's install (llama_build's cpu variant from the machine's build
cache, PyTorch's wheels from the wheelhouse, the project, llama.cpp's converters, the install
check). Only the variant differs from the node
(cuda needs nvcc): the same line, the same Makefile.

The old builder ran `$VENV/bin/python -m tasks.engine.llama_build` from / in a bare venv
("No module named 'tasks'"): the same step here would fail."""

from __future__ import annotations

import os
import subprocess
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
    # the environment is the clone's: its python imports the project and llama.cpp's binding
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import tasks, llama_cpp; print(tasks.__file__)"],
                         cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(clone / "tasks" / "__init__.py")
