"""A real Prefect server for a test (started as the CLI starts its own: tasks/runtime/prefect_env.py),
the `prefect` command of this environment, and an already-migrated database for a fresh
PREFECT_HOME."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from tasks.runtime import prefect_env
from tasks.shared.files import locked
from tests.support.paths import PREFECT, ROOT


def prefect_cli(args: list[str], env: dict[str, str], cwd: Path = ROOT,
                timeout: float = 240) -> str:
    """`prefect ARGS` of this environment; its stdout, or the test fails with its output."""
    proc = subprocess.run([PREFECT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout


def migrated_db() -> Path:
    """Prefect's SQLite database as a server leaves it after its first start on an empty
    PREFECT_HOME (schema migrated, block types registered), made once per machine and Prefect
    version. A server's first start spends most of its CPU migrating: 13.4 s against 5.6 s on a
    copy of this file (Prefect 3.9, 2 cores, 2026-12-06), and the suite starts ~15 servers on
    fresh homes."""
    import prefect

    from tasks.engine.llama_build import cache_root

    db = cache_root() / "prefect-db" / prefect.__version__ / "prefect.db"
    with locked(db.with_name(".lock")):
        if not db.is_file():
            with tempfile.TemporaryDirectory(prefix="prefect-db-") as made:
                home = Path(made) / "home"
                env = {**os.environ, "PREFECT_HOME": str(home),  # its database there
                       "PREFECT_SERVER_DATABASE_CONNECTION_URL":
                           f"sqlite+aiosqlite:///{home / 'prefect.db'}"}
                server, _ = prefect_env.start_api_server(Path(made), "template", env)
                server.stop(grace=20.0)
                part = db.with_name("prefect.db.part")
                # SQLite's backup API reads through a write-ahead log the server left beside it
                with closing(sqlite3.connect(home / "prefect.db")) as src, \
                        closing(sqlite3.connect(part)) as dst:
                    src.backup(dst)
                part.rename(db)
    return db


def seeded(home: Path, name: str = "prefect.db") -> Path:
    """`home` (a PREFECT_HOME, made if missing) with a copy of migrated_db() as its database,
    unless it has one already."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / name).exists():
        shutil.copyfile(migrated_db(), home / name)
    return home


@contextmanager
def prefect_server(home: Path, port: int | None = None,
                   **settings: str) -> Iterator[dict[str, str]]:
    """The benches' server (tasks/runtime/prefect_env.py: api_server) on a seeded() home."""
    with prefect_env.api_server(seeded(home), port, **settings) as env:
        yield env
