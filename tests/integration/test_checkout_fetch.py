"""The VMs take the code from the bucket, not from a repository (issue 50, finding 11).

`gcp orchestrator` and `gcp image build` pack the checkout they run in (tasks/gcp/code.py) and
upload it; the VM's startup script fetches it with `fetch_code`. Here a VM of the fake Compute
Engine runs that function for real, as its startup script from / (tests/fakes/node_runtime.py):
curl asks the metadata server for its account's token and downloads the archive from the bucket
through the bucket's IAM (tests/fakes/gcs_iam.py, gcp-storage-emulator behind it), sha256sum
checks it, tar unpacks it. The project is set up by `gcp setup`'s own code, so the node's
account reads the bucket because setup granted it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.gcp.code import Checkout, fetch_function, pack, push
from tasks.gcp.reconcile import GcpError
from tests.fakes.node_runtime import FakeNode
from tests.support.gcp_world import World, set_up_project, spec_of

ZONE = "us-central1-a"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with set_up_project(tmp_path) as w:
        yield w


def _checkout(root: Path, files: dict[str, str]) -> Path:
    """A git checkout with `files` committed, then edited by hand: pack takes the tree as it
    is, committed or not."""
    root.mkdir(exist_ok=True)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@x"]
    if not (root / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _boot(world: World, node: FakeNode, name: str, script: str) -> tuple[int, str]:
    """A VM whose startup script is `script`, booted; its script's exit and log."""
    world.compute.add_instance(ZONE, name, status="RUNNING",
                               metadata={"startup-script": script})
    deadline = time.monotonic() + 60
    while (rc := node.script_exit(ZONE, name)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rc is not None, node.log(ZONE, name)
    return rc, node.log(ZONE, name)


def _script(checkout: Checkout) -> str:
    return f"#!/bin/bash\nset -euo pipefail\n{fetch_function(checkout)}\nfetch_code /opt/app\n"


def test_a_vm_fetches_the_checkout_and_a_newer_one_replaces_its_files(
        world: World, tmp_path: Path) -> None:
    spec = spec_of(tmp_path / "p.toml")
    repo = _checkout(tmp_path / "repo", {
        ".gitignore": "secret/\n", "Makefile": "install:\n", "pyproject.toml": "[project]\n",
        "tasks/a.py": "A = 1\n", "tasks/old.py": "OLD = 1\n", "run.sh": "echo hi\n",
        "secret/key.json": "{}\n", "profiles/mine.toml": "bucket = 'b'\n"})
    (repo / "run.sh").chmod(0o755)
    subprocess.run(["git", "-C", str(repo), "add", "Makefile", "pyproject.toml", "tasks"],
                   check=True)
    first = pack(repo, spec.bucket)
    # what a clone would hold plus the uncommitted, not-ignored files; the archive reproducible
    assert first.files == (".gitignore", "Makefile", "profiles/mine.toml", "pyproject.toml",
                           "run.sh", "tasks/a.py", "tasks/old.py")
    assert pack(repo, spec.bucket).data == first.data
    assert first.name == f"code/checkout-{first.version}.tar.gz"
    assert push(first, world.clients()) is True
    assert push(first, world.clients()) is False  # there already: the same name, the same bytes

    app = tmp_path / "app"
    node = FakeNode(tmp_path / "nodes", paths={"/opt/app": str(app),
                                               "https://storage.googleapis.com": world.storage.url})
    node.attach(world.compute)
    try:
        before = time.time()
        rc, log = _boot(world, node, "vm-1", _script(first))
        assert rc == 0, log
        got = sorted(p.relative_to(app).as_posix() for p in app.rglob("*") if p.is_file())
        assert got == sorted([*first.files, ".code-files", ".code-version"])
        assert (app / ".code-version").read_text() == first.version + "\n"
        assert (app / "run.sh").stat().st_mode & 0o777 == 0o755
        assert (app / "tasks" / "a.py").stat().st_mode & 0o777 == 0o644
        # unpacked with the time of unpacking, so `make` sees the files as new
        assert (app / "pyproject.toml").stat().st_mtime >= before - 1

        # the next checkout: a.py changed, old.py gone, new.py added; unpacked over the first
        (repo / "tasks" / "old.py").unlink()
        _checkout(repo, {"tasks/a.py": "A = 2\n", "tasks/new.py": "NEW = 1\n"})
        (app / "state.db").write_text("the VM's own file")  # not the checkout's: kept
        second = pack(repo, spec.bucket)
        assert second.version != first.version
        push(second, world.clients())
        rc, log = _boot(world, node, "vm-2", _script(second))
        assert rc == 0, log
        assert (app / "tasks" / "a.py").read_text() == "A = 2\n"
        assert (app / "tasks" / "new.py").exists() and not (app / "tasks" / "old.py").exists()
        assert (app / "state.db").read_text() == "the VM's own file"
        assert (app / ".code-version").read_text() == second.version + "\n"

        # an object whose bytes are not the ones packed (rewritten in the bucket) is refused
        world.clients().storage.bucket(spec.bucket).blob(second.name).upload_from_string(b"x")
        rc, log = _boot(world, node, "vm-3", _script(second))
        assert rc != 0
        assert "sha256sum: WARNING: 1 computed checksum did NOT match" in log
    finally:
        node.close()
    fetched = [(c["member"], c["status"]) for c in world.gcp.calls
               if c["api"] == "storage" and c["method"] == "GET" and "/o/code/" in c["path"]]
    assert fetched == [(f"serviceAccount:{spec.node_email}", 200)] * 3


def test_pack_refuses_a_folder_that_is_not_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(GcpError, match="not a git checkout of slm-nightly"):
        pack(tmp_path, "b")
    _checkout(tmp_path / "other", {"README.md": "x"})
    with pytest.raises(GcpError, match="no Makefile and pyproject.toml — run the command in "
                       "your slm-nightly checkout"):
        pack(tmp_path / "other", "b")
