"""The reports of copies to GCS (tasks/shared/gcs_sync.py, the artifact store): what was uploaded, and
the error that stopped it. A copy never raises past its caller: the local files stand, and the
report's `error` says what failed."""

from __future__ import annotations

from tasks.records.base import _Strict


def error_text(e: BaseException, limit: int = 300) -> str:
    """A copy's error as its reports keep it: the exception's type and the start of its text."""
    return f"{type(e).__name__}: {str(e)[:limit]}"


class SyncReport(_Strict):
    """A folder synced to gs://bucket/prefix (sync_folder): files uploaded (new or changed) and
    left (the same MD5 there). Without a bucket (it could not be loaded) only `error` is set."""

    bucket: str | None = None
    prefix: str | None = None
    uploaded: int = 0
    unchanged: int = 0
    error: str | None = None

    @classmethod
    def failed(cls, e: BaseException, limit: int = 300) -> SyncReport:
        return cls(error=error_text(e, limit))


class CheckpointCopy(_Strict):
    """A training checkpoint copied to the artifact store's bucket (ArtifactStore
    save_checkpoint), and the rotated-away checkpoints whose copies it removed."""

    checkpoint: str
    uploaded: int = 0
    removed: list[str] = []
    error: str | None = None
