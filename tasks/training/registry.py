"""The artifact store and adapter registry.

    <root>/adapters/<name>/manifest.json   the job manifest (state, params, losses, files)
                           peft/           adapter_config.json + adapter_model.safetensors (vLLM)
                           adapter.tar.gz  the same, packed
                           adapter.gguf    llama.cpp LoRA adapter
                           loss.png, losses.json, verify.json
    <root>/checkpoints/<run digest>/checkpoint-N   resumable Trainer checkpoints
    <root>/promoted/<bucket>.json          PromotedPointer: {"current": name | null, "history": [...]}

Without a bucket, <root> is a local folder and the whole truth. With one (the profile's
`gcs_block`: a saved GcsBucket block or gs://bucket[/folder], else SLM_YOYO_WEIGHTS_GCS_BUCKET),
the same layout under gs://bucket/[folder/]artifacts/ is the truth and <root> is a cache: a
node in another zone starts with an empty disk and decides as every other one does.

- manifests: written to <root> and GCS on every write; read (show, list) from GCS. A manifest
  that says `done` is written after its adapter's files are in GCS;
- checkpoints: uploaded as the Trainer saves them, trainer_state.json last (a checkpoint is
  complete only with it), rotated ones removed; `restore` brings the newest complete one of a
  run digest into the cache before training, so the run resumes wherever it runs;
- promoted pointers: read from GCS; written with a generation precondition (GCS refuses a write
  over a pointer that changed since it was read, 412), so two promoters cannot both win: a
  promotion re-reads and applies itself again, a rollback reports the conflict;
- adapter files: `fetch` brings what a reader needs (the promoted adapter's peft/ for the gate,
  its adapter.gguf for serving) into the cache; `download` copies an adapter anywhere.

Manifests and pointers are written atomically (a local rename; a GCS object is replaced whole):
a reader never sees half a file.
"""

from __future__ import annotations

import shutil
import tarfile
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from google.api_core.exceptions import PreconditionFailed

from tasks.records import (
    STATES,
    AdapterManifest,
    CheckpointCopy,
    PastPromotion,
    PromotedPointer,
    Promotion,
    error_text,
)
from tasks.shared.errors import ConfigError
from tasks.shared.files import replacing, write_atomic
from tasks.shared.gcs_sync import GcsFolder, gcs_bucket_from_env_or_block
from tasks.training.train import checkpoint_step, latest_checkpoint

__all__ = ["STATES", "AdapterManifest", "ArtifactStore", "gate", "now", "pack"]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ArtifactStore:
    """The store at `root`; with `gcs_block` (a saved GcsBucket block or gs://bucket[/folder])
    GCS is its truth and `root` a cache (the module docstring says what lives where)."""

    def __init__(self, root: Path | str, gcs_block: str | None = None) -> None:
        self.root = Path(root)
        self.gcs_block = gcs_block
        self._pushed: set[str] = set()  # adapters whose files are in GCS (nothing changes after done)

    @cached_property
    def remote(self) -> GcsFolder | None:
        """gs://…/artifacts, the truth when a bucket is configured (None: local only)."""
        if not self.gcs_block:
            return None
        return GcsFolder(gcs_bucket_from_env_or_block(self.gcs_block), "artifacts")

    @property
    def where(self) -> str:
        return self.remote.url() if self.remote else str(self.root)

    # --- layout ---
    def adapter_dir(self, name: str) -> Path:
        return self.root / "adapters" / name

    def checkpoint_dir(self, run_digest: str) -> Path:
        return self.root / "checkpoints" / run_digest

    def _pointer(self, bucket: str) -> Path:
        return self.root / "promoted" / f"{bucket}.json"

    # --- manifests ---
    def write_manifest(self, manifest: AdapterManifest) -> Path:
        path = manifest.save(self.adapter_dir(manifest.name) / "manifest.json")
        if self.remote:
            sub = f"adapters/{manifest.name}"
            # What a `done` manifest lists is there before it. Once: after `done` only the
            # manifest changes (gate, promotion), and each push hashes every adapter file.
            if manifest.state == "done" and manifest.name not in self._pushed:
                self.remote.push(self.adapter_dir(manifest.name), sub, skip=("manifest.json",))
                self._pushed.add(manifest.name)
            self.remote.write(f"{sub}/manifest.json", path.read_bytes())
        return path

    def manifest(self, name: str) -> AdapterManifest:
        path = self.adapter_dir(name) / "manifest.json"
        found = path.is_file()
        if self.remote:
            got = self.remote.read(f"adapters/{name}/manifest.json")
            found = got is not None
            if got is not None:
                write_atomic(path, got[0].decode())
        if not found:
            known = [m.name for m in self.list()][:10]
            raise ConfigError(f"adapter {name!r}: no manifest at {self.where}/adapters/{name}/"
                              f"manifest.json — known adapters: {known or 'none'} "
                              "(slm-nightly adapters list)")
        return AdapterManifest.load(path)

    def list(self, bucket: str | None = None) -> list[AdapterManifest]:
        """Every adapter's manifest (of one bucket), oldest first. A manifest that does not
        read (another schema version, a misspelled key) raises RecordError naming it."""
        out = []
        if self.remote:
            blobs = self.remote.list("adapters")
            paths = [self.remote.cache(blobs[k], self.root / k) for k in sorted(blobs)
                     if k.count("/") == 2 and k.endswith("/manifest.json")]
        else:
            paths = sorted((self.root / "adapters").glob("*/manifest.json"))
        for path in paths:
            m = AdapterManifest.load(path)
            if bucket is None or m.bucket == bucket:
                out.append(m)
        return sorted(out, key=lambda m: m.created)

    # --- promotion ---
    def pointer(self, bucket: str) -> PromotedPointer:
        return self._read_pointer(bucket)[0]

    def _read_pointer(self, bucket: str) -> tuple[PromotedPointer, int]:
        """The pointer and its GCS generation (0: none yet, the precondition for creating it)."""
        path = self._pointer(bucket)
        if self.remote:
            got = self.remote.read(f"promoted/{bucket}.json")
            if got is None:
                path.unlink(missing_ok=True)
                return PromotedPointer(), 0
            write_atomic(path, got[0].decode())
            return PromotedPointer.model_validate_json(got[0]), got[1]
        return (PromotedPointer.model_validate_json(path.read_bytes()) if path.is_file()
                else PromotedPointer()), 0

    def _write_pointer(self, bucket: str, ptr: PromotedPointer, generation: int) -> bool:
        """False when GCS refused it: the pointer changed since it was read (`generation`)."""
        text = ptr.to_json()
        if self.remote:
            try:
                self.remote.write(f"promoted/{bucket}.json", text.encode(),
                                  if_generation_match=generation)
            except PreconditionFailed:
                return False
        write_atomic(self._pointer(bucket), text)
        return True

    def promoted(self, bucket: str) -> AdapterManifest | None:
        """The promoted adapter's manifest for a bucket, or None."""
        name = self.pointer(bucket).current
        return self.manifest(name) if name else None

    def promote(self, name: str, reason: str) -> PromotedPointer:
        m = self.manifest(name)
        if m.state != "done" or m.verified is False:
            raise ConfigError(f"adapter {name}: state {m.state!r}, verified "
                              f"{m.verified!r} — only a finished adapter that passed "
                              "verification (or has no GGUF to verify) can be promoted")
        for _ in range(5):  # another writer won the pointer: apply this promotion to its result
            ptr, generation = self._read_pointer(m.bucket)
            if ptr.current == name:
                return ptr
            past = [PastPromotion(name=ptr.current, until=now())] if ptr.current else []
            ptr = PromotedPointer(current=name, since=now(), reason=reason,
                                  history=past + ptr.history)
            if self._write_pointer(m.bucket, ptr, generation):
                break
        else:
            raise ConfigError(f"adapter {name}: the {m.bucket} pointer at {self.where} changed "
                              "under each of 5 attempts to promote — another writer keeps "
                              "promoting; run it again when that has stopped")
        m.promotions.append(Promotion(at=now(), reason=reason))
        self.write_manifest(m)
        return ptr

    def rollback(self, bucket: str) -> PromotedPointer:
        """Back to the adapter promoted before the current one (or to the base model)."""
        ptr, generation = self._read_pointer(bucket)
        if not ptr.current:
            raise ConfigError(f"bucket {bucket!r}: nothing is promoted, nothing to roll back")
        previous = ptr.history[0].name if ptr.history else None
        ptr = PromotedPointer(current=previous, since=now(), history=ptr.history[1:],
                              reason=f"rollback from {ptr.current}")
        if not self._write_pointer(bucket, ptr, generation):  # retrying would roll back twice
            raise ConfigError(f"bucket {bucket!r}: the pointer at {self.where} changed while "
                              "rolling back (another promotion or rollback wrote first) — "
                              "nothing was rolled back; check `slm-nightly adapters list` and "
                              "roll back again if that is still wanted")
        return ptr

    def serving(self, bucket: str) -> Path | None:
        """The GGUF adapter of the promoted adapter for `bucket` (None: serve the base)."""
        m = self.promoted(bucket)
        if not m:
            return None
        gguf = self.fetch(m.name, "adapter.gguf")
        return gguf if gguf.is_file() else None

    # --- adapter files ---
    def fetch(self, name: str, rel: str) -> Path:
        """An adapter's file or folder (`peft`, `adapter.gguf`) in the local folder, brought
        from GCS first when a bucket is configured (unchanged files are not downloaded)."""
        local = self.adapter_dir(name) / rel
        if self.remote:
            sub = f"adapters/{name}"
            for key, blob in self.remote.list(sub).items():
                if key == f"{sub}/{rel}" or key.startswith(f"{sub}/{rel}/"):
                    self.remote.cache(blob, self.root / key)
        return local

    def download(self, name: str, dest: Path) -> Path:
        """Every file of an adapter (manifest, peft/, GGUF, tarball…) into the folder `dest`."""
        self.manifest(name)  # an unknown name fails here, naming the known ones
        if self.remote:
            self.remote.pull(f"adapters/{name}", dest)
        else:
            shutil.copytree(self.adapter_dir(name), dest, dirs_exist_ok=True)
        return dest

    # --- checkpoints ---
    def save_checkpoint(self, path: Path | str) -> CheckpointCopy | None:
        """Upload a checkpoint the Trainer has just saved, trainer_state.json last, then remove
        the remote copies of the checkpoints it rotated away. Never raises (training goes on
        with the local copy): the report's `error` says what failed. None without a bucket."""
        if not self.remote:
            return None
        ckpt = Path(path)
        sub = f"checkpoints/{ckpt.parent.name}"
        report = CheckpointCopy(checkpoint=ckpt.name)
        try:
            report.uploaded, _ = self.remote.push(ckpt, f"{sub}/{ckpt.name}",
                                                  last="trainer_state.json")
            kept = {p.name for p in ckpt.parent.glob("checkpoint-*")}
            for old in sorted({k.split("/")[2] for k in self.remote.list(sub)} - kept):
                self.remote.delete(f"{sub}/{old}", first="trainer_state.json")
                report.removed.append(old)
        except Exception as e:  # noqa: BLE001 - reported; the local checkpoint is kept
            report.error = error_text(e)
        return report

    def restore(self, run_digest: str) -> str | None:
        """Bring the run digest's newest complete checkpoint from GCS into the local folder
        when it is newer than the newest one there. Returns its name, or None."""
        if not self.remote:
            return None
        sub = f"checkpoints/{run_digest}"
        complete = [k.split("/")[2] for k in self.remote.list(sub)
                    if k.count("/") == 3 and k.endswith("/trainer_state.json")]
        if not complete:
            return None
        newest = max(complete, key=checkpoint_step)
        local = latest_checkpoint(self.checkpoint_dir(run_digest))
        if local is not None and checkpoint_step(local.name) >= checkpoint_step(newest):
            return None
        part = self.checkpoint_dir(run_digest) / f".{newest}.part"  # never taken for a checkpoint
        shutil.rmtree(part, ignore_errors=True)
        self.remote.pull(f"{sub}/{newest}", part)
        shutil.rmtree(self.checkpoint_dir(run_digest) / newest, ignore_errors=True)
        part.rename(self.checkpoint_dir(run_digest) / newest)
        return newest

    def drop_checkpoints(self, run_digest: str) -> str | None:
        """Delete a run digest's checkpoints, here and in GCS. Returns what failed, or None."""
        shutil.rmtree(self.checkpoint_dir(run_digest), ignore_errors=True)
        if self.remote:
            try:
                self.remote.delete(f"checkpoints/{run_digest}", first="trainer_state.json")
            except Exception as e:  # noqa: BLE001 - returned for the caller to report
                return f"{type(e).__name__}: {str(e)[:300]}"
        return None


def gate(losses: dict[str, float], margin: float) -> tuple[bool, str]:
    """Promote only when the new adapter's held-out loss beats the base's and the promoted
    adapter's by `margin` (a fraction: 0.01 = 1 % lower)."""
    new = losses["new"]
    rivals = {k: v for k, v in losses.items() if k in ("base", "promoted")}
    for rival, value in rivals.items():
        if not new < value * (1 - margin):
            return False, (f"eval loss {new:.4f} does not beat the {rival} model's {value:.4f} "
                           f"by {margin:.1%} — kept, not promoted")
    best = ", ".join(f"{k} {v:.4f}" for k, v in rivals.items())
    return True, f"eval loss {new:.4f} beats {best} by at least {margin:.1%}"


def pack(folder: Path, out: Path) -> Path:
    with replacing(out) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(folder.iterdir()):
            tar.add(f, arcname=f"{folder.name}/{f.name}")
    return out
