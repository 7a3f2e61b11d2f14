"""Files written so that readers and crashes never see half of one, and their digests.

The one place for both: every write that replaces a file goes through `replacing` (or its
text/bytes form `write_atomic`), and every content digest through `sha256_hex` /
`file_sha256`. Also the one machine-wide lock on a file, `locked`.
"""

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def sha256_hex(data: bytes | str, length: int | None = None) -> str:
    """sha256 of `data` (str as UTF-8) in hex, cut to `length` characters when given."""
    raw = data.encode() if isinstance(data, str) else data
    digest = hashlib.sha256(raw).hexdigest()
    return digest[:length] if length else digest


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _new_file_mode(path: Path) -> int:
    """The mode `path` keeps (when it exists) or a plain open() would give it: mkstemp makes
    its files 0600, which must not leak into what replaces an ordinary file."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextmanager
def replacing(path: Path, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path` for the caller to write (a file, by any means:
    a download, a converter's output). When the block ends without an error the temporary
    file is fsynced, given `mode` (default: the mode `path` has, or the one open() would
    give it — pass 0o755 for an executable, as the writer's own chmod is overridden), and
    renamed over `path`, and the folder fsynced; on an error it is removed and `path` is
    left as it was. Readers, and a crash, see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, _new_file_mode(path) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` (str as UTF-8) through `replacing`."""
    with replacing(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One holder at a time on this machine: an exclusive flock on `path` (created, with its
    folder), waited for; it goes with its process, so a killed holder frees it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
