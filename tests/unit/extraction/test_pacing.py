"""Client pacing (tasks/extraction/pacing.py): the adaptive limit against a simulated server
in virtual time, timeout sizing, the deadline gate and endpoint choice through the real client.

The simulated server models how vLLM and llama.cpp's server treat requests beyond their
capacity (vLLM docs, "Scheduler"/`max_num_seqs`; llama.cpp tools/server README, `--parallel`
slots): up to `slots` are decoded at once, each at `rate` tokens/s, and the rest wait in a FIFO
queue — no 429. Its best concurrency is therefore exactly `slots`, its throughput there
`slots x rate`; more in flight only adds queueing latency.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections import Counter
from dataclasses import replace

import httpx
import pytest

from tasks.extraction.llm import LLMClient, Usage
from tasks.extraction.pacing import Endpoint, Pacing, Ticket, quantile
from tasks.extraction.schema import json_schema
from tasks.shared.errors import Deferred
from tests.fakes.openai_server import FakeOpenAI

SCHEMA = json_schema(4, 4)


class SlotServer:
    """`slots` requests decode at `rate` tokens/s each; the rest queue (virtual time)."""

    def __init__(self, slots: int, rate: float, now: list[float]) -> None:
        self.slots, self.rate, self.now = slots, rate, now
        self.active, self.seq = 0, 0
        self.queue: list[tuple] = []
        self.events: list[tuple] = []

    def submit(self, req: tuple) -> None:
        if self.active < self.slots:
            self._serve(req)
        else:
            self.queue.append(req)

    def _serve(self, req: tuple) -> None:
        self.active += 1
        self.seq += 1
        heapq.heappush(self.events, (self.now[0] + req[2] / self.rate, self.seq, req))

    def done(self) -> None:
        self.active -= 1
        while self.queue and self.active < self.slots:
            self._serve(self.queue.pop(0))


def simulate(servers: list[SlotServer], now: list[float], until: float, ceiling: int = 32,
             change: tuple[float, int, int] | None = None
             ) -> tuple[Pacing, list[tuple[float, str, int, int]]]:
    """Endless demand through one Pacing over `servers`: fill every free slot, advance to the
    next completion. `change` = (time, server index, new slots). Returns the pacing and one
    (time, url, limit, tokens) per completion."""
    pacing = Pacing(tuple(f"s{i}" for i in range(len(servers))), ceiling, True,
                    clock=lambda: now[0])
    by_url = dict(zip((e.url for e in pacing.endpoints), servers, strict=True))
    rng = random.Random(7)
    log: list[tuple[float, str, int, int]] = []
    while now[0] < until:
        if change and now[0] >= change[0]:
            servers[change[1]].slots, change = change[2], None
        while (ep := pacing.pick()) is not None:
            by_url[ep.url].submit((ep, ep.start(), rng.randint(50, 150)))
        srv = min((s for s in servers if s.events), key=lambda s: s.events[0][0])
        now[0], _, (ep, ticket, tokens) = heapq.heappop(srv.events)
        srv.done()
        ep.finish(ticket, "ok", tokens)
        log.append((now[0], ep.url, ep.limit, tokens))
    return pacing, log


def throughput(log: list[tuple[float, str, int, int]], start: float, end: float,
               url: str | None = None) -> float:
    return sum(n for t, u, _, n in log if start < t <= end and url in (None, u)) / (end - start)


@pytest.mark.parametrize("slots", [4, 8, 16])
def test_the_limit_settles_on_the_servers_slots(slots: int) -> None:
    now = [0.0]
    pacing, log = simulate([SlotServer(slots, 20.0, now)], now, until=3000.0)
    late = Counter(limit for t, _, limit, _ in log if t > 1500)
    assert late.most_common(1)[0][0] == slots
    assert sum(n for k, n in late.items() if slots - 1 <= k <= slots + 1) >= 0.9 * late.total()
    assert throughput(log, 1500, 3000) >= 0.95 * slots * 20.0  # the best any limit gets
    assert pacing.endpoints[0].peak_limit <= 2 * slots  # slow start overshoots once at most


def test_the_limit_follows_the_capacity_when_it_halves() -> None:
    now = [0.0]
    _, log = simulate([SlotServer(8, 20.0, now)], now, until=4000.0, change=(1500.0, 0, 4))
    late = Counter(limit for t, _, limit, _ in log if t > 2500)
    assert late.most_common(1)[0][0] == 4
    assert sum(n for k, n in late.items() if 3 <= k <= 5) >= 0.9 * late.total()
    assert throughput(log, 2500, 4000) >= 0.95 * 4 * 20.0


def test_two_endpoints_share_the_work_by_capacity() -> None:
    now = [0.0]
    pacing, log = simulate([SlotServer(12, 20.0, now), SlotServer(4, 20.0, now)], now,
                           until=3000.0)
    big, small = (throughput(log, 1500, 3000, u) for u in ("s0", "s1"))
    assert big >= 0.95 * 12 * 20.0 and small >= 0.95 * 4 * 20.0
    assert 2.7 <= big / small <= 3.3  # 12 slots against 4
    limits = pacing.stats()
    assert (limits["s0"]["limit"], limits["s1"]["limit"]) in {
        (a, b) for a in (11, 12, 13) for b in (3, 4, 5)}


def test_fixed_concurrency_stays_at_the_ceiling() -> None:
    ep = Endpoint("u", 8, adaptive=False, clock=lambda: 0.0)
    ep.finish(ep.start(), "busy")
    assert ep.limit == 8


def test_busy_timeout_and_refusal_cut_the_limit_once_per_limit() -> None:
    now = [0.0]
    ep = Endpoint("u", 32, clock=lambda: now[0])
    ep.limit = 10
    a, b = ep.start(), ep.start()
    now[0] = 1.0
    ep.finish(a, "busy")  # 429/503
    assert ep.limit == 7  # floor(10 x 0.7)
    ep.finish(b, "busy")  # sent under the old limit: the cut already answered it
    assert ep.limit == 7
    ep.finish(ep.start(), "timeout")
    assert ep.limit == 5  # round(7 x 0.7)
    ep.finish(ep.start(), "down")
    assert (ep.limit, ep.down_until) == (4, 6.0)  # and no new request for 5 s if others can
    for expected in (3, 2, 1, 1):  # at least one step down while it can; never under one
        ep.finish(ep.start(), "down")
        assert ep.limit == expected
    ep.finish(ep.start(), "other")  # a 500: no signal about load
    assert (ep.limit, ep.busy, ep.timeouts, ep.refused) == (1, 2, 1, 5)


def test_a_request_overdue_in_flight_cuts_before_the_window_ends() -> None:
    """vLLM preempts and recomputes when its KV cache runs out: a request in flight for twice
    the recent 95th-percentile latency means the server thrashes now."""
    now = [0.0]
    ep = Endpoint("u", 32, clock=lambda: now[0])
    ep.slow_start, ep.limit = False, 8
    ep.recent.extend([(1.0, 100)] * 8)  # measured: 1 s a request
    stuck = ep.start()
    for sent in (0.9, 1.1):  # answers of 1 s each, while the first is still in flight
        now[0] = sent
        quick = ep.start()
        now[0] = sent + 1.0
        if sent == 0.9:
            ep.finish(quick, "ok", 100)
            assert ep.limit == 8  # 1.9 s: not yet overdue
    ep.finish(quick, "ok", 100)
    assert ep.limit == 6  # the oldest has been in flight 2.1 s > 2 x 1 s: round(8 x 0.7)
    assert ep.stats()["limit"] == 6 and stuck.epoch == 0


def test_timeouts_are_sized_from_max_tokens_and_the_measured_rate() -> None:
    ep = Endpoint("u", 8, clock=lambda: 0.0)
    assert ep.timeout(1024, 300.0) == (300.0, "request_timeout_seconds")  # nothing measured
    ep.recent.extend([(10.0, 200), (30.0, 600), (5.0, 0)])  # 800 tokens in 40 s; no usage
    assert ep.decode_rate() == 20.0
    seconds, why = ep.timeout(1024, 300.0)
    assert seconds == pytest.approx(153.6)  # 3 x 1024 / 20
    assert why == "3 x max_tokens 1024 at the measured 20 tokens/s per request, at least 30 s"
    assert ep.timeout(100, 300.0)[0] == 30.0  # 15 s sized, the floor is 30 s
    assert ep.timeout(100, 4.0)[0] == 15.0  # a configured timeout under 30 s is the floor
    c = LLMClient("http://h:1", "m")
    msg = c._transport_error(httpx.ReadTimeout(""), "http://h:1", (seconds, why))
    assert msg == ("ReadTimeout: no answer from http://h:1/v1/chat/completions within 154 s "
                   f"({why}) — the server slowed down (another tenant, longer prompts?): lower "
                   "max_output_tokens or max_concurrent_requests")


def test_the_gate_estimate_is_a_high_quantile_of_the_latest_latencies() -> None:
    ep = Endpoint("u", 8, clock=lambda: 0.0)
    assert ep.latency_estimate(256, 40.0) == 0.0  # nothing measured: send while time is left
    ep.recent.extend((float(s), 100) for s in range(1, 21))  # 1 … 20 s
    # the last max(16, 2 x limit 8) = 16 answers, 5 … 20 s: the 90th percentile by nearest rank
    assert ep.gate_sample() == [float(s) for s in range(5, 21)]
    assert ep.latency_estimate(256, 40.0) == 19.0
    ep.recent.append((500.0, 100))
    assert ep.latency_estimate(256, 40.0) == 20.0  # one outlier moves it by one rank
    ep.recent.extend([(10_000.0, 100)] * 3)
    # 10,000 s is the 90th percentile now, but a request ends by its timeout: 3 x 256 tokens
    # at the measured 2,400 tokens / 30,710 s (9,827 s)
    assert ep.latency_estimate(256, 40.0) == pytest.approx(3 * 256 * 30_710 / 2400)


def call(c: LLMClient, user: str = "Ann Lee met Bob Stone.") -> object:
    async def go() -> object:
        async with c:
            return await c.extract("system", user, SCHEMA)
    return asyncio.run(go())


def test_a_request_the_deadline_cannot_cover_is_deferred_without_a_call() -> None:
    with FakeOpenAI(latency=0.3) as fake:
        c = LLMClient(fake.url, "fake", timeout_seconds=5.0, deadline=time.time() - 0.01)
        with pytest.raises(Deferred, match=r"leaves -\d+\.\d s"):
            call(c)  # past the deadline: nothing goes, measured or not
        assert fake.calls == 0
        # nothing measured, 2 s left, a 5 s timeout: sent all the same (sending is the only
        # way to measure; the request ends by its timeout) — and now measured: ~0.3 s
        c = LLMClient(fake.url, "fake", timeout_seconds=5.0, deadline=time.time() + 2.0)
        call(c)
        assert fake.calls == 1
        c.deadline = time.time() + 0.1
        with pytest.raises(Deferred, match=r"leaves 0\.\d s.*~0\.[3-9] s \(90% of its last 1 "):
            call(c)
        c.deadline = time.time() + 60  # closed once, closed for good: no document starts late
        with pytest.raises(Deferred, match="gate is closed"):
            call(c)
        assert fake.calls == 1


def test_a_retry_whose_backoff_would_overrun_the_deadline_is_deferred() -> None:
    with FakeOpenAI() as fake:
        # the backoff (full jitter): uniform in [0, 1e6] s, under 2 s once in 500,000 runs
        c = LLMClient(fake.url, "fake", timeout_seconds=1.0, retry_base_seconds=1e6,
                      retry_max_seconds=1e6, deadline=time.time() + 2.0)
        t = time.monotonic()
        with pytest.raises(Deferred, match="a retry after"):
            call(c, "Ann Lee FAULT:500x1")
        assert fake.calls == 1 and time.monotonic() - t < 2.0  # did not sleep 2.5 s or more


def test_a_refused_endpoint_sends_the_retry_to_the_other() -> None:
    from tasks.shared.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with FakeOpenAI() as fake:
        c = LLMClient(dead, "fake", more_urls=(fake.url,), retry_base_seconds=0.01,
                      max_concurrency=4)
        assert c.base_urls == (dead, fake.url)
        call(c)
        call(c)
        stats = c.stats()
    assert stats[dead]["refused"] == 1 and stats[dead]["limit"] == 3  # round(4 x 0.7)
    assert stats[fake.url]["requests"] == 2 and fake.calls == 2  # the second avoided the dead one
    assert stats[fake.url]["completion_tokens"] == 40  # the fake reports 20 per answer
    assert set(stats[fake.url]) >= {"requests", "completion_tokens", "limit", "peak_limit",
                                    "decode_tokens_per_s"}


def test_copies_of_a_client_share_its_pacing() -> None:
    c = LLMClient("http://h:1", "m", more_urls=("http://h:2",), max_concurrency=16)
    c.pacing.endpoints[0].limit = 9  # type: ignore[union-attr]
    batch = replace(c, usage=Usage())
    assert batch.pacing is c.pacing and batch.stats()["http://h:1"]["limit"] == 9
    assert [e.limit for e in LLMClient("http://h:1", "m", max_concurrency=2).pacing.endpoints
            ] == [2]  # type: ignore[union-attr]


def test_tickets_record_the_limit_they_were_sent_under() -> None:
    ep = Endpoint("u", 8, clock=lambda: 0.0)
    t = ep.start()
    assert t == Ticket(0.0, 0.0, 0) and ep.in_flight == 1


def test_a_deferred_chunk_defers_its_document_and_nothing_is_marked() -> None:
    from tasks.extraction.answers import BatchReport, build_batch
    from tasks.extraction.calls import ExtractionConfig, extract_documents
    from tasks.extraction.documents import Document

    def doc(name: str, text: str) -> Document:
        return Document(f"transcripts/{name}", "transcripts", f"/x/{name}", "h", text,
                        {"title": name})

    long = "\n".join(f"Line {i}: Ann Lee spoke to Bob Stone." for i in range(60))
    with FakeOpenAI(latency=0.3) as fake:
        c = LLMClient(fake.url, "fake", timeout_seconds=5.0, max_concurrency=2)
        first = asyncio.run(extract_documents(c, ExtractionConfig("fake", SCHEMA, 1000),
                                              [doc("a.md", "Ann Lee met Bob Stone.")]))
        # measured ~0.3 s; a second batch whose deadline covers none of its requests
        c.deadline = time.time() + 0.05
        outcomes = asyncio.run(extract_documents(c, ExtractionConfig("fake", SCHEMA, 64),
                                                 [doc("b.md", long), doc("c.md", "Cy Young")]))
        assert fake.calls == 1
    assert not first[0].deferred and first[0].error is None
    assert [(o.deferred, o.error, o.extraction) for o in outcomes] == [(True, None, [])] * 2
    batch = build_batch(first + outcomes, "fake", {}, BatchReport())
    assert [d["id"] for d in batch.documents] == ["transcripts/a.md"]  # only it gets marked


def test_a_server_that_answers_nothing_is_cut_while_requests_wait() -> None:
    """A thrashing server may finish nothing for a long while: the waiting requests look for
    overdue ones themselves (there is no completion to look from)."""
    async def go() -> int:
        pacing = Pacing(("u",), 8)
        ep = pacing.endpoints[0]
        ep.slow_start, ep.limit = False, 2
        ep.recent.extend([(0.05, 100)] * 8)  # measured: 0.05 s a request
        ep.start(), ep.start()  # both stuck: never answered
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pacing.acquire(None, 256, 5.0), 1.0)
        return ep.limit
    assert asyncio.run(go()) == 1  # overdue after 2 x 0.05 s: cut from 2 to 1


# ---- exact values of the estimates, the counters and the endpoint choice ----
def test_the_quantile_is_an_observed_value_by_nearest_rank() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.95) == 3.0  # rank ceil(2.85) = 3
    assert quantile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0  # rank ceil(1.5) = 2
    assert quantile([3.0, 1.0, 2.0], 0.1) == 1.0  # rank ceil(0.3) = 1
    assert quantile([3.0, 1.0, 2.0], 0.0) == 1.0  # rank 0 is read as the first


def test_stats_report_each_counter_and_the_rate_to_three_places() -> None:
    now = [0.0]
    ep = Endpoint("u", 8, adaptive=False, clock=lambda: now[0])
    assert ep.stats()["decode_tokens_per_s"] is None  # nothing answered yet
    t = ep.start()
    now[0] = 3.0
    ep.finish(t, "ok", 10)  # 10 tokens in 3 s
    for outcome in ("timeout", "timeout", "busy", "busy", "busy", "down", "other"):
        ep.finish(ep.start(), outcome)  # type: ignore[arg-type]
    assert ep.stats() == {"requests": 8, "completion_tokens": 10, "limit": 8,
                          "peak_limit": 8, "decode_tokens_per_s": 3.333, "timeouts": 2,
                          "busy": 3, "refused": 1}
    assert ep.down_until == 8.0  # refused at 3 s: no new request for 5 s


def test_a_finished_request_without_usage_counts_no_tokens() -> None:
    ep = Endpoint("u", 8, adaptive=False, clock=lambda: 0.0)
    ep.finish(ep.start(), "ok")
    assert (ep.completion_tokens, list(ep.recent)) == (0, [(0.0, 0)])
    pacing = Pacing(("u",), 8, adaptive=False, clock=lambda: 0.0)
    e = pacing.endpoints[0]

    async def go() -> None:
        await pacing.release(e, e.start(), "ok")
    asyncio.run(go())
    assert e.completion_tokens == 0


def test_the_decode_rate_counts_every_answer_with_usage_and_needs_time() -> None:
    ep = Endpoint("u", 8, adaptive=False, clock=lambda: 0.0)
    ep.recent.append((2.0, 1))  # one token in 2 s
    assert ep.decode_rate() == 0.5
    ep.recent.clear()
    ep.recent.append((0.5, 2))
    assert ep.decode_rate() == 4.0  # under a second is still measured
    ep.recent.clear()
    ep.recent.append((0.0, 5))  # answered within the clock's resolution: no rate to tell
    assert ep.decode_rate() is None


def test_the_estimates_look_at_the_last_64_answers_only() -> None:
    now = [0.0]
    ep = Endpoint("u", 8, adaptive=False, clock=lambda: now[0])
    for tokens in [100] * 10 + [10] * 64:  # old answers at 100 tokens/s, the latest at 10
        t = ep.start()
        now[0] += 1.0
        ep.finish(t, "ok", tokens)
    assert ep.decode_rate() == 10.0


def test_the_gate_sample_is_the_last_twice_the_limit_answers_when_that_is_more_than_16() -> None:
    ep = Endpoint("u", 12, adaptive=False, clock=lambda: 0.0)
    ep.recent.extend((float(s), 1) for s in range(1, 41))
    assert ep.gate_sample() == [float(s) for s in range(17, 41)]  # the last 24
    ep.recent.clear()
    ep.recent.extend((float(s), 1) for s in range(1, 25))  # 24 answers: 1 … 24 s
    # the 95th percentile of 24 by nearest rank is rank ceil(22.8) = 23: 23 s, x 2
    assert ep.overdue_after() == 46.0


def test_an_outcome_with_no_signal_leaves_the_limit_alone() -> None:
    ep = Endpoint("u", 8, clock=lambda: 0.0)
    ep.finish(ep.start(), "other")  # a 500
    assert (ep.limit, ep.epoch, ep.slow_start) == (4, 0, True)  # still climbing


def test_each_cut_starts_two_epochs_on() -> None:
    """The limit's change is one epoch, the cut another (answers sent before it are ignored
    even where the limit cannot go lower)."""
    ep = Endpoint("u", 8, clock=lambda: 0.0)
    ep.finish(ep.start(), "busy")
    assert (ep.limit, ep.epoch) == (3, 2)
    ep.finish(ep.start(), "busy")
    assert (ep.limit, ep.epoch) == (2, 4)


def answered(ep: Endpoint, now: list[float], n: int, latency: float) -> None:
    """`n` answers one after the other, `latency` s each (one in flight: no window counts)."""
    for _ in range(n):
        t = ep.start()
        now[0] += latency
        ep.finish(t, "ok", 10)


def test_overdue_means_longer_than_twice_the_95th_percentile_once_8_are_known() -> None:
    now = [0.0]
    ep = Endpoint("u", 8, clock=lambda: now[0])
    answered(ep, now, 7, 1.0)
    stuck, start = ep.start(), now[0]
    now[0] = start + 100.0
    ep.check()
    assert ep.limit == 4  # 7 answers: too few to know what overdue is
    ep.finish(stuck, "ok", 10)
    assert (ep.limit, len(ep.recent)) == (4, 8)
    now[0] += 1.0
    late = ep.start()
    start = now[0]
    # 8 answers now (1 s each, and one of 100 s): the 95th percentile is 100 s, so overdue
    # after 200 s
    assert ep.overdue_after() == 200.0
    now[0] = start + 200.0
    ep.check()
    assert ep.limit == 4  # exactly twice: not yet
    now[0] = start + 200.5
    ep.check()
    assert ep.limit == 3
    assert ep.stats()["requests"] == 9 and late.epoch == 0


def test_a_fixed_endpoint_is_never_cut_for_an_overdue_request() -> None:
    now = [0.0]
    ep = Endpoint("u", 4, adaptive=False, clock=lambda: now[0])
    answered(ep, now, 8, 1.0)
    ep.start()
    now[0] += 10.0
    ep.check()
    assert ep.limit == 4


def test_the_wait_between_overdue_checks_is_a_quarter_of_the_soonest_overdue_time() -> None:
    now = [0.0]
    pacing = Pacing(("a", "b"), 4, clock=lambda: now[0])
    assert pacing._tick() == 1.0  # nothing known: once a second
    answered(pacing.endpoints[0], now, 8, 1.0)  # overdue after 2 s
    assert pacing._tick() == 0.5
    fast = Pacing(("a",), 4, clock=lambda: now[0])
    answered(fast.endpoints[0], now, 8, 0.01)  # overdue after 0.02 s
    assert fast._tick() == 0.05  # but never more often than 20 times a second


def test_the_endpoint_with_the_most_free_room_is_picked() -> None:
    pacing = Pacing(("a", "b"), 4, adaptive=False, clock=lambda: 0.0)
    a, b = pacing.endpoints
    a.start()
    assert pacing.pick() is b  # 4 free against 3
    with pytest.raises(Deferred) as e:
        pacing.pick(lambda ep: False)
    assert str(e.value) == "no endpoint can answer before the deadline"


def test_a_refused_endpoint_rests_five_seconds_while_another_can_take_the_request() -> None:
    now = [0.5]
    pacing = Pacing(("a", "b"), 4, adaptive=False, clock=lambda: now[0])
    a, b = pacing.endpoints
    a.finish(a.start(), "down")  # down until 5.5
    b.start()
    assert pacing.pick() is b  # 3 free on b; a has 4 but rests
    now[0] = 5.5
    assert pacing.pick() is a  # its rest is over at 5.5 exactly


def test_an_estimate_that_ends_exactly_at_the_deadline_is_sent() -> None:
    pacing = Pacing(("a",), 4, clock=lambda: 0.0)

    async def go() -> str:
        ep, _ = await pacing.acquire(100.0, 256, 60.0, wall=lambda: 100.0)
        return ep.url
    assert asyncio.run(go()) == "a"  # nothing measured: the estimate is 0 s


def test_a_deferral_names_each_endpoints_estimate_and_closes_the_gate() -> None:
    now = [0.0]
    pacing = Pacing(("http://a", "http://b"), 4, adaptive=False, clock=lambda: now[0])
    a, b = pacing.endpoints
    t = a.start()
    now[0] = 3.0
    a.finish(t, "ok", 30)  # 3 s, 10 tokens/s
    t = b.start()
    now[0] = 7.0
    b.finish(t, "ok", 0)  # 4 s, no usage

    async def go() -> str:
        with pytest.raises(Deferred) as first:
            await pacing.acquire(100.0, 100, 60.0, wall=lambda: 98.0)
        with pytest.raises(Deferred) as again:
            await pacing.acquire(None, 100, 60.0)
        assert str(again.value) == ("the deadline gate is closed: this run sends no more "
                                    "requests")
        return str(first.value)
    assert asyncio.run(go()) == (
        "the deadline leaves 2.0 s, less than a request takes — http://a: ~3.0 s (90% of its "
        "last 1 requests); http://b: ~4.0 s (90% of its last 1 requests) — the document "
        "waits for the next run")
    # the shortest estimate, as the client's backoff check reads it (a's timeout is sized from
    # its measured rate: 3 x 100 / 10 = 30 s, over its 3 s)
    assert pacing.min_estimate(100, 60.0) == 3.0
