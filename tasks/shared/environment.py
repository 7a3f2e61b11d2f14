"""The node's environment against the orchestrator's: the image holds the environment, the
deployed code comes from the orchestrator (tasks/shared/code_version.py), so the two must agree on
what the code was written against — pyproject.toml's dependencies.

`describe()` reads this interpreter's installed versions of the project's declared
dependencies (pyproject.toml beside the code, which on the node is the orchestrator's, pulled
with the code). A node's training run writes its description to the bucket
(`records/node-environment.json`, `record`); preflight and `node smoke` compare it with the
orchestrator's own (`differences`):
- a dependency the node lacks, or whose version is outside pyproject's specifier, or a pinned
  (`==`) one whose version differs, or another Python minor version: the image is stale —
  rebuild it;
- versions that differ within a range (`>=`) are said, not refused: each machine resolved the
  range on the day its environment was built.
torch is left out: the node trains on its engine's torch (pyproject.toml's comment).
"""

from __future__ import annotations

import json
import platform
import tomllib
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from google.api_core.exceptions import NotFound
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from tasks.shared.files import sha256_hex
from tasks.shared.gcs_sync import gcs_bucket_from_env_or_block
from tasks.shared.paths import PROJECT_ROOT

RECORD_KEY = "records/node-environment.json"
NOT_COMPARED = frozenset({"torch"})
REBUILD = ("rebuild the node image from this checkout (docs/operator-gcp.md, section 3: The "
           "node image), or bring the orchestrator's venv to the image's")


def _requirements(pyproject: Path) -> list[Any]:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [Requirement(d) for d in deps]


def _name(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def describe(pyproject: Path | None = None) -> dict[str, Any]:
    """{python, packages: {name: version or None}, digest}: this interpreter's versions of the
    declared dependencies (local version labels such as +cu128 dropped)."""
    pyproject = pyproject or PROJECT_ROOT / "pyproject.toml"
    packages: dict[str, str | None] = {}
    for req in _requirements(pyproject):
        try:
            packages[_name(req.name)] = metadata.version(req.name).split("+", 1)[0]
        except metadata.PackageNotFoundError:
            packages[_name(req.name)] = None
    python = ".".join(platform.python_version_tuple()[:2])
    return {"python": python, "packages": packages, "digest": digest(python, packages),
            "host": platform.node(), "at": datetime.now(UTC).isoformat(timespec="seconds")}


def digest(python: str, packages: dict[str, str | None]) -> str:
    text = "\n".join([f"python=={python}", *(f"{n}=={v}" for n, v in sorted(packages.items())
                                             if n not in NOT_COMPARED)])
    return sha256_hex(text, 16)


def differences(here: dict[str, Any], node: dict[str, Any], pyproject: Path | None = None
                ) -> tuple[list[str], list[str]]:
    """(refused, said): what makes the node's environment unfit for this checkout's code, and
    the versions that differ within pyproject's ranges."""
    refused: list[str] = []
    said: list[str] = []
    if here.get("python") != node.get("python"):
        refused.append(f"Python {node.get('python')} on the node, {here.get('python')} here")
    theirs = node.get("packages", {})
    for req in _requirements(pyproject or PROJECT_ROOT / "pyproject.toml"):
        name = _name(req.name)
        if name in NOT_COMPARED:
            continue
        mine, got = here.get("packages", {}).get(name), theirs.get(name)
        if got is None:
            refused.append(f"{name} is not installed on the node")
            continue
        try:
            fits = req.specifier.contains(Version(got), prereleases=True)
        except InvalidVersion:
            fits = False
        pinned = any(s.operator in ("==", "===") for s in req.specifier)
        if not fits:
            refused.append(f"{name} {got} on the node is outside {req.specifier}")
        elif got != mine:
            (refused if pinned else said).append(f"{name} {got} on the node, {mine} here")
    return refused, said


def record(gcs_block: str, description: dict[str, Any] | None = None) -> str:
    """Write this machine's description to the bucket (the node's training runs do)."""
    bucket = gcs_bucket_from_env_or_block(gcs_block)
    if bucket is None:
        raise ValueError(f"gcs_block {gcs_block!r}: no bucket")
    bucket.write_path(RECORD_KEY, json.dumps(description or describe(), indent=2).encode())
    return RECORD_KEY


def recorded(gcs_block: str) -> dict[str, Any] | None:
    """The last description a node wrote to the bucket (None when no node run has yet)."""
    bucket = gcs_bucket_from_env_or_block(gcs_block)
    if bucket is None:
        return None
    try:
        data = bucket.read_path(RECORD_KEY)
    except NotFound:
        return None
    return dict(json.loads(data))
