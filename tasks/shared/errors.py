"""One exception root; every message says what was wrong and what to do."""

import sys
from collections.abc import Callable
from typing import Any


def explain_validation(err: Any, header: str, fix: str, root: str = "(section)") -> str:
    """A pydantic ValidationError as one message: every bad field, what was given, the fix."""
    lines = [header]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or root
        got = e.get("input")
        lines.append(f"  - {loc}: {e['msg']}" + ("" if "input" not in e or isinstance(got, dict)
                                                   else f" (got {got!r})"))
    lines.append(fix)
    return "\n".join(lines)


class SlmNightlyError(Exception):
    """Root of the project's errors."""


class ConfigError(SlmNightlyError):
    """A profile, block field or parameter is invalid."""


class DocumentError(SlmNightlyError):
    """A document cannot be loaded; the message is the reason recorded for it."""


class LLMError(SlmNightlyError):
    """The inference endpoint failed after retries or returned unusable output."""

    def __init__(self, message: str, attempts: int = 1, endpoint_down: bool = False,
                 unanswered: bool = False) -> None:
        super().__init__(message)
        self.attempts = attempts
        # the last attempt could not reach the server (refused, connection dropped): the
        # endpoint is down, not this document's fault — it is retried on the next run
        self.endpoint_down = endpoint_down
        # no attempt got an answer from the model: every one timed out, found the server
        # down or busy (429/5xx) — a slow or absent server, not a document the model cannot
        # do: retried on the next run, never held
        self.unanswered = unanswered or endpoint_down


class ChunkTooLong(LLMError):
    """The model ran out of tokens or context: retry on a smaller chunk."""


class Deferred(SlmNightlyError):
    """The deadline cannot cover this request: not a failure; the document waits for the next
    run (neither extracted nor failed, not held). No HTTP call was made for it."""


class GraphError(SlmNightlyError):
    """The graph store rejected a statement or could not be reached."""


class ServerError(SlmNightlyError):
    """A process the project manages (inference server, FalkorDB) failed to start or stop."""


class ServerDied(ServerError):
    """The inference server this run started died under it (the message says how and where its
    log is): asking it again per document is pointless, phase 1 stops."""


class NodeUnavailable(SlmNightlyError):
    """No zone/provisioning combination could start the GCE node (stockouts)."""


class NodePreempted(SlmNightlyError):
    """The node stopped while the run was using it (spot preemption, or stopped outside the
    run). Rerun the flow; it starts the node again (possibly in a fallback zone)."""


class NodeBootTimeout(ServerError):
    """The node did not reach RUNNING within boot_timeout_seconds (a stop was requested)."""


class PhaseFailed(SlmNightlyError):
    """A pipeline phase ended in failure (e.g. too many documents failed). `report`: the
    phase's own record where it has one (phase 1's ExtractionReport), so the run summary still
    reports what was done."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class AdapterVerificationError(SlmNightlyError):
    """A GGUF LoRA adapter did not load in llama.cpp, changed nothing, disagreed with HF+PEFT,
    or crashed the verifying process; carries the verification report."""

    def __init__(self, message: str, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report or {}


class PhaseTimedOut(SlmNightlyError, TimeoutError):
    """A phase ran past its timeout (also a TimeoutError, so `except TimeoutError` sees it)."""


class RecordError(SlmNightlyError):
    """A record file (run summary, manifest, marker, scorecard, result) cannot be read: not
    JSON, a key that does not belong, or a schema version this code does not know."""


class IllegalTransition(SlmNightlyError):
    """A training job's state was moved along a transition its state machine does not have."""


class ServingError(SlmNightlyError):
    """A serving endpoint refused, could not find, or did not answer by an adapter's name."""


def print_result(make: Callable[[], object]) -> int:
    """A `python -m` step of the Makefile: print what `make()` returns (exit 0), or its
    ConfigError, which says the fix (exit 1)."""
    try:
        print(make())
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    return 0
