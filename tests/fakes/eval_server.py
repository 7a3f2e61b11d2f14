"""An OpenAI-compatible server on loopback that answers from a gold set, for the extraction eval.

It models an extraction model whose answers are known in advance, so the eval's figures can be
checked exactly: for each chat request it takes the chunk from the first user message (what
follows the prompt's "---" line, tasks/extraction/prompt.py user_prompt), finds the gold case
whose text it is, and answers in one of two modes:

    gold   exactly the case's gold facts: every entity under its gold type, named by the first of
           its name and aliases that occurs in the text as written, and every relationship
           triple by those names. The eval must score it 1.0 everywhere.
    noise  a fixed wrong answer, the same shape for every case:
             - "Zorblax Quintane", a Topic the text never names (ungrounded, wrong; a Topic
               because the shipped schema keeps ungrounded names of that type, counted,
               where an ungrounded Person is dropped);
             - the case's first gold entity, named as in the text, with a wrong type
               (Location; Topic when the gold type is Location): right by name, wrong by type;
             - Zorblax Quintane RELATED_TO that entity: a triple no gold has.

A chunk that is no case's text (a case split into parts) gets an empty answer. Like
tests/fakes/openai_server.py it is deterministic, answers /v1/models and /health, and answers chat
completions unstreamed (the "vllm" and "openai" dialects' shape); answers carry usage.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Literal

from tests.fakes.loopback import JsonHandler, LoopbackServer, Served

INVENTED = "Zorblax Quintane"


def _as_written(text: str, entity: dict[str, Any]) -> str:
    return next((n for n in (entity["name"], *entity.get("aliases", [])) if n in text),
                entity["name"])


def gold_answer(case: dict[str, Any]) -> dict[str, Any]:
    names = {e["id"]: _as_written(case["text"], e) for e in case["entities"]}
    return {"entities": [{"name": names[e["id"]], "type": e["type"], "description": ""}
                         for e in case["entities"]],
            "relationships": [{"source": names[r["source"]], "target": names[r["target"]],
                               "type": r["type"], "description": ""}
                              for r in case["relationships"]]}


def noise_answer(case: dict[str, Any]) -> dict[str, Any]:
    first = case["entities"][0]
    real = _as_written(case["text"], first)
    wrong = "Topic" if first["type"] == "Location" else "Location"
    return {"entities": [{"name": INVENTED, "type": "Topic", "description": ""},
                         {"name": real, "type": wrong, "description": ""}],
            "relationships": [{"source": INVENTED, "target": real, "type": "RELATED_TO",
                               "description": ""}]}


class FakeEvalOpenAI(Served):
    def __init__(self, gold: Path, mode: Literal["gold", "noise"], model_id: str = "fake",
                 port: int = 0) -> None:
        self.mode = mode
        self.model_id = model_id
        lines = gold.read_text(encoding="utf-8").splitlines()
        self.cases = {c["text"].strip(): c for c in (json.loads(x) for x in lines if x.strip())}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.http = LoopbackServer(self._handler(), port=port)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        case = self.cases.get(user.split("\n---\n", 1)[-1].strip())
        if case is None:
            return {"entities": [], "relationships": []}
        return gold_answer(case) if self.mode == "gold" else noise_answer(case)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/v1/models":
                    self.send_json(200, {"object": "list", "data": [{"id": fake.model_id}]})
                elif self.path == "/health":
                    self.send_json(200, "")
                else:
                    self.send_json(404, "not found")

            def do_POST(self) -> None:  # noqa: N802
                body = self.read_json()
                with fake._lock:
                    fake.requests.append(body)
                text = json.dumps(fake.answer(body))
                self.send_json(200, {
                    "id": "fake-eval", "object": "chat.completion", "model": fake.model_id,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20,
                              "total_tokens": 120}})

        return Handler


def main() -> None:
    """Serve until killed: `python -m tests.fakes.eval_server GOLD --mode noise`."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("gold", type=Path)
    ap.add_argument("--mode", choices=("gold", "noise"), default="gold")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    fake = FakeEvalOpenAI(args.gold, args.mode, port=args.port)
    print(fake.url, flush=True)
    fake.http.serve_forever()


if __name__ == "__main__":
    main()
