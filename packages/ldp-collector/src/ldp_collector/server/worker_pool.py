"""The load-shedding worker pool every blocking handler job runs in, off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..errors import ErrorReason, OverloadedError
from ..telemetry import CollectorMetrics

__all__ = ["WorkerPool"]

#: Bounds of the RetryInfo delay of a call shed by a full worker pool, and the weight of the
#: newest job in the pool's moving average of the job duration.
_MIN_RETRY_S = 0.05
_MAX_RETRY_S = 5.0
_JOB_TIME_WEIGHT = 0.1

T = TypeVar("T")


class WorkerPool:
    """Runs blocking handler jobs on a thread pool, shedding load beyond ``max_queued`` jobs.

    A shed call's RetryInfo delay is the time the queue ahead of it needs to drain: the queued
    jobs, ``threads`` at a time, at the recent job duration (moving average), clamped to
    [:data:`_MIN_RETRY_S`, :data:`_MAX_RETRY_S`]. A fixed delay would either bring refused clients
    back into a still-full queue or leave the workers idle while every client waits.

    Jobs decode their request with :meth:`decode`, on one decoder thread shared by all of them:
    decoding holds the GIL, so a second decoder would add no throughput, only the memory of another
    half-decoded request (10 to 20 times its bytes for hostile ones) and one more thread for the
    event loop to share the GIL with; and a request decoded on any of the worker threads would
    leave its peak in that thread's malloc arena, so the process would hold the peak once a thread.
    """

    def __init__(self, threads: int, max_queued: int, metrics: CollectorMetrics, max_queued_bytes: int = 0) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ldp-handler")
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ldp-decoder")
        self._threads = threads
        self._max_queued = max_queued
        self._max_bytes = max_queued_bytes
        self._metrics = metrics
        self._lock = threading.Lock()
        self._queued = 0
        self._queued_bytes = 0
        self._job_seconds = 0.05  # moving average of the job duration

    def decode(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the decoder thread (call it from a job: it waits for its turn)."""
        return self._decoder.submit(fn).result()

    def close(self) -> None:
        """Wait for the running and queued jobs, then stop the threads."""
        self.executor.shutdown(wait=True)
        self._decoder.shutdown(wait=True)  # after the jobs, which may still be waiting for it

    def retry_after(self) -> float:
        """Seconds until the current queue has drained (the RetryInfo of a shed call)."""
        rounds = -(-self._queued // self._threads)
        return min(_MAX_RETRY_S, max(_MIN_RETRY_S, rounds * self._job_seconds))

    async def run(self, fn: Callable[[], T], *, shed: bool = True, size: int = 0) -> T:
        """Run ``fn()`` in the pool; ``OverloadedError`` (UNAVAILABLE + RetryInfo) when full.

        ``size`` is the request's byte size, counted against ``max_queued_bytes`` while the job
        waits or runs.
        """
        with self._lock:
            if shed and ((self._max_queued and self._queued >= self._max_queued)
                         or (self._max_bytes and self._queued and self._queued_bytes + size > self._max_bytes)):
                self._metrics.calls_shed.inc()
                raise OverloadedError(f"the collector is busy ({self._queued} calls, {self._queued_bytes} bytes "
                                      "queued); retry later", retry_after=self.retry_after())
            self._queued += 1
            self._queued_bytes += size
        self._metrics.calls_in_flight.inc()

        def done(seconds: float) -> None:
            with self._lock:
                self._queued -= 1
                self._queued_bytes -= size
                self._job_seconds += _JOB_TIME_WEIGHT * (seconds - self._job_seconds)
            self._metrics.calls_in_flight.dec()

        def job() -> T:
            # The count drops when the job ends, not when its caller stops waiting (a cancelled RPC
            # does not stop a commit that is already under way).
            start = time.perf_counter()
            try:
                return fn()
            finally:
                done(time.perf_counter() - start)

        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, job)
        except RuntimeError:  # the pool is shut down: the job will never run
            with self._lock:
                self._queued -= 1
                self._queued_bytes -= size
            self._metrics.calls_in_flight.dec()
            raise OverloadedError("the collector is shutting down", retry_after=1.0,
                                  reason=ErrorReason.SHUTTING_DOWN) from None
        try:
            return await future
        finally:
            # A failed job's error is kept by the future, and its traceback holds this frame: without
            # this, frame -> future -> error -> frame is a cycle that keeps the job (and its request)
            # alive until the garbage collector runs.
            del future
