"""How hard to push each inference endpoint, and whether a request still fits the deadline.

Per endpoint: a concurrency limit the client finds by itself (between 1 and the block's
`max_concurrent_requests`, a ceiling), the latencies and decode rate it has measured, the
request timeout those imply, and the deadline gate built on them.

Why a limit at all when servers queue: vLLM holds requests beyond its batch/KV-cache capacity
in its own queue (no 429 by default), llama.cpp's server beyond its slots; a queued request
earns nothing but latency, and latency is what times out, what a deadline must cover, and what
keeps work from a second endpoint. OpenAI-style gateways answer 429 with Retry-After instead.

The controller is a hill climb on measured throughput. Each window of completions at a limit
gives that limit's throughput by Little's law (mean concurrency the requests experienced,
divided by seconds per output token). A higher limit is kept only while it pays: its
throughput gain is at least GAIN of its proportional concurrency gain (linear scaling gains
100 %, a server that only queues gains 0 %). It starts by doubling (slow start), then moves one
step at a time, re-measuring its neighbours when their numbers get old, so it follows longer
documents, a slower model or a second tenant. 429/503, timeouts, refused connections and a
request in flight for OVERDUE x the recent latency (vLLM preempting and recomputing when its KV
cache runs out) cut the limit by DECREASE at once, and so does a throughput drop at an
unchanged limit (capacity went away); a cut forgets what was measured and keeps the climb under
the limit it cut from for a while.

Measured with bench/adaptive_concurrency.py (endpoint_sim l4-32b-q3, speed 400): 0.99 of the
best fixed limit at full capacity; through a mid-run halving, 0.97 of the best fixed client
taken through the same halving (0.77 of a fixed client started on the already-halved server:
the thrash of what was in flight at the halving is not recovered).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tasks.shared.errors import Deferred

START_LIMIT = 4          # first limit (or the ceiling, if lower): most servers take 4 at once
GAIN = 0.2               # a limit step must return this share of its concurrency gain
DECREASE = 0.7           # multiplicative cut on 429/503, timeouts, refused connections
SHIFT = 1.5              # throughput at the same limit off by this factor: conditions changed
STALE_WINDOWS = 6        # a level's measurement is re-taken after this many windows
MIN_WINDOW = 8           # completions per window (slow start: 4), at least the limit
OVERDUE = 2.0            # a request in flight this many x the recent 95th-percentile latency:
                         # the server is thrashing (vLLM preempts and recomputes when its KV
                         # cache runs out), cut now rather than after the window
MIN_BUSY = 0.75          # a window counts when mean concurrency reached this share of the limit
RECENT = 64              # answered requests the latency and decode-rate estimates look at
GATE_QUANTILE = 0.9      # the deadline gate's estimate of a request's latency, over the
GATE_RECENT = 16         # last max(GATE_RECENT, 2 x limit) answers: the load of now
TIMEOUT_MARGIN = 3.0     # timeout = margin x max_tokens / measured per-stream decode rate:
                         # at half the measured speed (a busy core, a second tenant) an answer
                         # of max_tokens still ends in 2/3 of it
TIMEOUT_FLOOR_SECONDS = 30.0  # ... but never under this (or the configured one, if lower)
DOWN_SECONDS = 5.0       # a refused endpoint gets no new request for this long (if others can)

Outcome = Literal["ok", "busy", "timeout", "down", "other"]


@dataclass
class Ticket:
    """One dispatched request: when, under which limit epoch, and the in-flight area then."""

    start: float
    area: float
    epoch: int
    clean: bool = True  # sent with no request of a higher, earlier limit still in flight


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (no interpolation: an observed latency)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


class Endpoint:
    """One endpoint's limit, in-flight count and measurements. Plain data with no event-loop
    objects, so it outlives the loop of one batch (process_batch runs one loop a batch)."""

    def __init__(self, url: str, ceiling: int, adaptive: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self.ceiling, self.adaptive, self.clock = url, ceiling, adaptive, clock
        self.limit = min(START_LIMIT, ceiling) if adaptive else ceiling
        self.peak_limit = self.limit
        self.slow_start = adaptive
        self.in_flight = 0
        self.requests = self.completion_tokens = self.timeouts = self.busy = self.refused = 0
        self.recent: deque[tuple[float, int]] = deque(maxlen=RECENT)  # (latency, tokens)
        self.down_until = 0.0
        self.epoch = 0
        self.windows = 0
        self._area, self._t = 0.0, clock()  # integral of in-flight over time
        self._active: dict[int, Ticket] = {}  # in flight, oldest first
        self._settling = False  # a decrease left requests of the higher limit in flight
        self._cut_epoch = 0  # the first epoch after the last cut
        self._window: list[tuple[float, int, float]] = []  # (latency, tokens, concurrency)
        self._levels: dict[int, tuple[float, float, int]] = {}  # limit: (tok/s, conc, window)

    # ---- dispatch and completion ----
    def _advance(self) -> float:
        now = self.clock()
        self._area += self.in_flight * (now - self._t)
        self._t = now
        return now

    def start(self) -> Ticket:
        now = self._advance()
        self.in_flight += 1
        self.requests += 1
        ticket = Ticket(now, self._area, self.epoch)
        if self._settling:  # after a decrease: what the old limit left in flight still weighs
            self._settling = any(t.epoch != self.epoch for t in self._active.values())
            ticket.clean = not self._settling
        self._active[id(ticket)] = ticket
        return ticket

    def finish(self, ticket: Ticket, outcome: Outcome, tokens: int = 0) -> None:
        """Account for a request that ended: `ok` = the server answered 200 (usable or not;
        `tokens` from its usage), `busy` = 429/503, `timeout`, `down` = could not connect or
        the connection broke, `other` = any other error (no signal for the limit)."""
        now = self._advance()
        self.in_flight -= 1
        self._active.pop(id(ticket), None)
        latency = now - ticket.start
        if outcome == "ok":
            self.completion_tokens += tokens
            self.recent.append((latency, tokens))
            if self.adaptive and self._overdue(now):
                self._cut()
            elif self.adaptive and ticket.epoch == self.epoch and ticket.clean and latency > 0:
                conc = (self._area - ticket.area) / latency
                self._window.append((latency, tokens, conc))
                if len(self._window) >= max(4 if self.slow_start else MIN_WINDOW, self.limit):
                    self._decide()
            return
        if outcome == "timeout":
            self.timeouts += 1
        elif outcome == "busy":
            self.busy += 1
        elif outcome == "down":
            self.refused += 1
            self.down_until = now + DOWN_SECONDS
        if outcome != "other" and self.adaptive and ticket.epoch == self.epoch:
            self._cut()  # once per epoch: the other requests of that limit add nothing

    def check(self) -> None:
        """Cut now if a request is overdue: called while requests wait for a slot, because a
        thrashing server may answer nothing for a long time (no completion to look from)."""
        if self.adaptive and self._overdue(self.clock()):
            self._cut()

    def overdue_after(self) -> float | None:
        """Seconds after which the oldest request counts as overdue, if known."""
        if len(self.recent) < MIN_WINDOW:
            return None
        return OVERDUE * quantile(self.gate_sample(), 0.95)

    def _overdue(self, now: float) -> bool:
        """Is the oldest request sent since the last cut in flight for OVERDUE x the
        95th-percentile latency of the latest answers (given enough answers to know it)?"""
        if len(self.recent) < MIN_WINDOW:
            return False
        oldest = next((t for t in self._active.values() if t.epoch >= self._cut_epoch), None)
        return oldest is not None and now - oldest.start > OVERDUE * quantile(
            self.gate_sample(), 0.95)

    # ---- the controller ----
    def _set(self, limit: int) -> None:
        limit = max(1, min(self.ceiling, limit))
        if limit != self.limit:
            # a lower limit is measured only once the higher one's requests have drained (a
            # thrashing server's leftovers would make it look worse than it is)
            self._settling = limit < self.limit
            self.limit, self.epoch = limit, self.epoch + 1
            self.peak_limit = max(self.peak_limit, limit)
        self._window = []

    def _cut(self) -> None:
        """Overload at this limit: back off by DECREASE, forget what was measured (it no longer
        holds), and mark this limit as paying nothing for 2 x STALE_WINDOWS windows, so the
        climb back stops under it until then (a thrashing server costs more than a step)."""
        self.slow_start = False
        self._levels = {self.limit: (0.0, float(self.limit), self.windows + STALE_WINDOWS)}
        # rounded, and at least one step: x0.7 of a small limit is a large cut
        self._set(min(self.limit - 1, round(self.limit * DECREASE)))
        self.epoch += 1  # even at 1: answers of requests sent before the cut are ignored
        self._cut_epoch = self.epoch

    def _fresh(self, level: int) -> bool:
        return level in self._levels and self.windows - self._levels[level][2] <= STALE_WINDOWS

    def _worth(self, hi: int, lo: int) -> bool:
        """Does limit `hi` pay for its extra concurrency over limit `lo`?"""
        (x_hi, c_hi, _), (x_lo, c_lo, _) = self._levels[hi], self._levels[lo]
        if c_hi <= c_lo:
            return x_hi > x_lo
        return x_hi / x_lo - 1 >= GAIN * (c_hi / c_lo - 1)

    def _decide(self) -> None:
        window, self._window = self._window, []
        latency = sum(w[0] for w in window)
        work = sum(max(w[1], 1) for w in window)  # no usage: pace on requests
        conc = sum(w[0] * w[2] for w in window) / latency
        self.windows += 1
        level = self.limit
        if conc < MIN_BUSY * level:
            return  # not enough demand to fill the limit: nothing learnt about it
        x = conc * work / latency
        if self._fresh(level):
            before = self._levels[level][0]
            if x * SHIFT < before:  # capacity went away (second tenant, preemption)
                self._cut()
                return
            if x > before * SHIFT:  # capacity came back: what was measured is wrong now
                self._levels.clear()
        self._levels[level] = (x, conc, self.windows)
        lower = max((k for k in self._levels if k < level and self._fresh(k)), default=None)
        # one step up at a time: a limit marked by a cut stops the climb just under it
        upper = level + 1 if self._fresh(level + 1) else None
        if lower is not None and not self._worth(level, lower):
            if self.slow_start:  # overshot: search the steps between, one at a time
                self.slow_start = False
                self._levels = {k: v for k, v in self._levels.items() if k <= lower}
            self._set(lower)
        elif upper is not None and self._worth(upper, level):
            self._set(upper)
        elif upper is None and level < self.ceiling:
            self._set(2 * level if self.slow_start else level + 1)
        elif lower is None and level > 1:
            self.slow_start = False
            self._set(level - 1)  # re-measure the step below
        else:
            self.slow_start = False

    # ---- estimates ----
    def decode_rate(self) -> float | None:
        """Output tokens per second of one request (wall time, prefill and queueing
        included), over the recent answers that reported usage; None before any."""
        timed = [(lat, tok) for lat, tok in self.recent if tok > 0]
        latency = sum(lat for lat, _ in timed)
        return sum(tok for _, tok in timed) / latency if timed and latency > 0 else None

    def timeout(self, max_tokens: int, configured: float) -> tuple[float, str]:
        """(seconds, why) for the next request: the configured timeout until a decode rate
        is measured, then TIMEOUT_MARGIN x max_tokens / rate, at least the floor."""
        rate = self.decode_rate()
        if rate is None:
            return configured, "request_timeout_seconds"
        floor = min(configured, TIMEOUT_FLOOR_SECONDS)
        sized = TIMEOUT_MARGIN * max_tokens / rate
        why = (f"{TIMEOUT_MARGIN:g} x max_tokens {max_tokens} at the measured {rate:.3g} "
               f"tokens/s per request, at least {floor:g} s")
        return max(floor, sized), why

    def gate_sample(self) -> list[float]:
        """The latencies the gate looks at: the last max(GATE_RECENT, 2 x limit) answers."""
        return [lat for lat, _ in self.recent][-max(GATE_RECENT, 2 * self.limit):]

    def latency_estimate(self, max_tokens: int, configured: float) -> float:
        """What the deadline gate expects a request to take: GATE_QUANTILE of the latest
        latencies, never more than its timeout (it ends by then). 0 before any answer: the
        only way to measure is to send, so an endpoint with nothing measured gets requests
        while any time is left (each ends by its timeout, request_timeout_seconds)."""
        if not self.recent:
            return 0.0
        limit = self.timeout(max_tokens, configured)[0]
        return min(limit, quantile(self.gate_sample(), GATE_QUANTILE))

    def stats(self) -> dict[str, float | int | None]:
        rate = self.decode_rate()
        return {"requests": self.requests, "completion_tokens": self.completion_tokens,
                "limit": self.limit, "peak_limit": self.peak_limit,
                "decode_tokens_per_s": round(rate, 3) if rate else None,
                "timeouts": self.timeouts, "busy": self.busy, "refused": self.refused}


class Pacing:
    """The endpoints of one client and the deadline gate; shared by the client's copies
    (`dataclasses.replace`), so batch 2 starts where batch 1 left off."""

    def __init__(self, urls: tuple[str, ...], ceiling: int, adaptive: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoints = [Endpoint(u, ceiling, adaptive, clock) for u in urls]
        self.clock = clock
        self.closed = False  # the gate closed once: every later request defers at once
        self._cond: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new batch, a new loop: a new condition
            self._cond, self._loop = asyncio.Condition(), loop
        assert self._cond is not None
        return self._cond

    def pick(self, fits: Callable[[Endpoint], bool] = lambda e: True) -> Endpoint | None:
        """The endpoint with the most free room under its own limit among those `fits`
        allows (refused ones only when nothing else fits); None when all are full. Raises
        Deferred when no endpoint fits at all."""
        now = self.clock()
        fitting = [e for e in self.endpoints if fits(e)]
        if not fitting:
            raise Deferred("no endpoint can answer before the deadline")
        up = [e for e in fitting if e.down_until <= now] or fitting
        free = [e for e in up if e.in_flight < e.limit]
        if not free:
            return None
        return max(free, key=lambda e: (e.limit - e.in_flight, e.limit))

    async def acquire(self, deadline: float | None, max_tokens: int,
                      configured_timeout: float, wall: Callable[[], float] = time.time
                      ) -> tuple[Endpoint, Ticket]:
        """Wait for a slot; Deferred when `deadline` (epoch seconds) cannot cover the
        request's estimated latency on any endpoint (checked again after every wait)."""
        cond = self._condition()
        async with cond:
            while True:
                if self.closed:
                    raise Deferred("the deadline gate is closed: this run sends no more requests")

                def fits(e: Endpoint) -> bool:
                    if deadline is None:
                        return True
                    return wall() + e.latency_estimate(max_tokens, configured_timeout) <= deadline
                try:
                    ep = self.pick(fits)
                except Deferred:
                    self.closed = True
                    raise Deferred(self._why(deadline, max_tokens, configured_timeout,
                                             wall)) from None
                if ep is not None:
                    return ep, ep.start()
                try:  # wake now and then to look for overdue requests
                    await asyncio.wait_for(cond.wait(), self._tick())
                except TimeoutError:
                    for e in self.endpoints:
                        e.check()

    def _tick(self) -> float:
        known = [t for e in self.endpoints if (t := e.overdue_after()) is not None]
        return max(0.05, min(known) / 4) if known else 1.0

    async def release(self, ep: Endpoint, ticket: Ticket, outcome: Outcome,
                      tokens: int = 0) -> None:
        ep.finish(ticket, outcome, tokens)
        cond = self._condition()
        async with cond:
            cond.notify_all()

    def min_estimate(self, max_tokens: int, configured_timeout: float) -> float:
        return min(e.latency_estimate(max_tokens, configured_timeout) for e in self.endpoints)

    def _why(self, deadline: float | None, max_tokens: int, configured: float,
             wall: Callable[[], float]) -> str:
        left = (deadline or 0) - wall()
        parts = [f"{e.url}: ~{e.latency_estimate(max_tokens, configured):.1f} s "
                 + f"({GATE_QUANTILE:.0%} of its last {len(e.gate_sample())} requests)"
                 for e in self.endpoints]
        return (f"the deadline leaves {left:.1f} s, less than a request takes — "
                + "; ".join(parts) + " — the document waits for the next run")

    def stats(self) -> dict[str, dict[str, float | int | None]]:
        return {e.url: e.stats() for e in self.endpoints}
