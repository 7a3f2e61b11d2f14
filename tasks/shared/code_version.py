"""The code a node deployment runs, named by its content.

`prefect deploy` of a deployment that runs on the GPU node (prefect.yaml: `train/node`) pushes
the checkout's code with prefect-gcp's `push_to_gcs` to `gs://BUCKET/<folder>/code/<version>`,
and the node's flow runs pull it back with `pull_from_gcs` before they start: the node runs the
code the orchestrator deployed, and its image holds only the environment. The files are those
`.prefectignore` lets through (push_to_gcs reads the same file); the version is a digest of
their paths and bytes, so the same files always land in the same folder, a changed file in a
new one, and a run that is pulling never sees a half-written folder.

`code_location` is the deploy step (`tasks.shared.code_version.code_location` in prefect.yaml):
Prefect imports it by name and passes its result to the next steps as `{{ code.bucket }}`,
`{{ code.folder }}`, `{{ code.version }}`. `python -m tasks.shared.code_version [DIR]` prints the
version of a checkout (preflight compares it with the deployment's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pathspec
from prefect_gcp import GcsBucket

from tasks.shared.files import file_sha256, sha256_hex

IGNORE_FILE = ".prefectignore"
VERSION_CHARS = 16


def code_files(root: Path) -> list[str]:
    """The files under `root` that push_to_gcs uploads (posix paths relative to root, sorted).
    Ignored folders are not walked (gitignore: a file under an excluded folder cannot be
    re-included), so a checkout's .venv costs nothing."""
    ignore = root / IGNORE_FILE
    if not ignore.is_file():
        raise FileNotFoundError(f"{ignore}: missing — the node's code is what this file lets "
                                "through (deploy from the project's checkout)")
    spec = pathspec.GitIgnoreSpec.from_lines(ignore.read_text().splitlines())
    found: list[str] = []
    for here, dirs, files in os.walk(root):
        rel = Path(here).relative_to(root).as_posix()
        prefix = "" if rel == "." else rel + "/"
        dirs[:] = sorted(d for d in dirs if not spec.match_file(prefix + d + "/"))
        found += [prefix + f for f in files if not spec.match_file(prefix + f)]
    return sorted(found)


def code_version(root: Path | str = ".") -> str:
    """A digest of the code files' paths and bytes (VERSION_CHARS hex characters)."""
    root = Path(root).resolve()
    # each file: its path, a NUL, its raw 32-byte sha256 — the value is persisted (code folders
    # in GCS, run records), so this layout is fixed
    parts = [rel.encode() + b"\0" + bytes.fromhex(file_sha256(root / rel))
             for rel in code_files(root)]
    return sha256_hex(b"".join(parts), VERSION_CHARS)


def code_folder(bucket_folder: str | None, version: str) -> str:
    folder = (bucket_folder or "").strip("/")
    return f"{folder + '/' if folder else ''}code/{version}"


def code_location(block: str = "slm-gcs") -> dict[str, Any]:
    """Deploy step: where this checkout's code goes in the saved GcsBucket block's bucket."""
    try:
        gcs = GcsBucket.load(block)
    except (ValueError, RuntimeError) as e:  # Prefect: "Unable to find block document …"
        raise ValueError(f"prefect.yaml: the node's code goes to the bucket of the GcsBucket "
                         f"block {block!r}, which could not be loaded ({e}) — save it first "
                         "(docs/operator-gcp.md, blocks and secrets)") from e
    version = code_version(Path.cwd())
    return {"bucket": gcs.bucket, "folder": code_folder(gcs.bucket_folder, version),
            "version": version}


if __name__ == "__main__":
    print(code_version(sys.argv[1] if len(sys.argv) > 1 else "."))
