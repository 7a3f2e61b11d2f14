"""The one test-profile writer, and the profile most extraction tests share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a TOML basic string (Paths included)


def toml_profile(path: Path, **keys: Any) -> Path:
    """Write a test profile: `toml_profile(tmp / "p.toml", state_dir=tmp / "state",
    compute={"type": "local"}, inference={"model": "fake", "max_retries": 1})`. A dict is a
    [table] (a dict inside it a [table.sub]); anything else a top-level key; None is left out.
    Strings and Paths are quoted and escaped, so no test hand-writes TOML."""
    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in body.items()
                     if v is not None and not isinstance(v, dict))
        for k, v in body.items():
            if isinstance(v, dict):
                table(f"{name}.{k}", v)

    lines.extend(f"{k} = {_toml_value(v)}" for k, v in keys.items()
                 if v is not None and not isinstance(v, dict))
    for k, v in keys.items():
        if isinstance(v, dict):
            table(k, v)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def extraction_profile(tmp: Path, *, base_url: str | None, falkordb_port: int, graph: str,
                       sources: Path, max_failed_share: float = 1.0,
                       request_timeout: float = 1.0, batch_documents: int = 3,
                       graph_table: dict[str, Any] | None = None) -> Path:
    """tmp/profile.toml pointing at test servers (the FalkorDB graph `graph`, unless
    `graph_table` gives the [graph] table); sources gets transcripts/research/contacts dirs.
    [extraction] is the last table: tests append its keys."""
    for s in ("transcripts", "research", "contacts"):
        (sources / s).mkdir(parents=True, exist_ok=True)
    return toml_profile(
        tmp / "profile.toml", state_dir=tmp / "state", compute={"type": "local"},
        inference={"base_url": base_url or None, "dialect": "vllm", "model": "fake",
                   "max_concurrent_requests": 4, "request_timeout_seconds": request_timeout,
                   "readiness_timeout_seconds": 10, "max_retries": 3,
                   "retry_base_seconds": 0.01, "context_tokens": 2048,
                   "max_output_tokens": 256},
        graph=graph_table or {"type": "falkordb", "host": "127.0.0.1", "port": falkordb_port,
                              "graph_name": graph, "batch_size": 5},
        sources={s: sources / s for s in ("transcripts", "research", "contacts")},
        extraction={"max_failed_share": max_failed_share, "batch_documents": batch_documents})
