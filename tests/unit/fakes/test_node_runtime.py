"""The fake node runtime's systemd semantics (tests/fakes/node_runtime.py), against the values
systemd.exec(5) documents for ExecStopPost and chown(1)'s refusals."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.fakes.node_runtime import FIRST_UID, _chown, _journalctl, _useradd, service_result


@pytest.mark.parametrize(("returncode", "stopping", "expected"), [
    (0, False, ("success", "exited", "0")),
    (1, False, ("exit-code", "exited", "1")),
    (1, True, ("exit-code", "exited", "1")),
    (-signal.SIGTERM, True, ("success", "killed", "TERM")),  # SuccessExitStatus's default
    (-signal.SIGTERM, False, ("signal", "killed", "TERM")),
    (-signal.SIGKILL, True, ("timeout", "killed", "KILL")),
    (-signal.SIGKILL, False, ("signal", "killed", "KILL")),  # the OOM killer
    (-signal.SIGSEGV, False, ("core-dump", "dumped", "SEGV")),
    (-signal.SIGABRT, False, ("core-dump", "dumped", "ABRT")),
])
def test_service_result_is_what_systemd_sets_for_exec_stop_post(
        returncode: int, stopping: bool, expected: tuple[str, str, str]) -> None:
    assert service_result(returncode, stopping) == expected


def test_useradd_ids_and_a_second_useradd(tmp_path: Path) -> None:
    config = {"ownership": False, "root": str(tmp_path)}
    assert _useradd(tmp_path, config, ["--system", "slm"]) == 0
    assert _useradd(tmp_path, config, ["other"]) == 0
    assert _useradd(tmp_path, config, ["slm"]) == 9  # useradd(8): the name is in use
    assert (tmp_path / "users").read_text().split() == ["slm", "other"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown for real needs root")
def test_chown_applies_inside_the_node_only(tmp_path: Path) -> None:
    node = tmp_path / "node"
    (node / "opt" / "deep").mkdir(parents=True)
    (node / "opt" / "deep" / "f").write_text("x")
    config = {"ownership": True, "root": str(node)}
    _useradd(node, config, ["--create-home", "slm"])
    assert (node / "home" / "slm").stat().st_uid == FIRST_UID
    assert _chown(node, config, ["-R", "slm:", str(node / "opt")]) == 0
    assert {p.stat().st_uid for p in (node / "opt").rglob("*")} == {FIRST_UID}
    assert _chown(node, config, ["slm:", str(tmp_path)]) == 1  # outside: refused
    assert tmp_path.stat().st_uid == 0
    assert _chown(node, config, ["nobody-here:", str(node / "opt")]) == 1


def test_journalctl_prints_the_units_last_lines(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "slm-engine.log").write_text("".join(f"l{i}\n" for i in range(20)))
    assert _journalctl(tmp_path, ["-u", "slm-engine.service", "-n", "3", "--no-pager"]) == 0
    assert capsys.readouterr().out == "l17\nl18\nl19\n"
    assert _journalctl(tmp_path, ["-u", "other"]) == 0
    assert capsys.readouterr().out == "-- No entries --\n"


def test_a_script_that_names_a_forbidden_path_is_not_run(tmp_path: Path) -> None:
    """`forbid`: after the mapping, a script that still names one of these paths of this
    machine (it would run here, as root) is refused, in its log; a mapped one runs."""
    from types import SimpleNamespace

    from tests.fakes.node_runtime import FakeNode

    target = tmp_path / "precious"
    target.mkdir()
    node = FakeNode(tmp_path / "nodes", paths={"/opt/x": str(tmp_path / "x")},
                    forbid=(str(target),))
    try:
        inst = SimpleNamespace(zone="z", name="vm", metadata={
            "startup-script": f"rm -rf {target}\n"})
        node.boot(inst)
        assert node.script_exit("z", "vm") is None and target.is_dir()
        assert node.log("z", "vm") == (f"fake node: not run, the mapped script names "
                                       f"{[str(target)]}\n")
        inst.metadata["startup-script"] = "mkdir -p /opt/x/made\n"
        node.boot(inst)
        proc = node._scripts[("z", "vm")]
        assert proc.wait(10) == 0 and (tmp_path / "x" / "made").is_dir()
    finally:
        node.close()
