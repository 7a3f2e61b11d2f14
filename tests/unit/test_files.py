"""Atomic replacement and digests (tasks/shared/files.py)."""

import hashlib

import pytest

from tasks.shared.files import file_sha256, replacing, sha256_hex, write_atomic


def test_write_atomic_text_and_bytes(tmp_path):
    p = tmp_path / "a" / "b.txt"
    write_atomic(p, "héllo")
    assert p.read_bytes() == "héllo".encode()
    write_atomic(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert [x.name for x in p.parent.iterdir()] == ["b.txt"]


def test_replacing_leaves_the_old_file_on_error(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_text("old")
    with pytest.raises(RuntimeError), replacing(p) as tmp:
        tmp.write_text("half")
        raise RuntimeError("converter died")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["model.gguf"]


def test_digests(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_sha256(p) == expected == sha256_hex("abc") == sha256_hex(b"abc")
    assert sha256_hex("abc", 16) == expected[:16]
    assert hashlib.sha256(b"abc").hexdigest() == expected


def test_a_replaced_file_keeps_an_ordinary_mode(tmp_path):
    import os

    umask = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.json"
        write_atomic(fresh, "{}")
        assert fresh.stat().st_mode & 0o777 == 0o644  # what open() would have made
        kept = tmp_path / "kept.sh"
        kept.write_text("old")
        kept.chmod(0o750)
        write_atomic(kept, "new")
        assert kept.stat().st_mode & 0o777 == 0o750
    finally:
        os.umask(umask)


def test_an_explicit_mode_wins_over_the_writers_and_the_old_files(tmp_path):
    import os
    import shutil

    src = tmp_path / "tool"
    src.write_text("#!/bin/sh\n")
    src.chmod(0o755)
    dest = tmp_path / "bin" / "tool"
    with replacing(dest, mode=0o755) as tmp:
        shutil.copy2(src, tmp)
    assert dest.stat().st_mode & 0o777 == 0o755
    dest.chmod(0o600)
    with replacing(dest, mode=0o750) as tmp:
        shutil.copy2(src, tmp)
    assert dest.stat().st_mode & 0o777 == 0o750
    assert os.access(dest, os.X_OK)
