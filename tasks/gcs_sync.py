"""Sync the corpus folder to GCS through prefect-gcp's GcsBucket: new and changed files only.

Idempotent (a second sync uploads nothing), and a failure is reported, never raised past the
caller's summary: the local corpus is the source of truth and is never touched.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

ENV_BUCKET = "SLM_YOYO_WEIGHTS_GCS_BUCKET"


def _md5_b64(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.b64encode(h.digest()).decode()


def gcs_bucket_from_env_or_block(block_name: str | None) -> Any | None:
    """The configured GcsBucket: a saved block by name, else the bucket named by
    SLM_YOYO_WEIGHTS_GCS_BUCKET with application-default credentials, else None."""
    from prefect_gcp import GcpCredentials, GcsBucket

    if block_name:
        return GcsBucket.load(block_name)
    name = os.environ.get(ENV_BUCKET)
    if name:
        return GcsBucket(bucket=name, gcp_credentials=GcpCredentials())
    return None


def _full(bucket: Any, key: str) -> str:
    """The object name GCS lists for `key` (GcsBucket prepends its bucket_folder)."""
    folder = (bucket.bucket_folder or "").strip("/")
    return f"{folder}/{key}" if folder else key


def sync_folder(local: Path, bucket: Any, prefix: str = "corpus",
                include: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Upload files under `local` whose MD5 differs from (or is missing in) gs://bucket/prefix.
    `include`: only these top-level names under `local` (files or folders)."""
    report: dict[str, Any] = {"bucket": bucket.bucket, "prefix": _full(bucket, prefix),
                              "uploaded": 0, "unchanged": 0, "error": None}
    try:
        remote = {b.name: b.md5_hash for b in bucket.list_blobs(prefix)}
        for path in sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else []:
            rel = path.relative_to(local).as_posix()
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            if include is not None and rel.split("/")[0] not in include:
                continue
            key = f"{prefix}/{rel}"
            if remote.get(_full(bucket, key)) == _md5_b64(path):
                report["unchanged"] += 1
                continue
            bucket.upload_from_path(path, key)
            report["uploaded"] += 1
    except Exception as e:  # noqa: BLE001 - reported in the summary; the local corpus is safe
        report["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return report


def _load(block: str) -> Any:
    from prefect_gcp import GcsBucket

    return GcsBucket.load(block)


RECORDS = ("runs", "scorecards", "dead-letter.jsonl")  # under state_dir: what a run leaves


def mirror_records(state_dir: Path, block: str | None) -> dict[str, Any] | None:
    """Copy the run records — summaries, scorecards, dead-letter file — to gs://…/records."""
    if not block:
        return None
    return sync_folder(state_dir, _load(block), prefix="records",
                       include=RECORDS)


def upload_file(block: str, path: Path, key: str) -> str:
    """Upload one file (skipped when the remote copy has the same MD5); returns gs://…/key."""
    bucket = _load(block)
    full = _full(bucket, key)
    remote = {b.name: b.md5_hash for b in bucket.list_blobs(key)}
    if remote.get(full) != _md5_b64(path):
        bucket.upload_from_path(path, key)
    return f"gs://{bucket.bucket}/{full}"


def download_file(block: str, key: str, path: Path) -> Path:
    """Fetch one object (through a temp file, so a half download is never taken for data)."""
    bucket = _load(block)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    bucket.download_object_to_path(key, tmp)
    tmp.replace(path)
    return path
