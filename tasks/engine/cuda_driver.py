"""Whether this machine's NVIDIA driver runs the installed PyTorch's CUDA.

The GPU node's install (`make install LLAMA_VARIANT=cuda`, on the image builder) checks it last,
so a driver too old for PyTorch stops the build minutes in, naming the fix, instead of a night's
training finding no GPU. A CUDA runtime runs on any driver of its major version's branch or later
(NVIDIA, "CUDA Compatibility", minor version compatibility:
docs.nvidia.com/deploy/cuda-compatibility): CUDA 12.x needs 525.60.13 and 13.x 580.65.06 on
Linux. The driver's version is its kernel module's (`modinfo -F version nvidia`, kmod), which a
builder without a GPU has too.

    python -m tasks.engine.cuda_driver
"""

from __future__ import annotations

import subprocess
import sys

from tasks.shared.errors import ConfigError, print_result

MINIMUM = {12: "525.60.13", 13: "580.65.06"}  # CUDA major → the oldest driver that runs it


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def driver() -> str:
    """The installed NVIDIA kernel module's version."""
    try:
        proc = subprocess.run(["modinfo", "-F", "version", "nvidia"], capture_output=True,
                              text=True, timeout=60)
    except FileNotFoundError:
        proc = subprocess.CompletedProcess([], 127, "", "modinfo: command not found")
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ConfigError(f"no NVIDIA driver on this machine ({proc.stderr.strip()}) — the GPU "
                          "node's image starts from a Deep Learning VM family that has one: "
                          "check [gcp] base_image")
    return proc.stdout.strip()


def check(installed: str, torch_version: str, cuda: str | None) -> str:
    """What runs on what, or ConfigError naming the fix."""
    if cuda is None:
        raise ConfigError(f"PyTorch {torch_version} is a build without CUDA — the GPU node "
                          "needs PyPI's default build (the Makefile's TORCH)")
    major = int(cuda.split(".")[0])
    need = MINIMUM.get(major)
    if need is None:
        raise ConfigError(f"PyTorch {torch_version} is built for CUDA {cuda}, whose oldest "
                          "driver this check does not know — add it to MINIMUM in "
                          "tasks/engine/cuda_driver.py from NVIDIA's CUDA Compatibility table")
    if _version(installed) < _version(need):
        raise ConfigError(
            f"PyTorch {torch_version} is built for CUDA {cuda}, which needs an NVIDIA driver of "
            f"{need} or later; this machine's is {installed} — set [gcp] base_image to a "
            f"Deep Learning VM family with a newer driver (`gcloud compute images list "
            f"--project deeplearning-platform-release --filter='family~nvidia'`; the family's "
            f"name ends with its driver branch) and build again")
    return (f"cuda driver: {installed} runs PyTorch {torch_version}'s CUDA {cuda} "
            f"(needs {need} or later)")


def main() -> int:
    def run() -> str:
        installed = driver()
        import torch

        return check(installed, torch.__version__, torch.version.cuda)

    return print_result(run)


if __name__ == "__main__":
    sys.exit(main())
