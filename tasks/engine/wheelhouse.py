"""PyTorch's wheels kept on this machine, so that a fresh clone does not download them again.

pip's own HTTP cache keeps nothing where the package index answers without caching headers
(on this project's CI machines `pip cache info` shows 0 HTTP files after a whole install), and
PyTorch's default build from PyPI is ~3 GB of wheels (torch +cu130, triton and the nvidia-*
libraries), ~1 min to download on every clean clone. `python -m tasks.engine.wheelhouse REQ` downloads
REQ with everything it depends on, once per machine, into the build cache (tasks/engine/llama_build.py
`cache_root()`, a folder per requirement, Python and platform), and prints that folder; the
Makefile installs from it with `pip install --no-index --find-links`.

A download that stops half-way leaves no folder: it is renamed into place once pip finishes.
Delete the folder to download again.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tasks.engine.llama_build import cache_root
from tasks.shared.errors import ConfigError, print_result
from tasks.shared.files import locked


def folder(requirement: str, root: Path | None = None) -> Path:
    """Where `requirement`'s wheels live for this interpreter and machine."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+", requirement):
        raise ConfigError(f"wheelhouse: {requirement!r} is not a pinned requirement "
                          "(NAME==VERSION) — pin it, so the folder holds one set of wheels")
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}-{sys.platform}-{platform.machine()}"
    return (root or cache_root()) / "wheels" / f"{requirement.replace('==', '-')}-{tag}"


def ensure(requirement: str, root: Path | None = None) -> Path:
    """The folder holding `requirement` and its dependencies as wheels, downloaded if absent."""
    done = folder(requirement, root)
    with locked(done.with_name(done.name + ".lock")):
        if done.is_dir():
            return done
        partial = done.with_name(f"{done.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                               "--only-binary", ":all:", "--dest", str(partial), requirement],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise ConfigError(f"wheelhouse: `pip download {requirement}` exited "
                              f"{proc.returncode} — check the network or the pin:\n"
                              f"{proc.stderr[-2000:]}")
        partial.rename(done)
    return done


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tasks.engine.wheelhouse NAME==VERSION", file=sys.stderr)
        return 2
    return print_result(lambda: ensure(argv[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
