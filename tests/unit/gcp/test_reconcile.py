"""The loop of gcp setup/check/teardown, on resources that live in a dict: which calls each
mode makes, in which order, and what it says."""

from __future__ import annotations

import pytest

from tasks.gcp.reconcile import Found, GcpError, Resource, api_call, retry, run


class Thing(Resource):
    kind = "thing"

    def __init__(self, name: str, world: dict[str, str], log: list[str], want: str = "good",
                 keep: bool = False) -> None:
        super().__init__(name)
        self.world, self.log, self.want, self.keep = world, log, want, keep

    def read(self) -> Found:
        self.log.append(f"read {self.name}")
        if self.name not in self.world:
            return Found(False)
        have = self.world[self.name]
        return Found(True, [] if have == self.want else [f"is {have}"], "fine")

    def plan(self) -> str:
        return f"make {self.name}"

    def create(self) -> None:
        self.log.append(f"create {self.name}")
        self.world[self.name] = self.want

    def delete(self) -> None:
        self.log.append(f"delete {self.name}")
        del self.world[self.name]


def things(world: dict[str, str], log: list[str]) -> list[Resource]:
    return [Thing("a", world, log), Thing("b", world, log), Thing("c", world, log, keep=True)]


def test_setup_creates_the_missing_repairs_the_drifted_and_leaves_the_rest() -> None:
    world, log, said = {"a": "good", "b": "bad"}, [], []
    out = run(things(world, log), "setup", said.append)
    assert [(o.resource, o.state, o.detail) for o in out] == [
        ("thing a", "ok", "fine"), ("thing b", "repaired", "is bad"), ("thing c", "created", "")]
    # the default repair makes it anew
    assert log == ["read a", "read b", "delete b", "create b", "read c", "create c"]
    assert world == {"a": "good", "b": "good", "c": "good"}
    assert said == ["  ok            thing a — fine", "  repaired      thing b — is bad",
                    "  created       thing c"]


def test_a_second_setup_only_reads() -> None:
    world, log = {}, []
    run(things(world, log), "setup", lambda _: None)
    log.clear()
    out = run(things(world, log), "setup", lambda _: None)
    assert [o.state for o in out] == ["ok", "ok", "ok"]
    assert log == ["read a", "read b", "read c"]


@pytest.mark.parametrize("mode", ["check", "dry-run"])
def test_check_and_dry_run_change_nothing(mode: str) -> None:
    world, log = {"b": "bad"}, []
    out = run(things(world, log), mode, lambda _: None)  # type: ignore[arg-type]
    assert world == {"b": "bad"}
    assert log == ["read a", "read b", "read c"]
    states = [(o.state, o.detail) for o in out]
    if mode == "check":
        assert states == [("missing", ""), ("drifted", "is bad"), ("missing", "")]
    else:
        assert states == [("would create", "make a"), ("would repair", "is bad"),
                          ("would create", "make c")]


def test_teardown_goes_in_reverse_and_keeps_what_is_kept() -> None:
    world, log = {"a": "good", "c": "good"}, []
    out = run(things(world, log), "teardown", lambda _: None)
    assert [(o.resource, o.state) for o in out] == [("thing c", "kept"), ("thing b", "absent"),
                                                     ("thing a", "deleted")]
    assert world == {"c": "good"}
    assert log == ["read c", "read b", "read a", "delete a"]


def test_report_only_drift_is_said_and_never_repaired() -> None:
    class Stray(Thing):
        report_only = True

    world, log = {"s": "extra rule"}, []
    out = run([Stray("s", world, log)], "setup", lambda _: None)
    assert [(o.state, o.detail) for o in out] == [("drifted", "is extra rule")]
    assert log == ["read s"]


def test_api_errors_name_the_call_and_the_fix() -> None:
    from google.api_core.exceptions import Forbidden

    def refused() -> None:
        raise Forbidden("Permission 'compute.networks.create' denied on resource")

    with pytest.raises(GcpError) as e:
        api_call("network slm-net: insert", refused)
    assert str(e.value) == ("network slm-net: insert: 403 Permission 'compute.networks.create' "
                            "denied on resource — fix: run setup as a project owner (`gcloud "
                            "auth application-default login`), or grant the permission named")


def test_retry_waits_out_passing_errors_only() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("not yet")
        return "done"

    assert retry("x", flaky, retry_on=lambda e: "not yet" in str(e), pause=0.001) == "done"
    assert len(calls) == 3
    with pytest.raises(KeyError):
        retry("x", lambda: {}["k"], retry_on=lambda e: False)
