"""llama-server as phase 1 relies on it, for real (SmolLM2-135M on the CPU): a streamed request
the client gives up on is cancelled by the disconnect (its slot is free again at once, so the
retry does not queue behind it), and requests beyond the slots wait in its queue instead of a
429."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tasks.compute.inference_server import Served, start_llama_server, stop_llama_server
from tasks.engine.llama_cpp import default_model_path

LONG = {"messages": [{"role": "user", "content": "Count from one to ten thousand."}],
        "max_tokens": 3000, "temperature": 0.0, "ignore_eos": True}
SHORT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
         "temperature": 0.0}


@pytest.fixture
def one_slot(tmp_path: Path) -> Iterator[str]:
    url = start_llama_server(tmp_path, Served(default_model_path(), "m"), 4096, 1, 60, slots=1)
    yield url
    stop_llama_server(tmp_path)


def _processing(url: str) -> bool:
    return any(s["is_processing"] for s in httpx.get(f"{url}/slots").json())


@pytest.mark.serial  # a 1.5 s give-up and a 5 s slot release on 1 thread (issue 36)
def test_a_request_the_client_gives_up_on_frees_its_slot(one_slot: str) -> None:
    """As the client sends it (streamed: llama-server cancels only a streaming task whose
    client went away — a plain request measured here kept its slot for all 3,000 tokens)."""
    import asyncio

    from tasks.extraction.llm import _streamed

    url = one_slot

    async def give_up() -> None:
        async with httpx.AsyncClient(base_url=url) as c:
            await _streamed(c, LONG, 1.5)

    with pytest.raises(httpx.ReadTimeout):  # 3,000 tokens take ~30 s here; we wait 1.5
        asyncio.run(give_up())
    deadline = time.monotonic() + 5
    while _processing(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processing(url)  # cancelled by the disconnect, not run to its 3,000 tokens
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/chat/completions", json=SHORT, timeout=60)
    assert r.status_code == 200 and time.monotonic() - t0 < 5  # the retry is not queued


def test_requests_beyond_the_slots_wait_instead_of_429(one_slot: str) -> None:
    url = one_slot
    with ThreadPoolExecutor(3) as pool:
        codes = list(pool.map(lambda _: httpx.post(f"{url}/v1/chat/completions", json=SHORT,
                                                   timeout=60).status_code, range(3)))
    assert codes == [200, 200, 200]
