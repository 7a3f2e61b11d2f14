"""One check, for every preflight: the night's (tasks/preflight/), the training recipe's
(tasks/training/preflight.py) and the node image's model folder (tasks/image/).

A leaf below the domains and the composition alike, so each of them reports in the same shape
and `slm-nightly` prints them all the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tasks.shared.errors import ConfigError


@dataclass(frozen=True)
class Check:
    """One check: `ok` False is a failure, and `fix` says what to do about it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    skipped: bool = False  # did not apply (ok stays True): `detail` says why

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else "ok" if self.ok else "failed"

    @property
    def failed(self) -> bool:
        return not self.ok

    def line(self) -> str:
        text = f"{self.status.upper():7} {self.name}: {self.detail}"
        return text + (f" — fix: {self.fix}" if self.fix and not self.ok else "")


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def failure(name: str, detail: str, fix: str = "") -> Check:
    return Check(name, False, detail, fix)


def skipped(name: str, why: str) -> Check:
    return Check(name, True, why, skipped=True)


class PreflightFailed(ConfigError):
    """A preflight failed before anything ran (nothing booted, no weight loaded): the message
    names every failed check, and `checks` holds them."""

    def __init__(self, message: str, checks: Iterable[Check]) -> None:
        super().__init__(message)
        self.checks = [c for c in checks if c.failed]
