"""A node runtime for the fake Compute Engine (tests/fakes/compute_engine.py `node_runtime`): when
an instance reaches RUNNING it EXECUTES the instance's `startup-script` metadata with bash, as
GCE's google-startup-scripts.service does, with node paths mapped to the test's.

What is real: bash, the rendered script line by line (its heredocs, `set -e` and ERR trap,
curl to the metadata server, install/chmod/mkdir/stat), and every unit's ExecStart — the
engine's and the worker's command lines exactly as rendered, with only paths mapped. What is
modelled (each as the named document says):
- the metadata server (cloud.google.com/compute/docs/metadata/querying-metadata, …/
  manage-guest-attributes): a local HTTP server per runtime; GET instance/attributes/KEY (404
  when absent), instance/network-interfaces/0/ip, instance/service-accounts/default/token (the
  instance's account's token, 404 without one); PUT/DELETE instance/guest-attributes/NS/KEY
  into the fake (refused while metadata enable-guest-attributes is not TRUE); every request
  needs `Metadata-Flavor: Google` (403 otherwise).
- `systemctl` (systemd.service(5), systemd.exec(5)): daemon-reload, enable, start, stop,
  restart, is-active [--quiet] of units read from the mapped /etc/systemd/system: ExecStart,
  EnvironmentFile (KEY=VALUE lines), Environment (space-separated assignments),
  WorkingDirectory; User= is recorded (processes cannot switch user here). A unit's
  environment is only what the unit gives it, on top of the machine's base environment (this
  process's, without PREFECT_API_*, HF_* and TRANSFORMERS_OFFLINE, so the unit must set them).
  stop = KillMode=control-group: SIGTERM to the unit's processes and all they started, SIGKILL
  after 5 s. start of a Type=simple unit whose ExecStart cannot run returns 0 and leaves it
  inactive (the failure is logged). Restart= is not modelled. A unit with ExecStopPost= runs
  under a supervisor that copies its output to the unit's journal (`journalctl -u UNIT -n N`)
  and, when the main process ends, runs each ExecStopPost command with SERVICE_RESULT,
  EXIT_CODE and EXIT_STATUS as systemd.exec(5) sets them (a clean signal during a stop is
  success; `+` runs it with full privileges, else as User=).
- `gcloud secrets versions access latest --secret=NAME` from a dict; a missing secret exits 1
  with gcloud's NOT_FOUND text.
- `useradd`, `id -u`, `chown`, `chgrp`, `install -o/-g`, `runuser -u` (useradd(8), chown(1),
  install(1), runuser(1)): `useradd` gives the user the next uid
  from FIRST_UID (no entry in this machine's /etc/passwd: `stat -c %U` prints UNKNOWN for it,
  where a node prints the name), `id -u NAME` prints it. Without `ownership` they are recorded
  only. With `ownership` (and this process root), they are applied: `useradd --create-home`
  makes the home under the node's folder, owned by the user; `chown [-R] USER[:GROUP] PATH`
  changes the real owner (refused for a path outside the node's folder, so a mapping can never
  reach the repository); a unit with `User=` runs as that uid (setpriv(1)) with the variables
  systemd.exec(5) sets for it ($HOME, $USER, $LOGNAME, $SHELL), keeping only
  CAP_DAC_READ_SEARCH — it reads anything (the interpreter under root's home), and writes only
  where the user may: a folder the script left to root refuses the unit, as on a node.
  `chgrp` and `install` are the real programs with the user's name turned into its id;
  `runuser -u USER -- CMD` runs CMD as the user the same way, with the variables su(1) sets.
  `systemctl enable --now` starts what it enables; a unit without a file is refused.
Power-off (stop, preemption) stops every unit and the script; the pid files of a boot live in
the mapped /run, cleared at the next boot as a reboot clears /run. The guest's own `reboot`
(the instance stays RUNNING: units and script end, the script runs again, counted in the
instance folder's `reboots`) and `poweroff` (the instance TERMINATED, as Compute records a
guest shutdown) are shims too. `forbid`: paths of this machine a mapped script must not name
(the repository, say): such a script is not run — it would run here, as root.

The engine may be replaced (`unit_overrides={"slm-engine": argv}`) by a faster stand-in; the
worker's unit may not: it runs the rendered ExecStart, mapped.

The shims run as `python -m tests.fakes.node_runtime CMD ARGS` with FAKE_NODE_DIR naming the instance's
folder (its config.json).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.fakes.loopback import JsonHandler, LoopbackServer
from tests.support.paths import ROOT

METADATA = "http://metadata.google.internal/computeMetadata/v1/instance"
SHIMS = ("systemctl", "gcloud", "useradd", "id", "chown", "chgrp", "install", "runuser",
         "journalctl", "reboot", "poweroff")
FIRST_UID = 61000  # useradd's users: above any a test machine's /etc/passwd holds
STRIPPED_ENV = ("PREFECT_API_URL", "PREFECT_API_KEY", "HF_HUB_OFFLINE", "HF_HOME",
                "TRANSFORMERS_OFFLINE", "PYTHONPATH")
GCLOUD_NOT_FOUND = ("ERROR: (gcloud.secrets.versions.access) NOT_FOUND: Secret "
                    "[projects/{project}/secrets/{name}] not found or has no versions.")


class FakeNode:
    """Runs rendered startup scripts on a fake Compute Engine's instances.

    `paths`: node path → test path, applied to the script text (longest first, one pass);
    /etc/, /usr/local/bin/, /run/ and the metadata URL are mapped into `root` besides.
    `secrets`: Secret Manager name → value. `env`: added to the machine's base environment
    (this process's at boot, so a test's emulators started later are seen). `only`: the
    instances it runs (an orchestrator VM on the same fake boots to nothing). `ownership`:
    useradd, chown and User= applied for real (module docstring); every mapped path the script
    may chown must then lie under `root`."""

    def __init__(self, root: Path, *, paths: dict[str, str] | None = None,
                 secrets: dict[str, str] | None = None, env: dict[str, str] | None = None,
                 unit_overrides: dict[str, list[str]] | None = None,
                 project: str = "test-project", only: set[str] | None = None,
                 ownership: bool = False, forbid: tuple[str, ...] = ()) -> None:
        from tasks.compute.gce.startup import WORKER_UNIT

        if unit_overrides and WORKER_UNIT in unit_overrides:
            raise ValueError("the worker unit runs the rendered ExecStart: no override")
        self.root = root
        self.paths = dict(paths or {})
        self.secrets = dict(secrets or {})
        self.overrides = dict(unit_overrides or {})
        self.project = project
        self.only = only  # the instance names it runs (None: all); another VM boots to nothing
        # paths a mapped script must not name (it runs as root here): a script that still
        # names one after the mapping is not run, and the refusal is in its log
        self.forbid = forbid
        self.ownership = ownership and os.geteuid() == 0  # applied only where root can
        self.env = dict(env or {})  # on top of this process's environment at each boot
        self.fake: Any = None
        self._scripts: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
        self._server = LoopbackServer(self._handler()).__enter__()
        self.metadata_url = self._server.url

    def attach(self, fake: Any) -> FakeNode:
        """Become `fake`'s node runtime."""
        self.fake = fake
        fake.node_runtime = self
        return self

    def close(self) -> None:
        self._server.__exit__()

    # ---- the runtime hooks (called with the fake's lock held: never wait on the fake) -------
    def boot(self, inst: Any) -> None:
        script = inst.metadata.get("startup-script")
        if not script or (self.only is not None and inst.name not in self.only):
            return  # an instance without a startup script boots to nothing of ours
        d = self.dir(inst.zone, inst.name)
        for sub in ("etc/systemd/system", "usr-local-bin", "bin", "run"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for pid in (d / "run").glob("*"):
            pid.unlink()
        # the machine's environment: the shims stand where systemctl, gcloud, … are on a node
        base = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
        env = {**base, **self.env, "FAKE_NODE_DIR": str(d),
               "PATH": f"{d / 'bin'}:{self.env.get('PATH') or base.get('PATH', '/usr/bin:/bin')}"}
        (d / "config.json").write_text(json.dumps({
            "env": env, "overrides": self.overrides, "secrets": self.secrets,
            "project": self.project, "log": str(self.log_path(inst.zone, inst.name)),
            "ownership": self.ownership, "root": str(self.root),
            "power_url": f"{self.metadata_url}/{inst.zone}/{inst.name}/power"}))
        for shim in SHIMS:
            path = d / "bin" / shim
            path.write_text(f"#!/bin/bash\nPYTHONPATH={shlex.quote(str(ROOT))} exec "
                            f"{shlex.quote(sys.executable)} -m tests.fakes.node_runtime {shim} \"$@\"\n")
            path.chmod(0o755)
        mapped = d / "startup-script.sh"
        text = self.map_script(script, inst.zone, inst.name)
        named = [p for p in self.forbid if p in text]
        if named:
            with open(self.log_path(inst.zone, inst.name), "a") as log:
                log.write(f"fake node: not run, the mapped script names {named}\n")
            return
        mapped.write_text(text)
        with open(self.log_path(inst.zone, inst.name), "ab") as log:
            self._scripts[(inst.zone, inst.name)] = subprocess.Popen(
                # in /, as the guest agent's runner starts it: runScript/runCmd set no cmd.Dir
                # (GoogleCloudPlatform/guest-agent google_metadata_script_runner/main.go), so
                # the script inherits the service's working directory, systemd's default /
                ["bash", str(mapped)], cwd="/", env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def power_off(self, inst: Any) -> None:
        d = self.dir(inst.zone, inst.name)
        script = self._scripts.pop((inst.zone, inst.name), None)
        if script is not None and script.poll() is None:
            _stop_family(script.pid)
            script.wait(5)
        for pid_file in sorted((d / "run").glob("*.pid")) if (d / "run").is_dir() else []:
            stop_unit(d, pid_file.stem)

    def metadata_changed(self, inst: Any) -> None:
        """Nothing: the node's watcher polls the metadata server, as on a real node."""

    # ---- what a test looks at ----------------------------------------------------------------
    def dir(self, zone: str, name: str) -> Path:
        return self.root / f"node-{zone}-{name}"

    def log_path(self, zone: str, name: str) -> Path:
        return self.root / f"node-{zone}-{name}.log"

    def log(self, zone: str, name: str) -> str:
        path = self.log_path(zone, name)
        return path.read_text(errors="replace") if path.exists() else ""

    def script_exit(self, zone: str, name: str) -> int | None:
        proc = self._scripts.get((zone, name))
        return None if proc is None else proc.poll()

    def unit_pid(self, zone: str, name: str, unit: str) -> int | None:
        return _live_pid(self.dir(zone, name), unit)

    def unit_running(self, zone: str, name: str, unit: str) -> bool:
        return self.unit_pid(zone, name, unit) is not None

    def unit_user(self, zone: str, name: str, unit: str) -> str | None:
        path = self.dir(zone, name) / "run" / f"{unit}.user"
        return path.read_text() or None if path.exists() else None

    def uid(self, zone: str, name: str, user: str) -> int | None:
        """The uid useradd gave `user` on this instance (None: not added)."""
        return _uid_of(self.dir(zone, name), user)

    def unit_uid(self, zone: str, name: str, unit: str) -> int:
        """The real uid the running unit's process has (/proc/<pid>/status)."""
        pid = self.unit_pid(zone, name, unit)
        if pid is None:
            raise AssertionError(f"unit {unit} is not running on {zone}/{name}")
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]

    def unit_environ(self, zone: str, name: str, unit: str) -> dict[str, str]:
        """The running unit's environment, read from /proc/<pid>/environ."""
        pid = self.unit_pid(zone, name, unit)
        if pid is None:
            raise AssertionError(f"unit {unit} is not running on {zone}/{name}")
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return dict(e.decode().split("=", 1) for e in raw if b"=" in e)

    def map_script(self, script: str, zone: str, name: str) -> str:
        d = self.dir(zone, name)
        mapping = {**self.paths,
                   METADATA: f"{self.metadata_url}/{zone}/{name}/computeMetadata/v1/instance",
                   "/etc/": f"{d}/etc/", "/usr/local/bin/": f"{d}/usr-local-bin/",
                   "/run/": f"{d}/run/"}
        keys = sorted(mapping, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(k) for k in keys))
        return pattern.sub(lambda m: mapping[m.group(0)], script)

    def _power(self, zone: str, name: str, verb: str) -> None:
        """The guest's `reboot` / `poweroff` (systemd's, from the script): a reboot ends every
        unit and the script and boots again (the instance stays RUNNING, the startup script
        runs again, /run is cleared); a poweroff ends the instance as Compute records a guest
        shutdown (compute.instances.guestTerminate: TERMINATED, no caller). After the answer,
        on a thread of its own: the shim that asked is one of the processes it ends."""

        def act() -> None:
            fake = self.fake
            with fake._lock:
                inst = fake.instances.get((zone, name))
                if inst is None or inst.status != "RUNNING":
                    return
                if verb == "reboot":
                    self.power_off(inst)
                    with open(self.dir(zone, name) / "reboots", "a") as f:
                        f.write("reboot\n")
                    self.boot(inst)
                else:
                    now = time.time()
                    op = fake._new_op(inst, "compute.instances.guestTerminate", now, now)
                    op.running_at = op.done_at = now
                    inst.generation += 1
                    fake._leave_running(inst, "TERMINATED")

        threading.Timer(0.05, act).start()

    # ---- the metadata server -------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        node = self

        class Handler(JsonHandler):
            def _answer(self, code: int, text: str) -> None:
                self.send_body(code, text.encode(), "application/text")

            def _route(self, method: str) -> None:
                power = re.fullmatch(r"/([^/]+)/([^/]+)/power/(reboot|poweroff)", self.path)
                if power is not None and method == "POST":
                    self._answer(200, "")
                    return node._power(*power.groups())
                m = re.fullmatch(r"/([^/]+)/([^/]+)/computeMetadata/v1/instance/(.*)",
                                 self.path.split("?")[0])
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, "Missing Metadata-Flavor:Google header.")
                if m is None or node.fake is None:
                    return self._answer(404, "not found")
                zone, name, rest = m.groups()
                inst = node.fake.instances.get((zone, name))
                if inst is None:
                    return self._answer(404, "not found")
                body = self.read_body().decode()
                if method == "GET" and rest == "service-accounts/default/token":
                    # an access token for the instance's account (cloud.google.com/compute/docs/
                    # access/authenticate-workloads): 404 without an account; with the shared
                    # FakeProject, a token its IAM (the bucket's proxy) reads as that account
                    if not inst.service_account:
                        return self._answer(404, "not found")
                    gcp = getattr(node.fake, "gcp", None)
                    member = f"serviceAccount:{inst.service_account}"
                    token = gcp.token_for(member) if gcp is not None else "ya29.fake"
                    return self.send_json(200, {"access_token": token, "expires_in": 3599,
                                                "token_type": "Bearer"})
                if method == "GET" and rest == "network-interfaces/0/ip":
                    return self._answer(200, inst.network_ip)  # the fake's networkIP
                if method == "GET" and rest.startswith("attributes/"):
                    value = dict(inst.metadata).get(rest.removeprefix("attributes/"))
                    return self._answer(404, "not found") if value is None else \
                        self._answer(200, value)
                if rest.startswith("guest-attributes/") and method in ("PUT", "DELETE"):
                    path = rest.removeprefix("guest-attributes/")
                    try:
                        if method == "PUT":
                            node.fake.put_guest_attribute(zone, name, path, body)
                        else:
                            node.fake.delete_guest_attribute(zone, name, path)
                    except Exception as e:  # noqa: BLE001 - disabled, or a bad path
                        return self._answer(403 if "disabled" in str(e) else 400, str(e))
                    return self._answer(200, "")
                return self._answer(404, "not found")

            def do_GET(self) -> None:  # noqa: N802
                self._route("GET")

            def do_PUT(self) -> None:  # noqa: N802
                self._route("PUT")

            def do_DELETE(self) -> None:  # noqa: N802
                self._route("DELETE")

            def do_POST(self) -> None:  # noqa: N802
                self._route("POST")

        return Handler


class ByName:
    """Node runtimes by instance name, one fake Compute Engine's `node_runtime`: the image
    builder runs with its stand-ins beside the nodes' own runtime (`default`)."""

    def __init__(self, default: Any, **by_name: Any) -> None:
        self.default, self.by_name = default, by_name

    def attach(self, fake: Any) -> ByName:
        fake.node_runtime = self
        for runtime in (self.default, *self.by_name.values()):
            runtime.fake = fake
        return self

    def _of(self, inst: Any) -> Any:
        return self.by_name.get(inst.name, self.default)

    def boot(self, inst: Any) -> None:
        self._of(inst).boot(inst)

    def power_off(self, inst: Any) -> None:
        self._of(inst).power_off(inst)

    def metadata_changed(self, inst: Any) -> None:
        self._of(inst).metadata_changed(inst)


# ---- units (used by the systemctl shim and by power-off) ---------------------------------------


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _live_pid(d: Path, unit: str) -> int | None:
    path = d / "run" / f"{unit}.pid"
    try:
        pid_text, started = path.read_text().split()
    except (OSError, ValueError):
        return None
    pid = int(pid_text)
    stat = Path(f"/proc/{pid}/stat")
    try:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return pid if state != "Z" and _start_time(pid) == started else None


def _stop_family(pid: int, grace: float = 5.0) -> None:
    """KillMode=control-group: SIGTERM to the process and all it started, SIGKILL after grace."""
    import psutil

    try:
        top = psutil.Process(pid)
        family = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def stop_unit(d: Path, unit: str) -> None:
    pid = _live_pid(d, unit)
    if pid is not None:
        # the supervisor's SERVICE_RESULT: this process was stopped (by pid: a start right
        # after, as `restart` does, must not make the old one's end look like a crash)
        (d / "run" / f"{unit}.stopping").write_text(str(pid))
        _stop_family(pid)
    (d / "run" / f"{unit}.pid").unlink(missing_ok=True)


def _unit(d: Path, unit: str) -> dict[str, list[str]]:
    path = d / "etc" / "systemd" / "system" / f"{unit}.service"
    if not path.exists():
        raise SystemExit(f"Failed to start {unit}.service: Unit {unit}.service not found.")
    fields: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            fields.setdefault(key.strip(), []).append(value.strip())
    return fields


def _env_file(path: str) -> dict[str, str]:
    optional = path.startswith("-")
    try:
        lines = Path(path.lstrip("-")).read_text().splitlines()
    except OSError:
        if optional:
            return {}
        raise
    out = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and not line.lstrip().startswith("#"):
            out[key.strip()] = value
    return out


def start_unit(d: Path, unit: str, config: dict[str, Any]) -> None:
    if _live_pid(d, unit) is not None:
        return
    f = _unit(d, unit)
    env = dict(config["env"])
    for assignment in f.get("Environment", []):
        for item in shlex.split(assignment):
            key, _, value = item.partition("=")
            env[key] = value
    for path in f.get("EnvironmentFile", []):
        env.update(_env_file(path))
    argv = config["overrides"].get(unit) or shlex.split(f["ExecStart"][-1])
    cwd = (f.get("WorkingDirectory") or [None])[-1]
    user = (f.get("User") or [""])[-1]
    as_user: list[str] = []  # the prefix that runs a command as User=
    if config.get("ownership") and user not in ("", "root"):
        uid = _uid_of(d, user)
        if uid is None:  # systemd: 217/USER
            with open(config["log"], "ab") as log:
                log.write(f"{unit}.service: Failed to determine user credentials: No such "
                          "process\n".encode())
            return
        # systemd.exec(5): a unit with User= gets that user's $HOME, $USER, $LOGNAME, $SHELL
        env |= {"HOME": str(d / "home" / user), "USER": user, "LOGNAME": user,
                "SHELL": "/usr/sbin/nologin"}
        # the test process's PREFECT_HOME (tests/conftest.py) is no machine's: the unit's
        # Prefect keeps its files where a node's does, under the user's ~/.prefect
        env.pop("PREFECT_HOME", None)
        as_user = drop_to(uid, [])
        argv = [*as_user, *argv]
    (d / "journal").mkdir(exist_ok=True)
    post = f.get("ExecStopPost", [])
    if post:  # a supervisor waits for the main process, then runs ExecStopPost
        (d / "run" / f"{unit}.spec.json").write_text(json.dumps({
            "argv": argv, "cwd": cwd, "env": env, "post": post, "as_user": as_user,
            "log": config["log"]}))
        sup = subprocess.Popen([sys.executable, "-m", "tests.fakes.node_runtime", "supervise",
                                unit], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               start_new_session=True)
        assert sup.stdout is not None
        pid = int(sup.stdout.readline() or 0)  # the main process, once it runs
        sup.stdout.close()
        if not pid:
            return
    else:
        with open(config["log"], "ab") as log:
            try:
                proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            except OSError as e:
                # Type=simple: systemctl returns once the unit forked; the exec failure only
                # marks the unit failed (systemd.service(5)), as journalctl would show it
                log.write(_exec_failed(unit, argv[0], e))
                return
        pid = proc.pid
    (d / "run" / f"{unit}.pid").write_text(f"{pid} {_start_time(pid)}")
    (d / "run" / f"{unit}.user").write_text(user)


def drop_to(uid: int, argv: list[str]) -> list[str]:
    """`argv` run as `uid` (setpriv(1)), keeping CAP_DAC_READ_SEARCH only: it reads anything
    (the interpreter under root's 0700 home), and writes only where `uid` may."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", *argv]


def _exec_failed(unit: str, program: str, e: OSError) -> bytes:
    """What systemd logs when a unit's ExecStart cannot run (203/EXEC)."""
    return f"{unit}.service: Failed to execute {program}: {e.strerror}\n".encode()


CLEAN_SIGNALS = {"HUP", "INT", "TERM", "PIPE"}  # systemd.service(5) SuccessExitStatus= default
DUMP_SIGNALS = {"QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "SEGV", "SYS"}  # signal(7): Core


def service_result(returncode: int, stopping: bool) -> tuple[str, str, str]:
    """(SERVICE_RESULT, EXIT_CODE, EXIT_STATUS) of a main process that ended with
    `returncode` (Popen's: negative = the signal), as systemd.exec(5) sets them for
    ExecStopPost; `stopping`: a stop was asked for (systemctl stop, power-off)."""
    if returncode >= 0:
        return ("success" if returncode == 0 else "exit-code", "exited", str(returncode))
    sig = signal.Signals(-returncode).name.removeprefix("SIG")
    if stopping and sig in CLEAN_SIGNALS:
        return ("success", "killed", sig)
    if stopping and sig == "KILL":  # the stop's SIGTERM outlived TimeoutStopSec=
        return ("timeout", "killed", sig)
    if sig in DUMP_SIGNALS:
        return ("core-dump", "dumped", sig)
    return ("signal", "killed", sig)


def _supervise(d: Path, unit: str) -> int:
    """The unit's main process, its output to the machine's log and the unit's journal, and,
    when it has ended, each ExecStopPost with SERVICE_RESULT, EXIT_CODE and EXIT_STATUS
    (systemd.exec(5)); a command prefixed `+` runs with full privileges, any other as the
    unit's User= (systemd.service(5))."""
    spec = json.loads((d / "run" / f"{unit}.spec.json").read_text())
    with open(spec["log"], "ab") as log, open(d / "journal" / f"{unit}.log", "ab") as journal:
        def both(data: bytes) -> None:
            for out in (log, journal):
                out.write(data)
                out.flush()

        try:
            child = subprocess.Popen(spec["argv"], cwd=spec["cwd"], env=spec["env"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        except OSError as e:  # 203/EXEC
            print(0, flush=True)
            both(_exec_failed(unit, spec["argv"][0], e))
            result = ("exit-code", "exited", "203")
        else:
            print(child.pid, flush=True)
            assert child.stdout is not None
            for line in child.stdout:
                both(line)
            code = child.wait()
            marker = d / "run" / f"{unit}.stopping"
            stopped = marker.exists() and marker.read_text() == str(child.pid)
            result = service_result(code, stopped)
        sys.stdout.close()
        env = {**spec["env"], "SERVICE_RESULT": result[0], "EXIT_CODE": result[1],
               "EXIT_STATUS": result[2]}
        for cmd in spec["post"]:
            full = cmd.startswith("+")
            argv = shlex.split(cmd.lstrip("+-@!:"))
            proc = subprocess.run(argv if full else [*spec["as_user"], *argv], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=90)
            both(proc.stdout)
    return 0


# ---- the shims ---------------------------------------------------------------------------------


def _systemctl(d: Path, config: dict[str, Any], args: list[str]) -> int:
    quiet = "--quiet" in args or "-q" in args
    words = [a for a in args if not a.startswith("-")]
    verb, units = words[0], [u.removesuffix(".service") for u in words[1:]]
    if verb == "daemon-reload":
        return 0
    if verb == "enable":  # systemctl(1): --now starts the units too; a missing one is refused
        for unit in units:
            if not (d / "etc" / "systemd" / "system" / f"{unit}.service").exists():
                print(f"Failed to enable unit: Unit file {unit}.service does not exist.",
                      file=sys.stderr)
                return 1
        if "--now" not in args:
            return 0
        verb = "start"
    for unit in units:
        if verb in ("stop", "restart"):
            stop_unit(d, unit)
        if verb in ("start", "restart"):
            start_unit(d, unit, config)
        if verb == "is-active":
            active = _live_pid(d, unit) is not None
            if not quiet:
                print("active" if active else "inactive")
            if not active:
                return 3
    return 0


def _gcloud(config: dict[str, Any], args: list[str]) -> int:
    if args[:3] != ["secrets", "versions", "access"]:
        print(f"fake gcloud: {' '.join(args)} is not modelled", file=sys.stderr)
        return 2
    name = next((a.split("=", 1)[1] for a in args if a.startswith("--secret=")), "")
    if name not in config["secrets"]:
        print(GCLOUD_NOT_FOUND.format(project=config["project"], name=name), file=sys.stderr)
        return 1
    sys.stdout.write(config["secrets"][name])
    return 0


def _uid_of(d: Path, user: str) -> int | None:
    if user == "root":
        return 0
    users = d / "users"
    known = users.read_text().split() if users.exists() else []
    return FIRST_UID + known.index(user) if user in known else None


def _useradd(d: Path, config: dict[str, Any], args: list[str]) -> int:
    name = args[-1]
    if _uid_of(d, name) is not None:
        print(f"useradd: user '{name}' already exists", file=sys.stderr)
        return 9  # useradd(8): username already in use
    with open(d / "users", "a") as f:
        f.write(name + "\n")
    if config.get("ownership") and ("--create-home" in args or "-m" in args):
        home = d / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        uid = FIRST_UID + (d / "users").read_text().split().index(name)
        os.chown(home, uid, uid)
    return 0


def _chown(d: Path, config: dict[str, Any], args: list[str]) -> int:
    """chown(1) [-R] USER[:[GROUP]] PATH…, for real, inside the node's folder only."""
    recursive = "-R" in args
    words = [a for a in args if not a.startswith("-")]
    owner, paths = words[0], words[1:]
    user, _, group = owner.partition(":")
    uid, gid = _uid_of(d, user), _uid_of(d, group or user)
    if uid is None or gid is None:
        print(f"chown: invalid user: '{owner}'", file=sys.stderr)
        return 1
    root = Path(config["root"]).resolve()
    for raw in paths:
        path = Path(raw)
        if not path.resolve().is_relative_to(root):
            print(f"fake node: chown of {raw}, outside the node's folder {root}: map it into "
                  "the node's folder first", file=sys.stderr)
            return 1
        if not path.exists():
            print(f"chown: cannot access '{raw}': No such file or directory", file=sys.stderr)
            return 1
        os.lchown(path, uid, gid)
        for top, dirs, files in os.walk(path) if recursive and path.is_dir() else ():
            for name in dirs + files:  # never through a link (chown -R's default, -P)
                os.lchown(os.path.join(top, name), uid, gid)
    return 0


def _numeric(d: Path, config: dict[str, Any], cmd: str, args: list[str]) -> int:
    """install(1) -o USER -g GROUP / chgrp(1) GROUP PATH…: the real program, with the names
    useradd gave resolved to their ids, as the node's NSS would (this machine's /etc/passwd
    has no such user); without `ownership`, the owner is left as it is."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        named = (cmd == "install" and a in ("-o", "-g")) or (cmd == "chgrp" and i == 0)
        value = args[i + 1] if cmd == "install" and named else a
        if named:
            ident = _uid_of(d, value)
            if ident is None:
                print(f"{cmd}: invalid {'user' if a == '-o' else 'group'}: '{value}'",
                      file=sys.stderr)
                return 1
            if config.get("ownership"):
                out += [a, str(ident)] if cmd == "install" else [str(ident)]
            elif cmd == "chgrp":
                return 0
            i += 2 if cmd == "install" else 1
            continue
        out.append(a)
        i += 1
    return subprocess.run([f"/usr/bin/{cmd}" if cmd == "install" else f"/bin/{cmd}", *out]
                          ).returncode


def _runuser(d: Path, config: dict[str, Any], args: list[str]) -> int:
    """runuser(1) -u USER [--] COMMAND…: COMMAND as USER, with HOME, SHELL, USER and LOGNAME
    set as su(1) sets them for a user other than root (util-linux login-utils/su-common.c);
    an unknown user is refused, exit 1."""
    user = args[args.index("-u") + 1]
    rest = args[args.index("-u") + 2:]
    command = rest[1:] if rest[:1] == ["--"] else rest
    uid = _uid_of(d, user)
    if uid is None:
        print(f"runuser: user {user} does not exist or the user entry does not contain all "
              "the required fields", file=sys.stderr)
        return 1
    env = {**os.environ, "HOME": str(d / "home" / user), "SHELL": "/bin/bash", "USER": user,
           "LOGNAME": user}
    argv = drop_to(uid, command) if config.get("ownership") else command
    return subprocess.run(argv, env=env).returncode


def _journalctl(d: Path, args: list[str]) -> int:
    """journalctl(1) -u UNIT [-n N] [--no-pager] [-o cat]: the unit's last N lines (all
    units' output also goes to the machine's log, FakeNode.log)."""
    unit = args[args.index("-u") + 1].removesuffix(".service") if "-u" in args else None
    n = int(args[args.index("-n") + 1]) if "-n" in args else 10
    path = d / "journal" / f"{unit}.log"
    if unit is None or not path.exists():
        print("-- No entries --")
        return 0
    lines = path.read_bytes().splitlines(keepends=True)
    sys.stdout.buffer.write(b"".join(lines[-n:]))
    return 0


def main(argv: list[str]) -> int:
    d = Path(os.environ["FAKE_NODE_DIR"])
    config = json.loads((d / "config.json").read_text())
    cmd, args = argv[0], argv[1:]
    if cmd == "systemctl":
        return _systemctl(d, config, args)
    if cmd == "supervise":
        return _supervise(d, args[0])
    if cmd == "journalctl":
        return _journalctl(d, args)
    if cmd == "gcloud":
        return _gcloud(config, args)
    if cmd == "useradd":
        return _useradd(d, config, args)
    if cmd == "id":  # id(1) -u [USER]: without USER, the caller's
        if args == ["-u"]:
            print(os.getuid())
            return 0
        uid = _uid_of(d, args[-1]) if args else None
        if uid is not None:
            print(uid)
            return 0
        print(f"id: '{args[-1] if args else ''}': no such user", file=sys.stderr)
        return 1
    if cmd == "chown":
        with open(d / "chown.log", "a") as f:
            f.write(" ".join(args) + "\n")
        return _chown(d, config, args) if config.get("ownership") else 0
    if cmd in ("install", "chgrp"):
        return _numeric(d, config, cmd, args)
    if cmd == "runuser":
        return _runuser(d, config, args)
    if cmd in ("reboot", "poweroff"):  # systemd's: the machine goes down; this never returns
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(  # noqa: S310 - the runtime's own server
            f"{config['power_url']}/{cmd}", data=b"", method="POST"), timeout=10).read()
        time.sleep(60)
        return 1
    print(f"fake node: {cmd} is not modelled", file=sys.stderr)
    return 2


if __name__ == "__main__":  # a shim: stdlib only at import, so each call starts fast
    sys.exit(main(sys.argv[1:]))
