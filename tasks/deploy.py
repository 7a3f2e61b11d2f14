"""`prefect deploy` that keeps each schedule's active state (`slm-nightly deploy`).

prefect.yaml deploys the production schedules `active: false` (paused until preflight and the
smoke pass), and the operator redeploys after every change. A redeploy of an existing deployment
sends the yaml's schedules (prefect/deployments/runner.py: RunnerDeployment.aapply → _update),
and the server replaces them: prefect/server/models/deployments.py, update_deployment, deletes the
deployment's schedules (delete_schedules_for_deployment) and recreates them with the request's
`active` (Prefect 3.9.1). So a plain redeploy silently pauses the nightly and the reaper.

redeploy() reads each deployment's schedules first, runs the real deploy, then sets every
schedule that existed before back to its old state. A schedule new in the yaml, or any schedule
of a deployment deployed for the first time, keeps the yaml's state (paused: the guide's first
deploy).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.shared.errors import SlmNightlyError
from tasks.shared.paths import PROJECT_ROOT

# docs/operator-gcp.md §5's deploy command (tests/unit/test_deploy.py keeps them in step).
PRODUCTION = ["nightly/production", "node-reaper/production", "train/node", "nightly/extract",
              "nightly/retrain"]
PREFECT = str(Path(sys.executable).parent / "prefect")


class DeployError(SlmNightlyError):
    """`prefect deploy` exited non-zero, or did not deploy a deployment it was named."""


@dataclass(frozen=True)
class ScheduleState:
    """One schedule after the redeploy: `kept` (its state before, restored) or new (the yaml's);
    `matched`: how it was matched to the old one (slug, schedule, position)."""
    deployment: str
    schedule: str
    active: bool
    kept: bool
    matched: str = ""

    def line(self) -> str:
        state = "active" if self.active else "paused"
        how = f"kept {state} (matched by {self.matched})" if self.kept else \
            f"new: {state} (as prefect.yaml says)"
        return f"{self.deployment}  {self.schedule}  {how}"


def redeploy(names: list[str], *, cwd: Path = PROJECT_ROOT,
             env: Mapping[str, str] | None = None) -> list[ScheduleState]:
    """`prefect --no-prompt deploy --name N …` in `cwd` with `env` (default: this process's),
    then every schedule that existed before set back to its old active state. The client talks
    to `env`'s PREFECT_API_URL/PREFECT_API_KEY, the deploy's API. DeployError with the deploy's
    output when it fails (after restoring what it had already replaced)."""
    env = dict(os.environ if env is None else env, PWD=str(cwd))  # prefect.yaml's {{ $PWD }}
    with _api(env) as client:
        before = {n: _read(client, n) for n in names}
        proc = subprocess.run([PREFECT, "--no-prompt", "deploy",
                               *[a for n in names for a in ("--name", n)]],
                              cwd=cwd, env=env, capture_output=True, text=True)
        after = {n: _read(client, n) for n in names}
        report = [s for n in names for s in _restore(client, n, before[n], after[n])]
    # `prefect deploy` skips a name prefect.yaml does not define, prints so, and exits 0
    # (prefect/cli/deploy/_config.py: _handle_pick_deploy_with_name): not deployed = a failure
    skipped = [n for n, b, a in ((n, before[n], after[n]) for n in names)
               if a is None or (b is not None and a.updated == b.updated)]
    if proc.returncode != 0 or skipped:
        restored = "\n".join(s.line() for s in report if s.kept)
        raise DeployError(f"prefect deploy {' '.join(names)} failed (exit {proc.returncode}"
                          f"{', not deployed: ' + ' '.join(skipped) if skipped else ''}):\n"
                          f"{proc.stdout}{proc.stderr}\nschedules restored:\n"
                          f"{restored or '(none)'}")
    return report


@contextmanager
def _api(env: Mapping[str, str]) -> Iterator[Any]:
    """A sync client on the API the deploy subprocess uses."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL, temporary_settings

    updates = {s: env[s.name] for s in (PREFECT_API_URL, PREFECT_API_KEY) if env.get(s.name)}
    with temporary_settings(updates=updates), get_client(sync_client=True) as client:
        yield client


def _read(client: Any, name: str) -> Any | None:
    """The deployment (its id, its schedules); None when it does not exist (yet)."""
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_deployment_by_name(name)
    except ObjectNotFound:
        return None


def _restore(client: Any, name: str, before: Any | None, after: Any | None
             ) -> list[ScheduleState]:
    out: list[ScheduleState] = []
    if after is None:  # a first deploy that failed
        return out
    new = list(after.schedules)
    matches = _match(list(before.schedules) if before is not None else [], new)
    for s in new:
        was, how = matches.get(s.id, (None, ""))
        if was is not None and was.active != s.active:
            client.update_deployment_schedule(after.id, s.id, active=was.active)
        out.append(ScheduleState(name, _describe(s), s.active if was is None else was.active,
                                 was is not None, how))
    return out


def _match(old: list[Any], new: list[Any]) -> dict[Any, tuple[Any, str]]:
    """new schedule id → (the old schedule it replaces, how matched). By slug when both have
    the same one (the server then patches it in place); else by the same schedule (a cron's
    cron, timezone and day_or; an interval's or rrule's fields); else, when the yaml still has
    as many schedules, by position (a cron edited in place). Anything else is new."""
    left, found = list(old), {}
    rules = [("slug", lambda o, n: o.slug is not None and o.slug == n.slug),
             ("schedule", lambda o, n: o.schedule == n.schedule)]
    if len(old) == len(new):
        rules.append(("position", lambda o, n: old.index(o) == new.index(n)))
    for how, same in rules:
        for n in new:
            o = next((o for o in left if n.id not in found and same(o, n)), None)
            if o is not None:
                found[n.id] = (o, how)
                left.remove(o)
    return found


def _describe(s: Any) -> str:
    sched = s.schedule
    what = f"{sched.cron} ({sched.timezone})" if hasattr(sched, "cron") else repr(sched)
    return f"{s.slug}: {what}" if s.slug else what
