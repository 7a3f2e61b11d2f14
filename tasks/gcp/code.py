"""The checkout the GCP VMs install, through the project's bucket: nothing is cloned.

`gcp orchestrator` and `gcp image build` pack the checkout they run from, as a clone of it would
look with your edits in it (`git ls-files --cached --others --exclude-standard`: tracked files
and new ones .gitignore lets through, so an uncommitted profile with the project's values goes
along and never has to be committed), into one gzip'd tar named by a digest of its files,
and upload it once to gs://BUCKET/code/checkout-<version>.tar.gz. The VM's startup script
fetches it with curl (`fetch_function`): an access token for the VM's service account from the
metadata server, then the Cloud Storage JSON API's media download (cloud.google.com/compute/
docs/access/authenticate-workloads, cloud.google.com/storage/docs/json_api/v1/objects/get);
it checks the sha256 and unpacks. The repository may be private: the VMs never reach it.

The archive is byte-for-byte the same for the same files (sorted, owner root, mode 644 or 755,
time 0, gzip without a time), so its sha256 can be rendered into the script; the script
unpacks with --touch, so `make` sees every file as newer than the last install.
"""

from __future__ import annotations

import gzip
import io
import shlex
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.api_core.exceptions import PreconditionFailed

from tasks.gcp.reconcile import GcpError
from tasks.shared.files import sha256_hex

STORAGE = "https://storage.googleapis.com"
API = f"{STORAGE}/storage/v1"
TOKEN_URL = ("http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/"
             "default/token")
VERSION_CHARS = 16


@dataclass(frozen=True)
class Checkout:
    """One packed checkout: its files, the tar.gz's bytes and where it goes in the bucket."""

    bucket: str
    files: tuple[str, ...] = field(repr=False)
    data: bytes = field(repr=False)

    @property
    def sha256(self) -> str:
        return sha256_hex(self.data)

    @property
    def version(self) -> str:
        return self.sha256[:VERSION_CHARS]

    @property
    def name(self) -> str:
        return f"code/checkout-{self.version}.tar.gz"

    def describe(self) -> str:
        return (f"gs://{self.bucket}/{self.name} ({len(self.files)} files, "
                f"{len(self.data) / 1e6:.1f} MB)")


def checkout_files(root: Path) -> list[str]:
    """What a clone of `root` holds plus its uncommitted files (paths relative to root)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        said = getattr(e, "stderr", b"").decode().strip() or str(e)
        raise GcpError(f"{root}: not a git checkout of slm-nightly ({said}) — run the command "
                       "in your checkout, where the VMs' code comes from") from e
    # a tracked file deleted in the working tree is not packed: the VM gets the tree as it is
    return sorted(p for p in out.decode().split("\0") if p and (root / p).is_file())


def pack(root: Path, bucket: str) -> Checkout:
    """The checkout under `root` as a reproducible tar.gz (module docstring)."""
    root = Path(root).resolve()
    names = checkout_files(root)
    if "Makefile" not in names or "pyproject.toml" not in names:
        raise GcpError(f"{root}: no Makefile and pyproject.toml — run the command in your "
                       "slm-nightly checkout, where the VMs' code comes from")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            path = root / name
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o755 if path.stat().st_mode & 0o100 else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)
    return Checkout(bucket, tuple(names), gzip.compress(raw.getvalue(), mtime=0))


def push(checkout: Checkout, clients: Any) -> bool:
    """Upload the archive unless the bucket has it (its name is its content); whether it
    uploaded."""
    blob = clients.storage.bucket(checkout.bucket).blob(checkout.name)
    try:
        blob.upload_from_string(checkout.data, content_type="application/gzip",
                                if_generation_match=0)
    except PreconditionFailed:
        return False  # the same files, uploaded before
    return True


def fetch_function(checkout: Checkout) -> str:
    """The bash functions `gcs_token` and `fetch_code DIR` that the VMs' startup scripts call:
    the archive from
    the bucket (module docstring), checked, unpacked into DIR; its version in DIR/.code-version
    and its files in DIR/.code-files, so the next checkout deletes those it no longer has.
    Each failure returns non-zero with curl's or sha256sum's message."""
    q = shlex.quote
    url = f"{API}/b/{checkout.bucket}/o/{checkout.name.replace('/', '%2F')}?alt=media"
    return f"""\
# gcs_token: an access token of the VM's service account, from the metadata server
gcs_token() {{
  local token
  token=$(curl -sSf --retry 5 -H 'Metadata-Flavor: Google' {q(TOKEN_URL)} \\
    | sed -n 's/.*"access_token" *: *"\\([^"]*\\)".*/\\1/p') || return 1
  [ -n "$token" ] || {{ echo "gcs_token: no access token from the metadata server" >&2; return 1; }}
  echo "$token"
}}
# fetch_code DIR: the checkout {checkout.version} from gs://{checkout.bucket}/{checkout.name}
# (tasks/gcp/code.py), as the VM's service account, checked and unpacked into DIR
fetch_code() {{
  local token archive
  archive=$(mktemp) || return 1
  token=$(gcs_token) || return 1
  curl -sSf --retry 5 -H "Authorization: Bearer $token" -o "$archive" {q(url)} || {{
    echo "fetch_code: could not download gs://{checkout.bucket}/{checkout.name} (the VM's \\
account needs storage.objects.get on the bucket: gcp setup grants it)" >&2; rm -f "$archive"
    return 1; }}
  echo "{checkout.sha256}  $archive" | sha256sum --check --quiet - || {{ rm -f "$archive"
    return 1; }}
  mkdir -p "$1" || return 1
  if [ -f "$1/.code-files" ]; then  # the checkout this one replaces: its files not in this one go
    tar -tzf "$archive" | sort > "$archive.files" || return 1
    sort "$1/.code-files" | comm -23 - "$archive.files" | while IFS= read -r f; do
      rm -f -- "$1/$f"; done
    rm -f "$archive.files"
  fi
  tar -xzf "$archive" -C "$1" --touch --no-same-owner || return 1
  tar -tzf "$archive" > "$1/.code-files" && echo {checkout.version} > "$1/.code-version"
  rm -f "$archive"
}}"""
