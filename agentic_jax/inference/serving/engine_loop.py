"""Continuous batching across callers: one thread drives an :class:`Engine` for all of them.

:class:`EngineLoop` owns the engine in one background thread: callers (server request threads,
agent loops) submit requests to its inbox and read their token events from their own queues,
while the thread admits new requests between engine steps.  Requests that arrive while others
are decoding join the running batch.  A caller that stops reading (a client gone, a callback
that raised, a call that timed out) aborts its request, which frees its slot and blocks for the
others.  Given a :class:`~agentic_jax.inference.serving.metrics.ServingMetrics`, the thread
records every engine step in it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Mapping, Sequence

from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import EngineFailure, RequestError
from agentic_jax.inference.serving.engine import Engine, Request, StepOutput
from agentic_jax.inference.serving.metrics import ServingMetrics

log = logging.getLogger(__name__)


class EngineLoop:
    """Drives an :class:`Engine` from one thread for many callers; see the module docstring.

    One request can never stop the loop: a request that is invalid (:class:`RequestError`) or
    whose own work fails is failed alone, with that exception.  If the batched engine step
    fails, or the thread dies, every request in flight fails with :class:`EngineFailure`, the
    engine is reset and the loop goes on; :meth:`health` counts these restarts.
    """

    def __init__(self, engine: Engine, metrics: ServingMetrics | None = None):
        self.engine, self.metrics = engine, metrics
        self.peak_batch = 0  # most requests that produced a token in one step
        self.restarts = 0
        self.failed_requests = 0
        self.last_error: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outboxes: dict[str, queue.SimpleQueue] = {}
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # (re)starting the thread
        self._thread: threading.Thread | None = None

    def start(self) -> EngineLoop:
        with self._lock:
            self._start()
        return self

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)

    def submit(self, prompt: Sequence[int], params: SamplingParams, **options) -> RequestEvents:
        """Queues a request (``options``: the rest of :class:`Request`'s fields, a constraint or
        a way to speculate); iterate the result for its token events (errors are raised), and
        ``close()`` it to abort the request before its last event."""
        self._revive()
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        request = Request(list(prompt), params, f"chat-{next(self._ids)}", **options)
        self._inbox.put((request, outbox))
        return RequestEvents(self, request.request_id, outbox)

    def abort(self, request_id: str) -> None:
        """Stops ``request_id`` between engine steps (a no-op once it has finished)."""
        self._inbox.put((request_id, None))  # after the request's own submission: FIFO

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> dict:
        """The loop's state as a server reports it: running or not, restarts, failures."""
        return {
            "engine_loop": "running" if self.running else "stopped",
            "restarts": self.restarts,
            "failed_requests": self.failed_requests,
            "requests_in_flight": len(self._outboxes),
            "last_error": self.last_error,
        }

    def _revive(self) -> None:
        """Restarts a loop whose thread died (it owned the outboxes; now nobody does)."""
        with self._lock:
            if (
                self._thread is not None
                and not self._thread.is_alive()
                and not self._stopping.is_set()
            ):
                self._recover(EngineFailure("the engine loop's thread died"))
                self._start()

    def _recover(self, error: BaseException) -> None:
        """Fails every request in flight after ``error`` left the engine's state unknown."""
        self.restarts += 1
        self.last_error = f"{type(error).__name__}: {error}"
        log.error(
            "engine loop failed; failing %d requests and resetting the engine: %s",
            len(self._outboxes),
            self.last_error,
            exc_info=error,
        )
        failure = EngineFailure(
            f"the engine failed while serving this request ({self.last_error}); it was reset"
        )
        self._fail(self._outboxes, failure)
        self._outboxes = {}
        self.engine.reset()

    def _fail(self, outboxes: Mapping[str, queue.SimpleQueue], error: BaseException) -> None:
        """Ends the requests of ``outboxes`` with ``error``; ``failed_requests`` counts those
        that failed through no fault of their own."""
        if not isinstance(error, RequestError):
            self.failed_requests += len(outboxes)
        for outbox in outboxes.values():
            outbox.put(error)

    def _admit(self, block: bool) -> None:
        """Takes what is in the inbox: new requests, and aborts (``(request_id, None)``)."""
        try:
            item = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            request, outbox = item
            if outbox is None:
                self.engine.abort_request(request)
                self._outboxes.pop(request, None)
            else:
                try:
                    self._outboxes[self.engine.add_request(request)] = outbox
                except Exception as e:  # a bad request fails alone
                    self._fail({request.request_id: outbox}, e)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._serve()
            except Exception as e:
                self._recover(e)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._admit(block=not self.engine.has_unfinished())
            if not self.engine.has_unfinished():
                continue
            events = self.engine.step()
            if self.metrics is not None:
                self.metrics.record_step(self.engine, events)
            for request_id, error in self.engine.take_failures():
                if not isinstance(error, RequestError):
                    log.error(
                        "request %s failed: %s: %s",
                        request_id,
                        type(error).__name__,
                        error,
                        exc_info=error,
                    )
                outbox = self._outboxes.pop(request_id, None)
                if outbox is not None:  # else aborted meanwhile: nobody is waiting
                    self._fail({request_id: outbox}, error)
            self.peak_batch = max(self.peak_batch, len({e.request_id for e in events}))
            for event in events:
                self._outboxes[event.request_id].put(event)
                if event.finished:
                    del self._outboxes[event.request_id]


class RequestEvents:
    """One request's token events from an :class:`EngineLoop`; ``close()`` before the last
    event aborts the request (after it, or twice, it does nothing)."""

    def __init__(self, loop: EngineLoop, request_id: str, outbox: queue.SimpleQueue):
        self.loop, self.request_id, self._outbox = loop, request_id, outbox
        self._done = False

    def __iter__(self) -> RequestEvents:
        return self

    def __next__(self) -> StepOutput:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._outbox.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.loop.running:
                    self._done = True
                    raise EngineFailure("the engine loop is not running") from None
        if isinstance(item, BaseException):  # the request failed: nothing left to abort
            self._done = True
            raise item
        self._done = item.finished
        return item

    def close(self) -> None:
        if not self._done:
            self._done = True
            self.loop.abort(self.request_id)
