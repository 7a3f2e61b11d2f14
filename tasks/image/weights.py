"""The node image's model folder, built from a source and checked: what the old pipeline's
`vllm-weights-prep.sh` did, run once when the image is built (COMMAND), never at boot.

The source is a local folder or a `gs://bucket/folder` (read through tasks/shared/gcs_sync.py with
application-default credentials); nothing comes from a hub. It holds, by name:

    SOURCE/<basename of model_path>            the 32B GGUF the engine serves
    SOURCE/<basename of tokenizer>/            its tokenizer folder (tokenizer.json, …)
    SOURCE/<name of base_model's repo>/        the training base as an HF folder, e.g.
                                               `hf download allenai/Olmo-3-7B-Think
                                               --local-dir SOURCE/Olmo-3-7B-Think`
    SOURCE/<basename of base_gguf>             the base's GGUF, when the recipe names one

and they land where the node reads them: the GGUF at `model_path`, the tokenizer at `tokenizer`,
the base in the Hugging Face cache layout under `hf_home` (hub/models--org--name/snapshots/
<commit>/ and refs/<revision>), so `from_pretrained(repo, local_files_only=True)` finds it with
HF_HUB_OFFLINE=1, and the base GGUF at `base_gguf`. The commit is the hub's, read from the
metadata `hf download --local-dir` leaves in SOURCE/<name>/.cache/huggingface, else the
revision when it is a commit hash, else a name derived from the file list.

Each file is copied to a temporary file beside its destination and renamed into place, so a
reader never sees half of one; a destination whose size and checksum already equal the
source's is kept (a second run copies nothing; an interrupted one resumes). The checksum is the
sha256 for a local source, and for a GCS object the checksum GCS itself keeps (md5, or crc32c
for composite objects, which have no md5), so an object is never downloaded just to compare.

Then it checks what it built, and `--check` only checks: every file's size and sha256 against
the manifest (`weights-manifest.json` beside the GGUF); the GGUF's magic, that its tensor data
is complete, and its `general.architecture` against the settings' model_architecture; the
tokenizer and the base's config loading in a child process with HF_HUB_OFFLINE=1 and
HF_HOME=hf_home, as the node loads them; the base's architecture against llama.cpp's converter
(tasks/training/convert.py), which must export the adapters trained on it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import google_crc32c

from tasks.image.checks import as_record, run_checks
from tasks.image.layout import COMMAND, WeightsError, WeightsLayout
from tasks.shared.errors import ConfigError
from tasks.shared.files import file_sha256, replacing, write_atomic
from tasks.shared.gcs_sync import GcsFolder, gcs_bucket_from_env_or_block, parse_bucket_url

_COMMIT = re.compile(r"[0-9a-f]{40}")
HF_METADATA = ".cache/huggingface/download"  # what `hf download --local-dir` leaves


# --- sources ----------------------------------------------------------------------------------


class _Entry:
    """One source file: its size, whether a local file already equals it, and a copy."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size = url, size

    def same(self, dest: Path) -> bool:
        raise NotImplementedError

    def copy_to(self, tmp: Path) -> None:
        raise NotImplementedError

    def read_text(self) -> str:
        raise NotImplementedError


class _LocalEntry(_Entry):
    def __init__(self, path: Path) -> None:
        super().__init__(str(path), path.stat().st_size)
        self.path = path

    def same(self, dest: Path) -> bool:
        return dest.stat().st_size == self.size and file_sha256(dest) == file_sha256(self.path)

    def copy_to(self, tmp: Path) -> None:
        with self.path.open("rb") as src, tmp.open("wb") as out:
            while block := src.read(1 << 22):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())

    def read_text(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


class _GcsEntry(_Entry):
    def __init__(self, url: str, blob: Any) -> None:
        super().__init__(url, int(blob.size))
        self.blob = blob

    def same(self, dest: Path) -> bool:
        if dest.stat().st_size != self.size:
            return False
        if self.blob.md5_hash:
            return _b64(dest, hashlib.md5(usedforsecurity=False)) == self.blob.md5_hash
        return _b64(dest, google_crc32c.Checksum()) == self.blob.crc32c

    def copy_to(self, tmp: Path) -> None:
        # google-cloud-storage checks the download against the object's md5/crc32c itself.
        self.blob.download_to_filename(str(tmp))

    def read_text(self) -> str:
        return str(self.blob.download_as_text())


def _files(source: str) -> tuple[str, dict[str, _Entry]]:
    """(what the source is, relative path → entry) for every file under the source."""
    if source.startswith("gs://"):
        if not parse_bucket_url(source, where="--source")[1]:
            raise ConfigError(f"source {source}: name the folder that holds the weights, e.g. "
                              "gs://my-bucket/models")
        gcs = GcsFolder(gcs_bucket_from_env_or_block(source), "")
        try:
            blobs = gcs.list("")
        except Exception as e:  # noqa: BLE001 - google.api_core errors: name the bucket and fix
            raise ConfigError(f"source {source}: cannot list it ({type(e).__name__}: "
                              f"{str(e)[:300]}) — check the bucket name and that these "
                              "credentials may read it (roles/storage.objectViewer)") from e
        return source, {k: _GcsEntry(gcs.url(k), b) for k, b in blobs.items()}
    root = Path(source)
    if not root.is_dir():
        raise ConfigError(f"source {source}: not a folder — pass the folder (or "
                          "gs://bucket/folder) that holds the GGUF, the tokenizer folder and "
                          "the base model folder (docs/operator-gcp.md, section 3)")
    return str(root.resolve()), {p.relative_to(root).as_posix(): _LocalEntry(p)
                                 for p in sorted(root.rglob("*")) if p.is_file()}


def _under(files: dict[str, _Entry], sub: str) -> dict[str, _Entry]:
    """The files under `sub`/, by path relative to it, hidden ones (.cache, .git) left out."""
    out = {k[len(sub) + 1:]: e for k, e in files.items() if k.startswith(sub + "/")}
    return {k: e for k, e in out.items() if not any(p.startswith(".") for p in k.split("/"))}


# --- copying ----------------------------------------------------------------------------------


def _b64(path: Path, h: Any) -> str:
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return base64.b64encode(h.digest()).decode()


def _place(entry: _Entry, dest: Path, log: Any) -> dict[str, Any]:
    """Copy one file into place (files.replacing) unless an equal one is there already."""
    kept = dest.is_file() and entry.same(dest)
    if not kept:
        with replacing(dest) as tmp:
            entry.copy_to(tmp)
            if tmp.stat().st_size != entry.size:
                raise WeightsError(f"{entry.url}: copied {tmp.stat().st_size} bytes of "
                                   f"{entry.size} — the disk at {dest.parent} may be full; "
                                   f"free space and run `{COMMAND}` again (it resumes)")
    log(f"{'kept  ' if kept else 'copied'} {dest} ({entry.size:,} bytes)")
    return {"path": str(dest), "size": entry.size, "sha256": file_sha256(dest),
            "source": entry.url, "copied": not kept}


def _snapshot_name(layout: WeightsLayout, base: dict[str, _Entry],
                   files: dict[str, _Entry], sub: str) -> str:
    """The snapshot folder's name: the hub commit when the source knows it (module docstring)."""
    if _COMMIT.fullmatch(layout.revision):
        return layout.revision
    for key, entry in sorted(files.items()):
        if key.startswith(f"{sub}/{HF_METADATA}/") and key.endswith(".metadata"):
            first = entry.read_text().splitlines()[:1]
            if first and _COMMIT.fullmatch(first[0].strip()):
                return first[0].strip()
    listing = "\n".join(f"{k}\0{e.size}" for k, e in sorted(base.items()))
    return hashlib.sha1(f"{layout.base_model}\n{listing}".encode(),
                        usedforsecurity=False).hexdigest()


def prepare_weights(source: str | Path, layout: WeightsLayout,
                    log: Any = print) -> dict[str, Any]:
    """Build the model folder from `source` (module docstring), check it, and write its
    manifest. Returns the manifest; raises WeightsError with every failing check."""
    src, files = _files(str(source))
    base_sub = layout.repo.split("/")[1]
    tok, base = _under(files, layout.tokenizer.name), _under(files, base_sub)
    missing = [f"{what}: {src}/{name}" for what, name, there in [
        ("the GGUF (model_path)", layout.model_path.name, layout.model_path.name in files),
        ("the tokenizer folder (tokenizer)", layout.tokenizer.name + "/", bool(tok)),
        (f"the training base {layout.repo} (an HF folder)", base_sub + "/", bool(base)),
        ("the base's GGUF (the recipe's base_gguf)", layout.base_gguf.name if layout.base_gguf
         else "", not layout.base_gguf or layout.base_gguf.name in files)] if not there]
    if base and "config.json" not in base:
        missing.append(f"the base's config.json: {src}/{base_sub}/config.json")
    if missing:
        raise ConfigError(f"source {src} lacks " + "; ".join(missing) + " — put them there "
                           "under these names (docs/operator-gcp.md, section 3), or fix "
                           "[compute.node] model_path / tokenizer and the recipe's base_model / "
                           "base_gguf")
    snapshot = layout.cache_repo_dir / "snapshots" / _snapshot_name(layout, base, files,
                                                                     base_sub)
    copied: dict[str, Any] = {
        "model": _place(files[layout.model_path.name], layout.model_path, log),
        "tokenizer": [_place(e, layout.tokenizer / k, log) for k, e in sorted(tok.items())],
        "base": [_place(e, snapshot / k, log) for k, e in sorted(base.items())]}
    if layout.base_gguf:
        copied["base_gguf"] = _place(files[layout.base_gguf.name], layout.base_gguf, log)
    if not _COMMIT.fullmatch(layout.revision):  # written last: until then the cache has no base
        write_atomic(layout.cache_repo_dir / "refs" / layout.revision, snapshot.name)
    checks = run_checks(layout)
    failed = [c for c in checks if c.failed]
    for c in checks:
        log(c.line())
    if failed:
        raise WeightsError(f"the model folder built from {src} fails {len(failed)} check(s): "
                           + "; ".join(c.line() for c in failed))
    manifest = {"schema": 1, "prepared_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "source": src, "layout": _layout_dict(layout), "snapshot": str(snapshot),
                "files": copied, "checks": [as_record(c) for c in checks]}
    write_atomic(layout.manifest_path, json.dumps(manifest, indent=1) + "\n")
    log(f"manifest: {layout.manifest_path}")
    return manifest


def _layout_dict(layout: WeightsLayout) -> dict[str, str | None]:
    return {"model_path": str(layout.model_path), "model_architecture":
            layout.model_architecture, "tokenizer": str(layout.tokenizer), "hf_home":
            str(layout.hf_home), "base_model": layout.base_model,
            "base_gguf": str(layout.base_gguf) if layout.base_gguf else None}

