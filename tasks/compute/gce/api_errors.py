"""Sorting the errors of Compute calls: which may succeed when repeated (5xx, 429, 403 rate
limits, resets, timeouts), which send a start on to the next placement (stockout, quota,
unsupported, load), and which no other zone would answer differently (permission, not found,
bad request); and an error in one line for messages."""

from __future__ import annotations

from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.auth.exceptions import TransportError

from tasks.compute.gce.placement import StartFailureKind, start_failure

RATE_LIMIT_REASONS = {"rateLimitExceeded", "userRateLimitExceeded"}


def details(e: Any) -> list[tuple[str, str]]:
    """(reason, message) of the error items a refused Compute call carries."""
    out = []
    for d in e.errors or []:
        if isinstance(d, dict):
            out.append((str(d.get("reason", "")), str(d.get("message", ""))))
    return out


def reasons(e: Any) -> set[str]:
    return {r for r, _ in details(e)} | ({e.reason} if getattr(e, "reason", None) else set())


def transient(e: BaseException) -> bool:
    """Whether a failed call may succeed when repeated: 5xx, 429, 403 rate limits (Compute
    answers 403 rateLimitExceeded for its per-minute limits), connection resets, timeouts."""
    if isinstance(e, (gexc.ServerError, gexc.TooManyRequests, gexc.DeadlineExceeded,
                      gexc.ServiceUnavailable, requests.exceptions.ConnectionError,
                      requests.exceptions.Timeout, TransportError, ConnectionError)):
        return True
    return isinstance(e, gexc.Forbidden) and bool(reasons(e) & RATE_LIMIT_REASONS)


def http_start_failure(e: BaseException) -> StartFailureKind | None:
    """A start call refused with an HTTP error: the kind, when another placement may do
    better; None for a refusal every zone would repeat (permission, not found, bad request)."""
    if isinstance(e, requests.exceptions.RequestException):
        return "connection"
    why = reasons(e)
    items = [(r, m) for r, m in details(e)] + [("", getattr(e, "message", "") or "")]
    kind = start_failure(items + [(r, "") for r in why])
    if kind is not None:
        return kind
    if isinstance(e, gexc.ServerError):
        return "server error"
    if isinstance(e, gexc.TooManyRequests) or why & RATE_LIMIT_REASONS:
        return "rate limited"
    return None


def brief(e: BaseException) -> str:
    """An API error in one line: HTTP code, reason, message (no URL, no credentials)."""
    code = getattr(e, "code", None)
    why = ",".join(sorted(reasons(e))) if hasattr(e, "errors") else ""
    message = getattr(e, "message", None) or str(e)
    message = message.split(": ", 1)[1] if message.startswith(("GET ", "POST ")) else message
    head = " ".join(str(x) for x in (code, why) if x)
    return f"{head}: {message}" if head else message


def member(principal: str) -> str:
    """An IAM member for a principal named in a message."""
    if principal.endswith(".gserviceaccount.com"):
        return f"serviceAccount:{principal}"
    return f"user:{principal}" if "@" in principal else "serviceAccount:ORCHESTRATOR_SA_EMAIL"
