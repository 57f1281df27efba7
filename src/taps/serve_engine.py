"""The engine of `taps serve`: a FIFO queue of requests served by one worker thread, and the
server's Prometheus metrics.

One decode runs at a time (the speculator's cache holds one sequence). The worker thread
decodes; the event loop never does, so it stays free to accept, validate, stream and refuse.
Invariants:
  - a request's output depends only on the request: it carries its own seed and the
    speculator starts each decode afresh, so queueing order never changes an answer;
  - at most `max_queue` requests wait besides the running one; one more is refused (429);
  - a cancelled job (its client left, or the server is stopping) has its stream closed by
    the worker after the next piece, which ends decoding at the next round;
  - `shutdown` answers every queued job 503 at once, cancels the running one with 503, and
    the worker thread then ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, Summary

from taps.serve_schema import APIError

log = logging.getLogger("taps.serve")
SHUTTING_DOWN = "the server is shutting down; retry on another instance or after it restarts"


class Metrics:
    """Prometheus metrics of one server, in their own registry (several apps may share a process)."""

    def __init__(self, model: str, method: str):
        self.registry = r = CollectorRegistry()
        info = Info("taps_server", "the served model and speculation method", registry=r)
        info.info({"model": model, "method": method})
        self.requests = Counter("taps_requests", "HTTP requests answered", ["path", "status"], registry=r)
        self.queue_depth = Gauge("taps_queue_depth", "requests waiting for the engine", registry=r)
        self.running = Gauge("taps_requests_running", "requests being decoded (0 or 1)", registry=r)
        self.prompt_tokens = Counter("taps_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter("taps_completion_tokens", "tokens answered to finished requests", registry=r)
        self.rounds = Counter("taps_decode_rounds", "draft-verify rounds of finished requests", registry=r)
        self.committed = Counter("taps_decode_committed_tokens", "tokens committed by those rounds "
                                 "(tau over any window = its increase / the rounds' increase)", registry=r)
        self.mean_tau = Gauge("taps_mean_tau", "tokens committed per round since the server started", registry=r)
        self.tau = Summary("taps_request_tau", "tau of each finished request", registry=r)
        self.speed = Summary("taps_request_tokens_per_second", "decode speed of each finished request", registry=r)
        self.seconds = Summary("taps_request_decode_seconds", "engine time of each finished request", registry=r)
        self.finished = 0  # requests decoded to the end; the totals below are theirs
        self._committed, self._rounds, self._seconds = 0, 0, 0.0

    def observe(self, result, seconds: float) -> None:
        s = result.stats
        rounds = len(s.accepted_per_round)
        committed = sum(s.accepted_per_round) + rounds  # each round commits its accepted tokens + 1
        self.prompt_tokens.inc(result.prompt_tokens)
        self.completion_tokens.inc(len(result.token_ids))
        self.rounds.inc(rounds)
        self.committed.inc(committed)
        self.finished += 1
        self._committed += committed
        self._rounds += rounds
        self._seconds += seconds
        self.mean_tau.set(self._committed / self._rounds if self._rounds else 0.0)
        self.tau.observe(s.tau)
        self.speed.observe(s.tokens_per_second)
        self.seconds.observe(seconds)

    @property
    def mean_decode_seconds(self) -> float:
        return self._seconds / self.finished if self.finished else 1.0


class Job:
    """One request on its way through the engine. The worker thread posts events onto the
    request's event loop: ("piece", str), ("done", GenerationResult) or ("error", APIError)."""

    def __init__(self, prompt, kwargs: dict, loop: asyncio.AbstractEventLoop):
        self.prompt, self.kwargs, self.loop = prompt, kwargs, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.reason: APIError | None = None  # why the server cancelled it; None: the client left

    def post(self, event: tuple) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def cancel(self, reason: APIError | None = None) -> None:
        self.reason = self.reason or reason
        self.cancelled.set()


class Engine:
    """The FIFO queue and its single worker thread around the speculator."""

    def __init__(self, spec, max_queue: int, metrics: Metrics):
        self.spec, self.max_queue, self.metrics = spec, max_queue, metrics
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self.stopping = False
        self._thread = threading.Thread(target=self._work, name="taps-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self.stopping:
                raise APIError(503, SHUTTING_DOWN, code="shutting_down")
            if len(self._jobs) >= self.max_queue:
                raise APIError(429, f"the queue is full ({self.max_queue} requests waiting); retry later",
                               code="queue_full", headers={"Retry-After": str(self.retry_after())})
            self._jobs.append(job)
            self.metrics.queue_depth.set(len(self._jobs))
            self._cond.notify()

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the queue ahead of it at the mean decode time."""
        return max(1, math.ceil(self.metrics.mean_decode_seconds * (len(self._jobs) + 1)))

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def shutdown(self) -> None:
        """Refuse new jobs, answer the queued ones 503, cancel the running one; the worker ends."""
        with self._cond:
            self.stopping = True
            queued, self._jobs = list(self._jobs), deque()
            if self._running is not None:
                self._running.cancel(APIError(503, SHUTTING_DOWN, code="shutting_down"))
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for job in queued:
            job.post(("error", APIError(503, SHUTTING_DOWN, code="shutting_down")))

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self.stopping:
                    self._cond.wait()
                if self.stopping:
                    return
                job = self._running = self._jobs.popleft()
                self.metrics.queue_depth.set(len(self._jobs))
            self.metrics.running.set(1)
            try:
                if job.cancelled.is_set() or not self._decode(job):
                    if job.reason is not None:  # cancelled by the server: say so; a client that left hears nothing
                        job.post(("error", job.reason))
            finally:
                with self._cond:
                    self._running = None
                self.metrics.running.set(0)

    def _decode(self, job: Job) -> bool:
        """Run the job's decode, posting its pieces; True when it was answered (done or error),
        False when it was cancelled on the way."""
        start = time.perf_counter()
        pieces = self.spec.stream(job.prompt, **job.kwargs)
        try:
            for piece in pieces:
                job.post(("piece", piece))
                if job.cancelled.is_set():
                    break
            else:
                result = self.spec.last_result
                self.metrics.observe(result, time.perf_counter() - start)
                job.post(("done", result))
                return True
        except ValueError as error:  # the API's own check of an argument: the request's fault
            job.post(("error", APIError(400, str(error), code="invalid_value")))
            return True
        except Exception:  # a bug must not take the server down: log it, answer 500, serve the next
            log.exception("decoding failed")
            job.post(("error", APIError(500, "decoding failed; see the server log", code="internal_error")))
            return True
        finally:
            pieces.close()  # ends decoding at the next round when the loop stopped early
        return False
