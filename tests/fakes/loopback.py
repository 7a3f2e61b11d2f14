"""The one HTTP server every fake serves on: stdlib's ThreadingHTTPServer bound to a loopback
address, on a free port unless told one, served from a daemon thread while entered — so the
real client library (google-cloud-compute, the OpenAI SDK, httpx) talks to it over the wire.
Handlers derive from JsonHandler: quiet, and JSON in and out."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LoopbackServer:
    """`handler` on `host` (127.x.y.z) and `port` (0: a free one); `url` is its root. `poll`:
    how often serve_forever looks for shutdown (stop waits for it; stdlib's 0.5 s default was half
    a second of every test). `backlog`: the listen queue, for many clients connecting at once."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, host: str = "127.0.0.1",
                 port: int = 0, poll: float = 0.05, backlog: int | None = None) -> None:
        # a fake node's own "VPC IP" is a loopback address of its own (compute_engine.py)
        if not host.startswith("127."):
            raise ValueError(f"host {host!r}: the fake serves on loopback only (127.x.y.z)")
        server_class = ThreadingHTTPServer if backlog is None else type(
            "_Server", (ThreadingHTTPServer,), {"request_queue_size": backlog})
        self.server = server_class((host, port), handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._poll = poll
        self._thread = threading.Thread(target=self.server.serve_forever, args=(poll,),
                                        daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def serve_forever(self) -> None:
        """Serve in this thread until killed (a fake's `python -m` entry point)."""
        self.server.serve_forever(self._poll)


class Served:
    """A fake whose wire is one LoopbackServer, `self.http`: `with fake:` serves it while the
    block runs, at `url`. A fake with more to start or stop (a clock, say) extends the pair."""

    http: LoopbackServer

    @property
    def url(self) -> str:
        return self.http.url

    def __enter__(self) -> Self:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing, reads the body and answers with one."""

    def log_message(self, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def read_json(self) -> Any:
        return json.loads(self.read_body())

    def send_body(self, status: int, data: bytes, content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: nothing to answer
            pass

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None
                  ) -> None:
        """A str is sent as it is (an empty or plain-text body), anything else as JSON."""
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.send_body(status, data.encode(), headers=headers)
