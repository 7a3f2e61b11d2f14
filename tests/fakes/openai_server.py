"""A deterministic OpenAI-compatible server on loopback, for tests and benchmarks.

It "extracts" capitalised two-word names as Person entities (the first 12) and links the first
to the rest. Asked again with its answer in the conversation (a gleaning turn, as GraphRAG and
this project send it), it answers the next names it left out, and no relationships; when there
are none, an empty answer.
Markers in the document text script faults, per document:
    FAULT:500x2       the first 2 requests answer HTTP 500 (also 429, 503)
    FAULT:slowx1      the first request sleeps `slow_seconds` (longer than the client timeout)
    FAULT:truncated   every answer is cut-off JSON with finish_reason "stop"
    FAULT:length      finish_reason "length" while the chunk is longer than 400 characters
    FAULT:think       the answer is wrapped in <think>…</think> and has reasoning_content
    FAULT:badlabels   entity types outside the schema ("Spaceship", "company")
    FAULT:extra       an extra top-level field the schema forbids
    FAULT:extrafield  an extra field on every entity and relationship, and at the top level
    FAULT:flood       every answer: 3,000 entities and 3,000 relationships, names and
                      descriptions far over the schema's maxLength
    FAULT:greedyflood the flood while the request is greedy (temperature 0, no seed); a
                      sampled request (temperature > 0 or a seed) gets the normal answer
    FAULT:longname    one entity name of 300 characters (over maxLength)

Asked to judge (tasks/extraction/judge.py: a user message of "Name:", passages and "Candidates:"),
it answers as a careful model would from what the prompt shows: its reasons, then the one
candidate an employer or e-mail domain of which the passages mention, else "none". The marker
    FAULT:judgeoff    in a passage: an answer outside the candidates (a server that does not hold
                      the model to the enum)

Why the fake may break the schema's bounds at all: the client cannot count on the server to
hold the model to the schema. llama.cpp's json-schema-to-grammar does compile maxItems and
maxLength into the grammar when it applies the schema (grammars/README.md), but
llama-cpp-python's server silently falls back to a plain JSON grammar when the conversion
fails (llama_chat_format._grammar_for_json_schema, fallback_to_json=True), vLLM's guided-
decoding backends differ in which keywords they honour, and a server behind the "openai"
dialect may ignore `response_format`. The fake models such an endpoint: it returns whatever
the model wrote. Like vLLM and llama-cpp-python at temperature 0 ("identical outputs in each
run", its server's docs), it is deterministic: the same greedy request gets the same answer;
both servers take `temperature` and `seed`, and so does the fake (greedyflood).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

NAME = re.compile(r"\b([A-Z][a-z]+(?:[-'][A-Z][a-z]+)? [A-Z][a-z]+(?:-[A-Z][a-z]+)?)\b")


def extraction_for(text: str, skip: int = 0) -> dict[str, Any]:
    names: list[str] = []
    for m in NAME.finditer(text):
        if m.group(1) not in names and not m.group(1).startswith(("Document", "Notes")):
            names.append(m.group(1))
    names = names[skip:]
    entities = [{"name": n, "type": "Person", "description": f"named in the text as {n}"}
                for n in names[:12]]
    rels = [{"source": names[0], "target": n, "type": "RELATED_TO", "description": "co-mentioned"}
            for n in names[1:12]]
    return {"entities": entities, "relationships": rels}


def flood(n: int = 3000) -> dict[str, Any]:
    """A model in a repetition loop: thousands of items, every name and description overlong."""
    names = [f"Flood{i} " + "x" * 100 for i in range(n)]
    return {"entities": [{"name": m, "type": "Person", "description": "y" * 400}
                         for m in names],
            "relationships": [{"source": names[0], "target": m, "type": "RELATED_TO",
                               "description": "z" * 400} for m in names[1:]]}


def judgement(user: str) -> dict[str, str]:
    """The judge's answer to its prompt (module docstring): reasons first."""
    passages, candidates = user.split("\nCandidates:\n", 1)
    text = passages.casefold()
    if "FAULT:judgeoff" in passages:
        return {"reasons": "a guess", "answer": "Person:somebody else"}
    fits = []
    for line in candidates.splitlines():
        key, _, evidence = line.removeprefix("- ").partition(": e-mail ")
        emails, _, employers = evidence.partition("; works for ")
        clues = [e.strip() for e in employers.split(",") if e.strip() != "none known"]
        clues += [e.split("@")[-1].split(".")[0] for e in emails.split(",") if "@" in e]
        seen = [c for c in clues if c.casefold() in text]
        if seen:
            fits.append((key, seen[0]))
    if len(fits) == 1:
        key, clue = fits[0]
        return {"reasons": f"The passages mention {clue}, which only {key} is tied to.",
                "answer": key}
    return {"reasons": "The passages name no employer or address that tells them apart.",
            "answer": "none"}


class FakeOpenAI(Served):
    def __init__(self, latency: float = 0.0, slow_seconds: float = 3.0, port: int = 0,
                 host: str = "127.0.0.1", answered_log: Path | None = None) -> None:
        self.latency = latency
        self.answered_log = answered_log  # a line per chat answer sent: what a test can wait on
        self.slow_seconds = slow_seconds
        self.model_id = "fake"  # what /v1/models lists
        self.requests: list[dict[str, Any]] = []
        self.fault_counts: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        # host: a loopback address (127.x.y.z) — a fake node's own "VPC IP" when several
        # serve on one port (tests/fakes/compute_engine.py); backlog: many clients connect at once
        self.http = LoopbackServer(self._handler(), host=host, port=port, backlog=1024)

    @property
    def calls(self) -> int:
        return len(self.requests)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.fault_counts.clear()
            self.max_in_flight = 0

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | str, float]:
        """(status, payload, delay) for one chat request."""
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        user = users[0]
        if user.startswith("Name: ") and "\nCandidates:\n" in user:
            return 200, self._payload(json.dumps(judgement(user)), "stop"), self.latency
        doc = user.split("\n", 1)[0]
        content = extraction_for(user.split("---", 1)[-1])
        answered = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
        if answered:  # a gleaning turn: what the answers so far left out (names past the 12)
            seen = {e["name"] for a in answered for e in json.loads(a)["entities"]}
            more = extraction_for(user.split("---", 1)[-1], skip=len(seen))
            more["entities"] = [e for e in more["entities"] if e["name"] not in seen]
            more["relationships"] = []
            return 200, self._payload(json.dumps(more), "stop"), self.latency
        finish = "stop"
        for code, n in re.findall(r"FAULT:(\d{3})x(\d+)", user):
            key = f"{doc}:{code}"
            with self._lock:
                self.fault_counts[key] += 1
                if self.fault_counts[key] <= int(n):
                    return int(code), f"injected {code}", 0.0
        m = re.search(r"FAULT:slowx(\d+)", user)
        if m:
            with self._lock:
                self.fault_counts[f"{doc}:slow"] += 1
                if self.fault_counts[f"{doc}:slow"] <= int(m.group(1)):
                    return 200, self._payload(json.dumps(content), "stop"), self.slow_seconds
        text = json.dumps(content)
        if "FAULT:truncated" in user:
            text = text[: len(text) // 2]
        if "FAULT:length" in user and len(user.split("---", 1)[-1]) > 400:
            text, finish = text[: len(text) // 2], "length"
        if "FAULT:badlabels" in user:
            content["entities"] += [{"name": "Enterprise Ship", "type": "Spaceship",
                                     "description": "x"},
                                    {"name": "Acme Corp", "type": "company", "description": "y"}]
            content["relationships"] += [{"source": content["entities"][0]["name"],
                                          "target": "Acme Corp", "type": "LOVES",
                                          "description": "z"}]
            text = json.dumps(content)
        if "FAULT:extra" in user and "FAULT:extrafield" not in user:
            content["confidence"] = 0.9
            text = json.dumps(content)
        if "FAULT:extrafield" in user:
            content["confidence"] = 0.9
            for e in content["entities"]:
                e["confidence"] = 0.8
            for r in content["relationships"]:
                r["evidence"] = "line 3"
            text = json.dumps(content)
        if "FAULT:longname" in user:
            content["entities"].append({"name": "Long " + "n" * 295, "type": "Person",
                                        "description": "x"})
            text = json.dumps(content)
        greedy = not body.get("temperature") and body.get("seed") is None
        if "FAULT:flood" in user or ("FAULT:greedyflood" in user and greedy):
            text = json.dumps(flood())
        reasoning = None
        if "FAULT:think" in user:
            reasoning = "Let me think about the entities."
            text = "<think>The user wants {\"entities\": []} maybe.</think>\n" + text
        return 200, self._payload(text, finish, reasoning), self.latency

    @staticmethod
    def _payload(text: str, finish: str, reasoning: str | None = None) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            msg["reasoning_content"] = reasoning
        return {"id": "fake", "object": "chat.completion", "model": "fake",
                "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave as separate writes

            def _send(self, status: int, payload: dict[str, Any] | str) -> None:
                self.send_json(status, payload, {"Retry-After": "0"} if status == 429 else None)

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": fake.model_id}]})
                elif self.path == "/health":  # vLLM: 200, empty body, while the engine is up
                    self._send(200, "")
                else:
                    self._send(404, "not found")

            def do_POST(self) -> None:  # noqa: N802
                body = self.read_json()
                with fake._lock:
                    fake.requests.append(body)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    status, payload, delay = fake.respond(body)
                    if delay:
                        time.sleep(delay)
                    self._send(status, payload)
                    if fake.answered_log:
                        with fake.answered_log.open("a") as log:
                            log.write(f"{status}\n")
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

        return Handler


def main() -> None:
    """Serve in this process until killed: `python -m tests.fakes.openai_server --latency 0.2`."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--port", type=int, default=0, help="0 = any free port")
    ap.add_argument("--host", default="127.0.0.1", help="a loopback address to bind")
    ap.add_argument("--model", default="fake", help="the model id /v1/models lists")
    ap.add_argument("--load-seconds", type=float, default=0.0,
                    help="wait this long before listening, as vLLM does while loading weights")
    ap.add_argument("--answered-log", type=Path, help="append a line per chat answer sent")
    args = ap.parse_args()
    time.sleep(args.load_seconds)
    fake = FakeOpenAI(latency=args.latency, port=args.port, host=args.host,
                      answered_log=args.answered_log)
    fake.model_id = args.model
    print(fake.url, flush=True)
    fake.http.serve_forever()


if __name__ == "__main__":
    main()
