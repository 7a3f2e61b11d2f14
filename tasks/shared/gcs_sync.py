"""GCS through prefect-gcp's GcsBucket: which bucket, folder syncs, and the object operations
the artifact store needs.

The bucket: a profile's `gcs_block` names a saved GcsBucket block, or is a `gs://bucket[/folder]`
URL (application-default credentials); with neither, `SLM_YOYO_WEIGHTS_GCS_BUCKET` (the variable
the operators set, `bucket`, `bucket/folder` or `gs://bucket/folder`) fills it in at profile
load, for the corpus sync, the run records and the artifact store alike.

`sync_folder` uploads new and changed files only: idempotent (a second sync uploads nothing),
and a failure is reported, never raised past the caller's summary (the local corpus is the
source of truth for the corpus and is never touched). `GcsFolder` is the artifact store's side:
whole-object writes (atomic in GCS: a reader sees the old object or the new one), generation
preconditions, and downloads through a temp file.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from google.cloud.storage.retry import DEFAULT_RETRY
from prefect_gcp import GcpCredentials, GcsBucket

from tasks.records import SyncReport, error_text
from tasks.shared.errors import ConfigError
from tasks.shared.files import replacing

ENV_BUCKET = "SLM_YOYO_WEIGHTS_GCS_BUCKET"


def _md5_b64(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return base64.b64encode(h.digest()).decode()


# GCS bucket names: 3-63 characters (up to 222 with dots), lowercase letters, digits, -, _, .
# https://cloud.google.com/storage/docs/buckets#naming
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def parse_bucket_url(value: str, where: str = ENV_BUCKET) -> tuple[str, str]:
    """`bucket`, `bucket/folder` or `gs://bucket/folder/` → (bucket, folder)."""
    rest = value.strip().removeprefix("gs://").rstrip("/")
    bucket, _, folder = rest.partition("/")
    if not _BUCKET_NAME.fullmatch(bucket):
        raise ConfigError(f"{where}={value!r}: not a GCS bucket — use the bucket's name, "
                          "optionally with gs:// and a folder (gs://my-bucket/nightly)")
    return bucket, folder.strip("/")


def env_bucket() -> str | None:
    """SLM_YOYO_WEIGHTS_GCS_BUCKET as a `gs://bucket[/folder]` reference, or None."""
    value = os.environ.get(ENV_BUCKET, "").strip()
    if not value:
        return None
    bucket, folder = parse_bucket_url(value)
    return f"gs://{bucket}/{folder}" if folder else f"gs://{bucket}"


def gcs_bucket_from_env_or_block(block_name: str | None) -> Any | None:
    """The configured GcsBucket: a saved block by name, or a `gs://bucket[/folder]` reference
    (application-default credentials); without either, SLM_YOYO_WEIGHTS_GCS_BUCKET; else None."""
    ref = block_name or env_bucket()
    if not ref:
        return None
    if not ref.startswith("gs://"):
        return GcsBucket.load(ref)
    bucket, folder = parse_bucket_url(ref, where="gcs_block" if block_name else ENV_BUCKET)
    try:
        creds = GcpCredentials()  # application-default credentials, checked here
    except Exception as e:  # noqa: BLE001 - google.auth's DefaultCredentialsError and kin
        raise ConfigError(f"{ref}: no Google credentials to reach it ({type(e).__name__}: "
                          f"{str(e)[:200]}) — run `gcloud auth application-default login`, set "
                          "GOOGLE_APPLICATION_CREDENTIALS, or name a saved GcsBucket block in "
                          "the profile's gcs_block") from e
    return GcsBucket(bucket=bucket, bucket_folder=folder, gcp_credentials=creds)


def _full(bucket: Any, key: str) -> str:
    """The object name GCS lists for `key` (GcsBucket prepends its bucket_folder)."""
    folder = (bucket.bucket_folder or "").strip("/")
    return f"{folder}/{key}" if folder else key


def sync_folder(local: Path, bucket: Any, prefix: str = "corpus",
                include: tuple[str, ...] | None = None) -> SyncReport:
    """Upload files under `local` whose MD5 differs from (or is missing in) gs://bucket/prefix.
    `include`: only these top-level names under `local` (files or folders)."""
    report = SyncReport(bucket=bucket.bucket, prefix=_full(bucket, prefix), uploaded=0,
                        unchanged=0, error=None)
    try:
        report.uploaded, report.unchanged = GcsFolder(bucket, prefix).push(local, "",
                                                                           include=include)
    except Exception as e:  # noqa: BLE001 - reported in the summary; the local corpus is safe
        report.error = error_text(e)
    return report


def _load(block: str) -> Any:
    """The GcsBucket a profile's gcs_block names (a saved block or gs://bucket[/folder])."""
    return gcs_bucket_from_env_or_block(block)


RECORDS = ("runs", "scorecards", "dead-letter.jsonl")  # under state_dir: what a run leaves


def mirror_records(state_dir: Path, block: str | None) -> SyncReport | None:
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
    with replacing(path) as tmp:
        bucket.download_object_to_path(key, tmp)
    return path


class GcsFolder:
    """One folder of a bucket, objects named relative to it, through google-cloud-storage
    with the GcsBucket's credentials (the block's own helpers have no preconditions)."""

    def __init__(self, bucket: Any, prefix: str) -> None:
        self.bucket_name = bucket.bucket
        self.prefix = _full(bucket, prefix).strip("/")
        client = bucket.gcp_credentials.get_cloud_storage_client()
        self._bucket = client.bucket(bucket.bucket)  # no request: the bucket is not read

    def url(self, key: str = "") -> str:
        return f"gs://{self.bucket_name}/{self.prefix}/{key}".rstrip("/")

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if key else self.prefix

    def list(self, sub: str) -> dict[str, Any]:
        """key → blob (name, md5_hash, generation) for every object under `sub`/ (`sub` "":
        the whole folder)."""
        start = len(self.prefix) + 1
        return {b.name[start:]: b for b in self._bucket.list_blobs(prefix=self._name(sub) + "/")
                if not b.name.endswith("/")}

    def read(self, key: str) -> tuple[bytes, int] | None:
        """(content, generation) of an object, None when there is none."""
        blob = self._bucket.get_blob(self._name(key))
        if blob is None:
            return None
        generation = int(blob.generation)  # (a download refreshes it from response headers)
        # The blob carries its generation: the download reads exactly that version.
        return blob.download_as_bytes(), generation

    def write(self, key: str, data: bytes, if_generation_match: int | None = None) -> None:
        """One whole object. `if_generation_match`: GCS writes only while the live object has
        that generation (0: only if there is none), else answers 412, raised as
        google.api_core.exceptions.PreconditionFailed."""
        blob = self._bucket.blob(self._name(key))
        if if_generation_match is None:  # an unconditional overwrite is idempotent: retry it
            blob.upload_from_string(data, content_type="application/json", retry=DEFAULT_RETRY)
        else:
            blob.upload_from_string(data, content_type="application/json",
                                    if_generation_match=if_generation_match)

    def upload(self, path: Path, key: str) -> None:
        self._bucket.blob(self._name(key)).upload_from_filename(str(path), retry=DEFAULT_RETRY)

    def push(self, local: Path, sub: str, last: str | None = None, skip: tuple[str, ...] = (),
             include: tuple[str, ...] | None = None) -> tuple[int, int]:
        """Upload the files under `local` whose MD5 differs from gs://…/`sub` (the file named
        `last` after every other one; hidden files and `skip` never; with `include`, only these
        top-level names). Returns (uploaded, unchanged)."""
        remote = {k: b.md5_hash for k, b in self.list(sub).items()}
        files = sorted((p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [],
                       key=lambda p: (p.name == last, p.as_posix()))
        uploaded = unchanged = 0
        for path in files:
            rel = path.relative_to(local).as_posix()
            if rel in skip or any(part.startswith(".") for part in rel.split("/")):
                continue
            if include is not None and rel.split("/")[0] not in include:
                continue
            key = f"{sub}/{rel}" if sub else rel
            if remote.get(key) == _md5_b64(path):
                unchanged += 1
                continue
            self.upload(path, key)
            uploaded += 1
        return uploaded, unchanged

    @staticmethod
    def cache(blob: Any, path: Path) -> Path:
        """A listed object at `path`, downloaded unless the file there has its MD5 (through a
        temp file: a half download is never taken for the file)."""
        if not (path.is_file() and _md5_b64(path) == blob.md5_hash):
            with replacing(path) as tmp:
                blob.download_to_filename(str(tmp))
        return path

    def pull(self, sub: str, local: Path) -> int:
        """The objects under `sub`/ into the folder `local`. Returns how many there are."""
        blobs = self.list(sub)
        for key, blob in blobs.items():
            self.cache(blob, local / key[len(sub) + 1:])
        return len(blobs)

    def delete(self, sub: str, first: str | None = None) -> int:
        """Delete the objects under `sub`/, those named `first` before the others."""
        blobs = self.list(sub)
        for key in sorted(blobs, key=lambda k: k.rsplit("/", 1)[-1] != first):
            blobs[key].delete()
        return len(blobs)
