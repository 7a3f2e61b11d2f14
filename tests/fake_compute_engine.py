"""A local Compute Engine v1 REST server, for driving the real google-cloud-compute client
(REST transport) without GCP.

Implemented (the subset the GCE node, `tasks.compute.gce.GceNode`, uses):
    GET  /compute/v1/projects/P/zones/Z/instances/I                    instances.get
    POST /compute/v1/projects/P/zones/Z/instances/I/start              instances.start
    POST /compute/v1/projects/P/zones/Z/instances/I/stop               instances.stop
    POST /compute/v1/projects/P/zones/Z/instances/I/setScheduling      instances.setScheduling
    POST /compute/v1/projects/P/zones/Z/instances/I/setMetadata        instances.setMetadata
    GET  /compute/v1/projects/P/zones/Z/operations/O                   zoneOperations.get
    POST /compute/v1/projects/P/zones/Z/operations/O/wait              zoneOperations.wait
    GET  /compute/v1/projects/P/zones/Z/operations?filter=...          zoneOperations.list
    POST /token                                                        OAuth token (service accounts)

Simulated behaviour, on the wall clock (durations are attributes, in seconds):
    operations       PENDING → RUNNING → DONE
    start            TERMINATED → STAGING → RUNNING after `boot_seconds` (per instance)
    stop             RUNNING → STOPPING → TERMINATED after `stop_seconds`
    stockout         `stock_out(zone, "SPOT")`: a start in that zone with that provisioning
                     model ends DONE with ZONE_RESOURCE_POOL_EXHAUSTED, as a real stockout does
    preemption       `preempt(zone, name)`: TERMINATED now, plus a compute.instances.preempted
                     operation, as GCE records it
    missing instance 404 with Compute's error JSON
    every call       recorded in `calls` (method, path, Authorization header seen)
    RUNNING time     per instance, `running_seconds(zone, name)`
    node agent       optional `on_start` argv: launched when an instance reaches RUNNING and
                     killed on stop/preemption, as the node's startup script starts vLLM; the
                     metadata key `slm-vllm` = "stopped" / "running" stops / restarts it, as
                     the node's watcher does.
    node worker      optional `node_worker` argv: launched when an instance reaches RUNNING
                     and killed (with everything it started) on stop/preemption only — the
                     node's Prefect worker on its own pool, as the startup script starts it.
The instance's networkInterfaces[0].networkIP is 127.0.0.1, so whatever `on_start` launches is
reachable at the node's "VPC IP". The server binds 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ya29.fake-compute-token-7f3c"  # what /token hands out; tests check it never leaks
AGENT_KEY = "slm-vllm"


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


@dataclass
class FakeInstance:
    project: str
    zone: str
    name: str
    id: int
    status: str = "TERMINATED"
    provisioning_model: str = "SPOT"
    boot_seconds: float = 0.3
    metadata: dict[str, str] = field(default_factory=dict)
    metadata_fingerprint: str = "fp-0"
    last_start: float | None = None
    last_stop: float | None = None
    running_since: float | None = None
    running_total: float = 0.0
    agent: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None  # the node's Prefect worker (node_worker)
    generation: int = 0  # bumps on every start/stop so stale scheduled events are dropped

    def link(self, base: str) -> str:
        return f"{base}/compute/v1/projects/{self.project}/zones/{self.zone}/instances/{self.name}"

    def scheduling(self) -> dict[str, Any]:
        if self.provisioning_model == "SPOT":
            return {"provisioningModel": "SPOT", "preemptible": True, "automaticRestart": False,
                    "onHostMaintenance": "TERMINATE", "instanceTerminationAction": "STOP"}
        return {"provisioningModel": "STANDARD", "preemptible": False, "automaticRestart": False,
                "onHostMaintenance": "TERMINATE"}


@dataclass
class FakeOperation:
    project: str
    zone: str
    name: str
    id: int
    op_type: str
    target: FakeInstance
    created: float
    running_at: float
    done_at: float
    error: dict[str, Any] | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class FakeComputeEngine:
    """Use as a context manager; `url` is the api_endpoint to give the client."""

    def __init__(self, project: str = "test-project", op_pending_seconds: float = 0.05,
                 stop_seconds: float = 0.2, wait_cap_seconds: float = 2.0,
                 on_start: Callable[[FakeInstance], list[str]] | None = None,
                 agent_log: Path | None = None,
                 node_worker: Callable[[FakeInstance], list[str]] | None = None) -> None:
        self.project = project
        self.op_pending_seconds = op_pending_seconds
        self.stop_seconds = stop_seconds
        self.wait_cap_seconds = wait_cap_seconds  # the real wait returns after ~2 minutes
        self.on_start = on_start
        self.agent_log = agent_log
        self.node_worker = node_worker
        self.instances: dict[tuple[str, str], FakeInstance] = {}
        self.operations: dict[tuple[str, str], FakeOperation] = {}
        self.stockouts: set[tuple[str, str]] = set()
        self.calls: list[dict[str, Any]] = []
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count(1)
        self._lock = threading.RLock()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.token_uri = f"{self.url}/token"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---- test controls -------------------------------------------------------------------
    def __enter__(self) -> FakeComputeEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self._lock:
            for inst in self.instances.values():
                self._kill_agent(inst)

    def add_instance(self, zone: str, name: str, *, status: str = "TERMINATED",
                     provisioning_model: str = "SPOT", boot_seconds: float = 0.3) -> FakeInstance:
        with self._lock:
            inst = FakeInstance(self.project, zone, name, next(self._seq), status=status,
                                provisioning_model=provisioning_model, boot_seconds=boot_seconds)
            self.instances[(zone, name)] = inst
            if status == "RUNNING":
                self._enter_running(inst)
            return inst

    def stock_out(self, zone: str, *models: str) -> None:
        """Starts in `zone` with these provisioning models ("SPOT", "STANDARD") fail."""
        with self._lock:
            for m in models or ("SPOT",):
                self.stockouts.add((zone, m))

    def restock(self, zone: str) -> None:
        with self._lock:
            self.stockouts = {s for s in self.stockouts if s[0] != zone}

    def preempt(self, zone: str, name: str) -> None:
        """Spot preemption: the instance goes TERMINATED now and GCE records the operation."""
        with self._lock:
            self._tick()
            inst = self.instances[(zone, name)]
            now = time.time()
            op = self._new_op(inst, "compute.instances.preempted", now, now)
            op.running_at = op.done_at = now
            inst.generation += 1
            self._leave_running(inst, "TERMINATED")

    def instance(self, zone: str, name: str) -> FakeInstance:
        with self._lock:
            self._tick()
            return self.instances[(zone, name)]

    def running_seconds(self, zone: str, name: str) -> float:
        with self._lock:
            self._tick()
            inst = self.instances[(zone, name)]
            extra = time.time() - inst.running_since if inst.running_since is not None else 0.0
            return inst.running_total + extra

    def seen(self, verb: str, zone: str | None = None, name: str | None = None) -> list[dict]:
        """Recorded calls of one kind: 'get', 'start', 'stop', 'setScheduling', ..."""
        return [c for c in self.calls if c["verb"] == verb
                and (zone is None or c.get("zone") == zone)
                and (name is None or c.get("instance") == name)]

    # ---- simulation ----------------------------------------------------------------------
    def _at(self, when: float, fn: Callable[[], None]) -> None:
        self._events.append((when, next(self._seq), fn))
        self._events.sort(key=lambda e: (e[0], e[1]))

    def _tick(self) -> None:
        now = time.time()
        while self._events and self._events[0][0] <= now:
            _, _, fn = self._events.pop(0)
            fn()

    def _new_op(self, inst: FakeInstance, op_type: str, running_at: float,
                done_at: float) -> FakeOperation:
        n = next(self._seq)
        name = f"operation-{int(time.time() * 1000)}-{n:06d}"
        op = FakeOperation(self.project, inst.zone, name, 7_000_000 + n, op_type, inst,
                           time.time(), running_at, done_at)
        self.operations[(inst.zone, name)] = op
        return op

    def _enter_running(self, inst: FakeInstance) -> None:
        now = time.time()
        inst.status = "RUNNING"
        inst.last_start = now
        inst.running_since = now
        if self.on_start is not None and inst.metadata.get(AGENT_KEY, "running") != "stopped":
            self._launch_agent(inst)
        if self.node_worker is not None:
            inst.worker = self._spawn(self.node_worker(inst))

    def _leave_running(self, inst: FakeInstance, status: str) -> None:
        now = time.time()
        if inst.running_since is not None:
            inst.running_total += now - inst.running_since
            inst.running_since = None
        if status == "TERMINATED":
            inst.last_stop = now
        inst.status = status
        self._kill_agent(inst)
        worker, inst.worker = inst.worker, None
        self._end(worker)

    def _launch_agent(self, inst: FakeInstance) -> None:
        if inst.agent is not None and inst.agent.poll() is None or self.on_start is None:
            return
        inst.agent = self._spawn(self.on_start(inst))

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        out = open(self.agent_log, "ab") if self.agent_log else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]

    def _kill_agent(self, inst: FakeInstance) -> None:
        proc, inst.agent = inst.agent, None
        self._end(proc)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes] | None) -> None:
        """Stop a node process and everything it started, as a powered-off VM ends all of its
        processes (a worker's flow-run processes run in sessions of their own)."""
        import psutil

        if proc is None or proc.poll() is not None:
            return
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        os.kill(proc.pid, signal.SIGTERM)  # our own child, by PID
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        for child in family:  # what it started, found before it went
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass

    def worker_running(self, zone: str, name: str) -> bool:
        with self._lock:
            w = self.instances[(zone, name)].worker
            return w is not None and w.poll() is None

    def agent_running(self, zone: str, name: str) -> bool:
        with self._lock:
            agent = self.instances[(zone, name)].agent
            return agent is not None and agent.poll() is None

    def _start(self, inst: FakeInstance) -> FakeOperation:
        now = time.time()
        pending = now + self.op_pending_seconds
        if inst.status != "TERMINATED":  # GCE: a start of a running instance is a no-op op
            return self._new_op(inst, "start", pending, pending)
        if (inst.zone, inst.provisioning_model) in self.stockouts:
            op = self._new_op(inst, "start", pending, pending)
            op.error = {
                "errors": [{
                    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                    "message": f"The zone 'projects/{self.project}/zones/{inst.zone}' does not "
                               "have enough resources available to fulfill the request.  Try a "
                               "different zone, or try again later."}]}
            return op
        op = self._new_op(inst, "start", pending, pending + inst.boot_seconds)
        inst.generation += 1
        gen = inst.generation

        def staging() -> None:
            if inst.generation == gen:
                inst.status = "STAGING"

        def running() -> None:
            if inst.generation == gen:
                self._enter_running(inst)

        self._at(pending, staging)
        self._at(pending + inst.boot_seconds, running)
        return op

    def _stop(self, inst: FakeInstance) -> FakeOperation:
        now = time.time()
        pending = now + self.op_pending_seconds
        if inst.status == "TERMINATED":
            return self._new_op(inst, "stop", pending, pending)
        op = self._new_op(inst, "stop", pending, pending + self.stop_seconds)
        inst.generation += 1
        gen = inst.generation
        self._leave_running(inst, "STOPPING")

        def terminated() -> None:
            if inst.generation == gen:
                self._leave_running(inst, "TERMINATED")

        self._at(pending + self.stop_seconds, terminated)
        return op

    # ---- JSON shapes ---------------------------------------------------------------------
    def _instance_json(self, inst: FakeInstance) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": "compute#instance", "id": str(inst.id), "name": inst.name,
            "zone": f"{self.url}/compute/v1/projects/{self.project}/zones/{inst.zone}",
            "machineType": f"{self.url}/compute/v1/projects/{self.project}/zones/{inst.zone}"
                           "/machineTypes/g2-standard-4",
            "status": inst.status, "selfLink": inst.link(self.url),
            "scheduling": inst.scheduling(),
            "guestAccelerators": [{"acceleratorType": "nvidia-l4", "acceleratorCount": 1}],
            "networkInterfaces": [{"name": "nic0", "networkIP": "127.0.0.1",
                                   "network": "global/networks/default"}],
            "metadata": {"kind": "compute#metadata", "fingerprint": inst.metadata_fingerprint,
                         "items": [{"key": k, "value": v} for k, v in inst.metadata.items()]},
        }
        if inst.last_start:
            d["lastStartTimestamp"] = _rfc3339(inst.last_start)
        if inst.last_stop:
            d["lastStopTimestamp"] = _rfc3339(inst.last_stop)
        return d

    def _op_json(self, op: FakeOperation) -> dict[str, Any]:
        now = time.time()
        status = "DONE" if now >= op.done_at else "RUNNING" if now >= op.running_at else "PENDING"
        zone_url = f"{self.url}/compute/v1/projects/{self.project}/zones/{op.zone}"
        d: dict[str, Any] = {
            "kind": "compute#operation", "id": str(op.id), "name": op.name,
            "zone": zone_url, "operationType": op.op_type,
            "targetLink": op.target.link(self.url), "targetId": str(op.target.id),
            "status": status, "user": "system" if "preempted" in op.op_type else
            "sync@test-project.iam.gserviceaccount.com",
            "progress": 100 if status == "DONE" else 0,
            "insertTime": _rfc3339(op.created), "selfLink": f"{zone_url}/operations/{op.name}",
        }
        if status != "PENDING":
            d["startTime"] = _rfc3339(op.running_at)
        if status == "DONE":
            d["endTime"] = _rfc3339(op.done_at)
            if op.error:
                d["error"] = op.error
                d["httpErrorStatusCode"] = 503
                d["httpErrorMessage"] = "SERVICE UNAVAILABLE"
        return d

    def _not_found(self, what: str) -> tuple[int, dict[str, Any]]:
        msg = f"The resource '{what}' was not found"
        return 404, {"error": {"code": 404, "message": msg,
                               "errors": [{"message": msg, "domain": "global",
                                           "reason": "notFound"}]}}

    # ---- routing -------------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: dict[str, Any],
               auth: str | None) -> tuple[int, dict[str, Any]]:
        url = urlparse(raw_path)
        path = url.path
        if path == "/token":
            return 200, {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"}
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)"
                         r"(?:/([^/]+))?(?:/([A-Za-z]+))?", path)
        if not m:
            return 404, {"error": {"code": 404, "message": f"no route {method} {path}"}}
        project, zone, kind, name, verb = m.groups()
        with self._lock:
            self._tick()
            call_verb = verb or ("get" if name else "list")
            self.calls.append({"method": method, "verb": call_verb, "kind": kind, "zone": zone,
                               "instance" if kind == "instances" else "operation": name,
                               "auth": auth, "at": time.time()})
            if project != self.project:
                return 403, {"error": {"code": 403, "message": f"Project {project} not found or "
                                       "permission denied", "errors": [{"reason": "forbidden"}]}}
            if kind == "operations":
                return self._operations(zone, name, verb, parse_qs(url.query))
            inst = self.instances.get((zone, name or ""))
            if inst is None:
                return self._not_found(f"projects/{project}/zones/{zone}/instances/{name}")
            if method == "GET" and verb is None:
                return 200, self._instance_json(inst)
            if verb == "start":
                return 200, self._op_json(self._start(inst))
            if verb == "stop":
                return 200, self._op_json(self._stop(inst))
            if verb == "setScheduling":
                return self._set_scheduling(inst, body)
            if verb == "setMetadata":
                return self._set_metadata(inst, body)
        return 400, {"error": {"code": 400, "message": f"unsupported {method} {path}"}}

    def _operations(self, zone: str, name: str | None, verb: str | None,
                    query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        if name is None:  # list, with the one filter shape GceNode sends
            wanted = re.findall(r'operationType\s*=\s*"([^"]+)"', query.get("filter", [""])[0])
            items = [self._op_json(o) for (z, _), o in self.operations.items()
                     if z == zone and (not wanted or o.op_type in wanted)]
            return 200, {"kind": "compute#operationList", "items": items}
        op = self.operations.get((zone, name))
        if op is None:
            return self._not_found(f"projects/{self.project}/zones/{zone}/operations/{name}")
        if verb == "wait":
            deadline = time.time() + self.wait_cap_seconds
            while time.time() < min(deadline, op.done_at):
                self._lock.release()
                try:
                    time.sleep(0.02)
                finally:
                    self._lock.acquire()
                self._tick()
        return 200, self._op_json(op)

    def _set_scheduling(self, inst: FakeInstance, body: dict[str, Any]) -> tuple[int, dict]:
        model = body.get("provisioningModel", inst.provisioning_model)
        if inst.status != "TERMINATED" and model != inst.provisioning_model:
            return 400, {"error": {"code": 400, "message": "Changing the provisioning model "
                                   "requires the instance to be stopped.",
                                   "errors": [{"reason": "badRequest"}]}}
        inst.provisioning_model = model
        now = time.time()
        op = self._new_op(inst, "setScheduling", now, now + self.op_pending_seconds)
        return 200, self._op_json(op)

    def _set_metadata(self, inst: FakeInstance, body: dict[str, Any]) -> tuple[int, dict]:
        if body.get("fingerprint") != inst.metadata_fingerprint:
            return 412, {"error": {"code": 412, "message": "Supplied fingerprint does not match "
                                   "current metadata fingerprint.",
                                   "errors": [{"reason": "conditionNotMet"}]}}
        inst.metadata = {i["key"]: i.get("value", "") for i in body.get("items", [])}
        inst.metadata_fingerprint = "fp-" + hashlib.sha256(
            json.dumps(inst.metadata, sort_keys=True).encode()).hexdigest()[:12]
        if inst.status == "RUNNING":  # the node's watcher acts on the key
            if inst.metadata.get(AGENT_KEY) == "stopped":
                self._kill_agent(inst)
            elif self.on_start is not None:
                self._launch_agent(inst)
        now = time.time()
        op = self._new_op(inst, "setMetadata", now, now + self.op_pending_seconds)
        return 200, self._op_json(op)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length", 0) or 0)
                raw = self.rfile.read(length) if length else b""
                body: dict[str, Any] = {}
                if raw and "json" in (self.headers.get("Content-Type") or "json"):
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = {}
                status, payload = fake.handle(method, self.path, body,
                                              self.headers.get("Authorization"))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

        return Handler
