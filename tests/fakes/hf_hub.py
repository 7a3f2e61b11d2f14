"""A fake Hugging Face Hub at the wire: the endpoints `hf download` calls (huggingface_hub 2.4,
`HF_ENDPOINT` pointing here), serving repositories of local files, so the real CLI and library
run against it.

Modelled on huggingface_hub's own client code (`hf_api.py`, `file_download.py`,
`_snapshot_download.py`, `utils/_http.py` hf_raise_for_status):
- GET /api/models/{org}/{name}/revision/{rev}: the model's info, `sha` the commit a branch or
  tag resolves to (snapshot_download asks this first, then lists the tree at that commit).
- GET /api/models/{org}/{name}/tree/{commit}?recursive=…: one page of
  {"type": "file", "path", "size", "oid"} (no Link header: the last page).
- HEAD/GET /{org}/{name}/resolve/{rev}/{path}: the file, with `X-Repo-Commit`, `ETag` (the
  blob id, quoted) and `Content-Length` (hf_hub_download reads them from the HEAD).
- Errors as the Hub sends them, with `X-Error-Code`, which the client turns into its
  exceptions: a repository it does not hold answers 401 RepoNotFound (the Hub does not tell a
  missing repository from a private one), an unknown revision 404 RevisionNotFound, a file not
  in the revision 404 EntryNotFound.
Not modelled: LFS/Xet redirects (each file is served inline, as the Hub serves small non-LFS
files), gated repositories, authentication, pagination past one page.
`requests` records "METHOD path" of each request, for tests that count downloads."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.fakes.loopback import JsonHandler, LoopbackServer, Served


class FakeHub(Served):
    """`repos`: "org/name" → {revision name → folder of its files}. Each revision's commit is
    the sha1 of its name and folder, fixed for a test's run."""

    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = repos
        self.requests: list[str] = []
        hub = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

        self.http = LoopbackServer(Handler)

    @staticmethod
    def commit(repo: str, revision: str) -> str:
        return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()

    def _revision(self, repo: str, rev: str) -> tuple[str, Path] | None:
        """(the revision's name, its folder) for a revision name or its commit."""
        for name, folder in self.repos.get(repo, {}).items():
            if rev in (name, self.commit(repo, name)):
                return name, folder
        return None

    def _files(self, folder: Path) -> list[Path]:
        return sorted(p for p in folder.rglob("*") if p.is_file())

    def _answer(self, h: JsonHandler, *, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append(f"{h.command} {path}")
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        m = info or tree or resolve
        if m is None:
            return h.send_json(404, {"error": "Not Found"})
        repo, rev = m.group(1), m.group(2)
        if repo not in self.repos:
            return h.send_json(401, {"error": "Repository Not Found"},
                               headers={"X-Error-Code": "RepoNotFound"})
        found = self._revision(repo, rev)
        if found is None:
            return h.send_json(404, {"error": f"Invalid rev id: {rev}"},
                               headers={"X-Error-Code": "RevisionNotFound"})
        name, folder = found
        commit = self.commit(repo, name)
        files = self._files(folder)
        if info:
            return h.send_json(200, {
                "id": repo, "modelId": repo, "sha": commit, "private": False,
                "siblings": [{"rfilename": str(p.relative_to(folder))} for p in files]})
        if tree:
            return h.send_json(200, [self._entry(folder, p) for p in files])
        target = folder / m.group(3)
        if not target.is_file():
            return h.send_json(404, {"error": "Entry not found"},
                               headers={"X-Error-Code": "EntryNotFound"})
        data = target.read_bytes()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_blob_id(data)}"',
                   "Accept-Ranges": "bytes"}
        if not body:
            h.send_response(200)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                h.send_header(key, value)
            h.end_headers()
            return None
        return h.send_body(200, data, "application/octet-stream", headers)

    @staticmethod
    def _entry(folder: Path, p: Path) -> dict[str, Any]:
        data = p.read_bytes()
        return {"type": "file", "path": str(p.relative_to(folder)), "size": len(data),
                "oid": _blob_id(data)}


def _blob_id(data: bytes) -> str:
    """git's blob id, which the Hub reports as a small file's oid and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
