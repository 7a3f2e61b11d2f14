"""The artifact store and adapter registry.

A local folder by default (mirrored to a GcsBucket in production):

    <root>/adapters/<name>/manifest.json   the job manifest (state, params, losses, files)
                           peft/           adapter_config.json + adapter_model.safetensors (vLLM)
                           adapter.tar.gz  the same, packed
                           adapter.gguf    llama.cpp LoRA adapter
                           loss.png, losses.json, verify.json
    <root>/checkpoints/<run digest>/checkpoint-N   resumable Trainer checkpoints
    <root>/promoted/<bucket>.json          {"current": name | null, "history": [...]}

Manifests and pointers are written atomically; a reader never sees half a file.
"""

from __future__ import annotations

import json
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tasks.errors import ConfigError
from tasks.files import write_atomic
from tasks.records import STATES, AdapterManifest, Promotion

__all__ = ["STATES", "AdapterManifest", "ArtifactStore", "gate", "now", "pack"]


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ArtifactStore:
    def __init__(self, root: Path | str, gcs_block: str | None = None) -> None:
        self.root = Path(root)
        self.gcs_block = gcs_block

    # --- layout ---
    def adapter_dir(self, name: str) -> Path:
        return self.root / "adapters" / name

    def checkpoint_dir(self, run_digest: str) -> Path:
        return self.root / "checkpoints" / run_digest

    def _pointer(self, bucket: str) -> Path:
        return self.root / "promoted" / f"{bucket}.json"

    # --- manifests ---
    def write_manifest(self, manifest: AdapterManifest) -> Path:
        return manifest.save(self.adapter_dir(manifest.name) / "manifest.json")

    def manifest(self, name: str) -> AdapterManifest:
        path = self.adapter_dir(name) / "manifest.json"
        if not path.is_file():
            known = [m.name for m in self.list()][:10]
            raise ConfigError(f"adapter {name!r}: no manifest at {path} — known adapters: "
                              f"{known or 'none'} (slm-nightly adapters list)")
        return AdapterManifest.load(path)

    def list(self, bucket: str | None = None) -> list[AdapterManifest]:
        """Every adapter's manifest (of one bucket), oldest first. A manifest that does not
        read (another schema version, a misspelled key) raises RecordError naming it."""
        out = []
        for path in sorted((self.root / "adapters").glob("*/manifest.json")):
            m = AdapterManifest.load(path)
            if bucket is None or m.bucket == bucket:
                out.append(m)
        return sorted(out, key=lambda m: m.created)

    # --- promotion ---
    def pointer(self, bucket: str) -> dict[str, Any]:
        path = self._pointer(bucket)
        return json.loads(path.read_text()) if path.is_file() else {"current": None, "history": []}

    def promoted(self, bucket: str) -> AdapterManifest | None:
        """The promoted adapter's manifest for a bucket, or None."""
        name = self.pointer(bucket).get("current")
        return self.manifest(name) if name else None

    def promote(self, name: str, reason: str) -> dict[str, Any]:
        m = self.manifest(name)
        if m.state != "done" or m.verified is False:
            raise ConfigError(f"adapter {name}: state {m.state!r}, verified "
                              f"{m.verified!r} — only a finished adapter that passed "
                              "verification (or has no GGUF to verify) can be promoted")
        ptr = self.pointer(m.bucket)
        if ptr.get("current") == name:
            return ptr
        ptr["history"] = ([{"name": ptr["current"], "until": now()}] if ptr.get("current")
                          else []) + ptr.get("history", [])
        ptr.update(current=name, since=now(), reason=reason)
        write_atomic(self._pointer(m.bucket), json.dumps(ptr, indent=2))
        m.promotions.append(Promotion(at=now(), reason=reason))
        self.write_manifest(m)
        return ptr

    def rollback(self, bucket: str) -> dict[str, Any]:
        """Back to the adapter promoted before the current one (or to the base model)."""
        ptr = self.pointer(bucket)
        if not ptr.get("current"):
            raise ConfigError(f"bucket {bucket!r}: nothing is promoted, nothing to roll back")
        history = ptr.get("history", [])
        previous = history[0]["name"] if history else None
        ptr = {"current": previous, "since": now(), "history": history[1:],
               "reason": f"rollback from {ptr['current']}"}
        write_atomic(self._pointer(bucket), json.dumps(ptr, indent=2))
        return ptr

    def serving(self, bucket: str) -> Path | None:
        """The GGUF adapter of the promoted adapter for `bucket` (None: serve the base)."""
        m = self.promoted(bucket)
        if not m:
            return None
        gguf = self.adapter_dir(m.name) / "adapter.gguf"
        return gguf if gguf.is_file() else None

    # --- mirror ---
    def mirror(self, sub: str) -> dict[str, Any] | None:
        """Upload new/changed files under <root>/<sub> to the GcsBucket, if one is configured."""
        if not self.gcs_block:
            return None
        from tasks.gcs_sync import gcs_bucket_from_env_or_block, sync_folder

        bucket = gcs_bucket_from_env_or_block(self.gcs_block)
        return sync_folder(self.root / sub, bucket, prefix=f"artifacts/{sub}")


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
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(folder.iterdir()):
            tar.add(f, arcname=f"{folder.name}/{f.name}")
    tmp.replace(out)
    return out
