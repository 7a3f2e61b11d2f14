"""A well-behaved OpenAI-compatible endpoint with a fixed latency, for the benchmarks.

Why not tests/fakes/openai_server.py: that is a test double that scripts eleven kinds of fault from
markers in the text; a benchmark needs only the wire of a server that answers every request
correctly after `--latency` seconds. Keeping this copy small and separate means bench/ never
imports tests/ (whose fixtures move with the test tiers), and a fault script can never slip
into a figure. The answer has the same shape as the tests' fake and a vLLM server's: a
chat.completion whose content is the extraction JSON (capitalised two-word names as Person
entities, the first linked to the rest). If the extraction schema changes and this answer no
longer fits, the benches fail on their call/error asserts rather than report a flattering figure.

    python bench/_fakes.py --latency 1.0      # prints its URL, serves until killed
"""

from __future__ import annotations

import argparse
import json
import re
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

NAME = re.compile(r"\b([A-Z][a-z]+(?:[-'][A-Z][a-z]+)? [A-Z][a-z]+(?:-[A-Z][a-z]+)?)\b")


def extraction_for(text: str) -> dict[str, Any]:
    names: list[str] = []
    for m in NAME.finditer(text):
        if m.group(1) not in names and not m.group(1).startswith(("Document", "Notes")):
            names.append(m.group(1))
    return {"entities": [{"name": n, "type": "Person", "description": f"named in the text as {n}"}
                         for n in names[:12]],
            "relationships": [{"source": names[0], "target": n, "type": "RELATED_TO",
                               "description": "co-mentioned"} for n in names[1:12]]}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: 32 clients connect at once


def serve(latency: float, port: int = 0, model: str = "fake") -> _Server:
    """A server bound on 127.0.0.1 (not yet serving): call serve_forever()."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body leave as separate writes

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, payload: dict[str, Any] | str) -> None:
            data = (json.dumps(payload) if isinstance(payload, dict) else payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model}]})
            elif self.path == "/health":
                self._send(200, "")
            else:
                self._send(404, "not found")

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            user = body["messages"][-1]["content"]
            text = json.dumps(extraction_for(user.split("---", 1)[-1]))
            time.sleep(latency)
            self._send(200, {"id": "fake", "object": "chat.completion", "model": model,
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": text}}],
                             "usage": {"prompt_tokens": 100, "completion_tokens": 20,
                                       "total_tokens": 120}})

    return _Server(("127.0.0.1", port), Handler)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    args = ap.parse_args()
    server = serve(args.latency, args.port)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
