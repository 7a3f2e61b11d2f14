"""A batch whose requests the deadline cannot cover: its documents are deferred — not written,
not marked extracted, not marked failed — against the fake endpoint and a real FalkorDB."""

import time

from tasks.extraction.batch import process_batch
from tasks.extraction.calls import ExtractionConfig
from tasks.extraction.documents import Document
from tasks.extraction.llm import LLMClient
from tasks.extraction.schema import json_schema
from tasks.graph.store import GraphStore
from tests.fakes.openai_server import FakeOpenAI

SCHEMA = json_schema(8, 8)


def doc(name: str, text: str) -> Document:
    return Document(f"transcripts/{name}", "transcripts", f"/x/{name}", name, text,
                    {"title": name})


def test_deferred_documents_are_left_alone(store: GraphStore) -> None:
    with FakeOpenAI(latency=0.3) as fake:
        client = LLMClient(fake.url, "fake", timeout_seconds=5.0, max_concurrency=2)
        first = process_batch([doc("a.md", "Ann Lee met Bob Stone.")], store, client,
                              ExtractionConfig("fake", SCHEMA, 1000), set())
        # batch 2 starts from batch 1's measurements (~0.3 s a request): 0.05 s cover none
        client.deadline = time.time() + 0.05
        second = process_batch([doc("b.md", "Cy Young met Dee Ray."),
                                doc("c.md", "Eve Park met Fay Wu. FAULT:500x9")], store, client,
                               ExtractionConfig("fake", SCHEMA, 1000), set())
        assert fake.calls == 1
    assert sum(first.extracted.values()) == 1 and first.deferred == []
    assert second.deferred == ["transcripts/b.md", "transcripts/c.md"]
    assert (second.failed, sum(second.extracted.values()), second.usage.calls) == ([], 0, 0)
    states = store.document_states()
    assert sorted(states) == ["transcripts/a.md"]  # neither extracted nor failed: no state
    names = {r["n"] for r in store.query("MATCH (e:Entity) RETURN e.name AS n")}
    assert names == {"Ann Lee", "Bob Stone", "a.md"}  # the meeting is named by its title
    assert client.stats()[fake.url]["requests"] == 1  # the batches' copies share the pacing
