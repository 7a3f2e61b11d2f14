"""Where the output of `slm-nightly run` goes: the project's own lines to the terminal, the
libraries' to the run's log file (`<state_dir>/runs/run-<UTC time>.log`).

A run's libraries write far more than the run has to say: llama.cpp's loader and tensor
conversion lines (through llama-cpp-python's log callback to sys.stderr, and from C code to
fd 2), tqdm bars, FutureWarnings, bitsandbytes' and transformers' loggers, Prefect's engine
lines ("Beginning flow run …", "Finished in state Completed()"). `route()` keeps the terminal for
the phases, the per-document progress and the training steps the project logs itself:

- fds 1 and 2 point at the log file for the whole run (os.dup2), so writes from C code and
  from child processes that inherit them land there; the terminal stays open on copies of the
  two fds, which children do not inherit;
- sys.stdout and sys.stderr write to the log file (tqdm, print() in libraries, tracebacks a
  library prints);
- Python warnings go through logging (`py.warnings`), and the root logger gets a handler that
  writes every record it sees to the log file;
- Prefect's console handler writes to the terminal's stderr, and only records logged from the
  project's own code (flows/, tasks/, blocks/);
- the CLI prints to `RunLog.out` / `RunLog.err`, and `say()` (signal-safe) to the terminal.

With `verbose=True` nothing is redirected: the terminal shows everything, as it did before the
log file existed; the log file still gets every log record.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[2]
OWN_CODE = tuple(str(ROOT / d) + os.sep for d in ("flows", "tasks", "blocks"))
KEEP_LOGS = 30  # run logs kept under <state_dir>/runs; older ones are deleted
FORMAT = "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s"

# The terminal's stderr while route() is active (2 otherwise): say() must write there, and it
# runs inside signal handlers, where nothing may be allocated beyond one os.write.
_terminal_err = 2


def say(message: str) -> None:
    """`slm-nightly: message` to the terminal's stderr, unbuffered: safe inside a signal
    handler that interrupted a print, and while route() sends fd 2 to the log file."""
    try:
        os.write(_terminal_err, f"slm-nightly: {message}\n".encode())
    except OSError:  # SIGHUP: the terminal is gone
        pass


@lru_cache(maxsize=512)
def own_code(pathname: str) -> bool:
    """Whether a log record was emitted from the project's own modules."""
    return os.path.realpath(pathname).startswith(OWN_CODE)


class OwnLines(logging.Filter):
    """Lets through the records logged from the project's code (get_run_logger() keeps the
    caller's file in `pathname`); Prefect's engine lines and library loggers stay out."""

    def filter(self, record: logging.LogRecord) -> bool:
        return own_code(record.pathname)


@dataclass
class RunLog:
    path: Path
    out: TextIO  # the terminal's stdout
    err: TextIO  # the terminal's stderr
    verbose: bool


def _console_handlers() -> list[logging.StreamHandler[TextIO]]:
    """Prefect's console handlers (root and any logger Prefect's logging.yml gave one)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    return [h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)]


def _point(handler: logging.StreamHandler[TextIO], stream: TextIO) -> None:
    with suppress(OSError):  # SIGHUP: the terminal is gone, its buffer cannot flush
        handler.flush()
    handler.stream = stream
    console = getattr(handler, "console", None)  # Prefect's handler prints through rich
    if console is not None:
        console.file = stream


def new_log_path(state_dir: Path) -> Path:
    """A fresh `runs/run-<UTC time>.log`; the oldest logs beyond KEEP_LOGS are deleted."""
    runs = Path(state_dir) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    old = sorted(runs.glob("run-*.log"))
    for p in old[:max(0, len(old) - KEEP_LOGS + 1)]:
        p.unlink(missing_ok=True)
    path = runs / f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.log"
    n = 1
    while path.exists():  # two runs in one second
        path = runs / f"run-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{n}.log"
        n += 1
    return path


@contextmanager
def route(state_dir: Path, verbose: bool = False) -> Iterator[RunLog]:
    """Send library output to a new run log for the duration of the block (module
    docstring); yield where the log is and the terminal's streams. Everything is put back on
    the way out, before an exception propagates, so a traceback reaches the terminal."""
    global _terminal_err
    # Prefect sets up its logging (the console handler we re-point) when prefect.main loads.
    import prefect.main  # noqa: F401

    path = new_log_path(state_dir)
    root = logging.getLogger()
    consoles = [(h, h.stream) for h in _console_handlers()]
    file_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    log_stream = open(os.dup(file_fd), "w", buffering=1, encoding="utf-8",
                      errors="backslashreplace")
    to_file = logging.StreamHandler(log_stream)
    # Prefect's formatter names the flow or task run a record belongs to.
    to_file.setFormatter(consoles[0][0].formatter if consoles and consoles[0][0].formatter
                         else logging.Formatter(FORMAT, "%H:%M:%S"))
    root.addHandler(to_file)
    if verbose:
        try:
            yield RunLog(path, sys.stdout, sys.stderr, verbose=True)
        finally:
            root.removeHandler(to_file)
            log_stream.close()
            os.close(file_fd)
        return

    saved_streams = (sys.stdout, sys.stderr)
    for s in saved_streams:
        s.flush()
    saved_fds = (os.dup(1), os.dup(2))  # os.dup: not inherited by child processes
    out = open(os.dup(saved_fds[0]), "w", buffering=1, encoding=sys.stdout.encoding,
               errors="backslashreplace")
    err = open(os.dup(saved_fds[1]), "w", buffering=1, encoding=sys.stderr.encoding,
               errors="backslashreplace")
    own = OwnLines()
    os.dup2(file_fd, 1)
    os.dup2(file_fd, 2)
    sys.stdout = sys.stderr = log_stream
    _terminal_err = err.fileno()
    logging.captureWarnings(True)
    for h, _ in consoles:
        _point(h, err)
        h.addFilter(own)
    try:
        yield RunLog(path, out, err, verbose=False)
    finally:
        for h, stream in consoles:
            h.removeFilter(own)
            _point(h, stream)
        logging.captureWarnings(False)
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        _terminal_err = 2
        root.removeHandler(to_file)
        for s in (out, err, log_stream):
            with suppress(OSError):  # SIGHUP: the terminal is gone, its buffer cannot flush
                s.close()
        for fd in (*saved_fds, file_fd):
            os.close(fd)
