"""The one loop of `gcp setup`, `check` and `teardown`: each resource is read first; setup
creates what is missing and repairs what drifted, check only reports, teardown deletes in
reverse order. A resource is a small class with read/create/repair/delete; this module knows
nothing of any API.

Idempotence is the read: a second setup over a project that matches makes only reads. A failed
call stops the run with the resource, the API's own message (which names the permission or
the disabled API) and the fix; everything before it is done, and the next run picks up there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from google.api_core.exceptions import GoogleAPICallError

from tasks.shared.errors import SlmNightlyError

T = TypeVar("T")
Mode = Literal["setup", "check", "dry-run", "teardown", "teardown-dry-run"]


class GcpError(SlmNightlyError):
    """A Google API call failed; the message names the resource, the call and the fix.
    `api_off`: the call's API is not enabled (what a dry run or check on a new project meets
    before setup enables it)."""

    def __init__(self, message: str, api_off: bool = False) -> None:
        super().__init__(message)
        self.api_off = api_off


@dataclass
class Found:
    """What a read found: whether the resource exists, and how it differs from the spec."""
    exists: bool
    drift: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def matches(self) -> bool:
        return self.exists and not self.drift


class Resource:
    """One thing setup makes. `plan` says in one line what create calls; `keep` resources
    (the bucket) survive teardown unless named."""

    kind = "resource"
    keep = False
    report_only = False  # setup reports its drift and never changes it (not ours to change)

    def __init__(self, name: str) -> None:
        self.name = name

    def read(self) -> Found:
        raise NotImplementedError

    def plan(self) -> str:
        raise NotImplementedError

    def create(self) -> None:
        raise NotImplementedError

    def repair(self, found: Found) -> None:
        """Bring an existing resource back to the spec; the default makes it anew."""
        self.delete()
        self.create()

    def delete(self) -> None:
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass
class Outcome:
    resource: str
    state: str  # ok, created, repaired, missing, drifted, would create, would repair, deleted,
    #             absent, kept, skipped
    detail: str = ""

    def line(self) -> str:
        return f"  {self.state:13} {self.resource}" + (f" — {self.detail}" if self.detail else "")


def api_call(what: str, fn: Callable[[], T], fix: str = "") -> T:
    """fn(), its Google API error turned into a GcpError naming `what` and the API's message
    (the message of a 403 names the missing permission or the disabled API)."""
    try:
        return fn()
    except GoogleAPICallError as e:
        hint = fix or _fix_for(e)
        raise GcpError(f"{what}: {e.code} {e.message}" + (f" — fix: {hint}" if hint else ""),
                       api_off=_api_off(e)) from None


def _api_off(e: Any) -> bool:
    reasons = {getattr(d, "reason", None) for d in getattr(e, "details", None) or ()} | {
        getattr(e, "reason", None)}
    return "SERVICE_DISABLED" in reasons or "has not been used in project" in str(
        getattr(e, "message", ""))


def _fix_for(e: Any) -> str:
    if _api_off(e):
        return "run `slm-nightly gcp setup` (it enables the APIs first), or enable the API named"
    if getattr(e, "code", None) == 403:
        return ("run setup as a project owner (`gcloud auth application-default login`), or "
                "grant the permission named")
    return ""


def retry(what: str, fn: Callable[[], T], *, retry_on: Callable[[Exception], bool],
          seconds: float = 120.0, pause: float = 0.2) -> T:
    """fn(), again while `retry_on` says the error is one that passes (a new service account
    not yet visible, a concurrent policy change), for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except Exception as e:
            if not retry_on(e) or time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 10.0)


# Right after services.batchEnable, an API's own calls may still be refused with SERVICE_DISABLED
# while the enablement propagates (the error says to wait a few minutes and retry): setup reads
# and writes a resource again for this long before it gives up
ENABLE_PROPAGATION_SECONDS = 300.0


class Skipped(GcpError):
    """A resource create() could not make for now, whose neighbours can still be made (a zone
    out of GPUs): its outcome is `skipped`, with this message."""


def _not_enabled_yet(e: Exception) -> bool:
    return isinstance(e, GcpError) and e.api_off


def run(resources: Iterable[Resource], mode: Mode,
        say: Callable[[str], None] = print) -> list[Outcome]:
    """Each resource in order (teardown: in reverse), its outcome said as it happens."""
    items = list(resources)
    outcomes: list[Outcome] = []
    for res in (reversed(items) if mode.startswith("teardown") else items):
        one = partial(_one, res, mode)
        out = retry(str(res), one, retry_on=_not_enabled_yet, seconds=ENABLE_PROPAGATION_SECONDS,
                    pause=1.0) if mode == "setup" else one()
        outcomes.append(out)
        say(out.line())
    return outcomes


def _one(res: Resource, mode: Mode) -> Outcome:
    name = str(res)
    try:
        found = res.read()
    except GcpError as e:
        if not e.api_off or mode not in ("dry-run", "check", "teardown-dry-run"):
            raise
        # a new project: nothing of this API exists yet, and setup enables it first
        state = {"dry-run": "would create", "check": "missing"}.get(mode, "absent")
        return Outcome(name, state, "its API is not enabled yet")
    if mode.startswith("teardown"):
        if not found.exists:
            return Outcome(name, "absent")
        if res.keep:
            return Outcome(name, "kept", "kept unless named (--delete-bucket NAME)")
        if mode == "teardown":
            res.delete()
            return Outcome(name, "deleted")
        return Outcome(name, "would delete")
    if found.matches:
        return Outcome(name, "ok", found.detail)
    if mode == "check" or (res.report_only and found.exists):
        return Outcome(name, "missing" if not found.exists else "drifted",
                       "; ".join(found.drift) or found.detail)
    if not found.exists:
        if mode == "dry-run":
            return Outcome(name, "would create", res.plan())
        try:
            res.create()
        except Skipped as e:
            return Outcome(name, "skipped", str(e))
        return Outcome(name, "created", found.detail)
    drift = "; ".join(found.drift)
    if mode == "dry-run":
        return Outcome(name, "would repair", drift)
    res.repair(found)
    return Outcome(name, "repaired", drift)
