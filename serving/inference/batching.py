"""Micro-batching: concurrent requests share one vectorised forward pass of the served model.

One call of the SavedModel has a fixed overhead (graph dispatch, thread hops) on top of the
per-example work, so under load, merging requests raises throughput. One asyncio worker
takes the first waiting request, then collects more until ``max_batch`` examples or
``max_wait`` seconds, whichever comes first; it only waits while other requests are known
to be on their way (being validated and bagged, see :meth:`MicroBatcher.arrival`), so a
lone request never pays the wait. Each batch is one ``ServedModel.forward``
(``serving.inference.served_model``, the SavedModel call of ``model.export.predict``) on the batcher's
model, in a dedicated thread so the event loop keeps accepting, parsing and answering requests
meanwhile; requests that arrive during a forward pass form the next batch.

Only requests that agree on ``num_samples`` and ``seed`` can share a pass (the signature
takes one of each). The export layout keys every example's noise by (seed, example
bytes), so a seeded result is the same whoever shares its pass. Unseeded requests share
one fresh random seed per pass; two byte-identical unseeded requests in the same pass
therefore get the same draw, which is still a valid draw for each.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from serving.inference.served_model import ServedModel
from serving.monitoring.telemetry import ServiceMetrics

logger = logging.getLogger(__name__)

# Seeds for unseeded passes come from here: non-negative int64, as the signature takes.
_SEED_HIGH = 2**63 - 1

class Arrival:
    """A request on its way to submit(): counted by its batcher until it is enqueued or gives up."""

    def __init__(self, batcher: MicroBatcher):
        self._batcher = batcher
        self.open = True

    def close(self) -> None:
        """Stops counting this request as arriving (idempotent)."""
        if self.open:
            self.open = False
            self._batcher._arriving -= 1


class QueueFullError(RuntimeError):
    """Too many requests are waiting for the model; the caller should answer 503."""


class BatcherStoppedError(RuntimeError):
    """The batcher is not running (start-up not finished, or shutting down)."""


@dataclasses.dataclass(eq=False)
class _Job:
    examples: Sequence[bytes]
    num_samples: int
    seed: int | None
    future: asyncio.Future

    def group_key(self) -> tuple[int, int | None]:
        """Jobs with equal keys can share one call of the signature."""
        return (self.num_samples, self.seed)


class MicroBatcher:
    """Merges concurrent submit() calls into forward passes of its model of at most max_batch examples."""

    def __init__(
        self,
        model: ServedModel,
        *,
        max_batch: int,
        max_wait_s: float,
        max_queue: int,
        metrics: ServiceMetrics,
        rng: np.random.Generator | None = None,
    ):
        self.model = model  # every batch is one model.forward(examples, num_samples, seed)
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._max_queue = max_queue
        self._metrics = metrics
        self._rng = rng if rng is not None else np.random.default_rng()
        self._queue: asyncio.Queue[_Job] | None = None
        self._arriving = 0  # requests between arrival and submit(): worth waiting for
        self._carry: _Job | None = None  # taken from the queue but did not fit the last batch
        self._worker: asyncio.Task | None = None
        # One thread: TensorFlow parallelises each pass internally; two passes at once on
        # the same cores would only fight for them.
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._worker is not None and not self._worker.done()

    async def start(self) -> None:
        """Starts the worker task on the running event loop."""
        if self.running:
            return
        self._queue = asyncio.Queue(maxsize=self._max_queue)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ehr-model")
        self._worker = asyncio.create_task(self._run(), name="ehr-micro-batcher")

    async def stop(self) -> None:
        """Stops the worker and fails every waiting request with BatcherStoppedError."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        pending = [self._carry] if self._carry else []
        self._carry = None
        while self._queue is not None and not self._queue.empty():
            pending.append(self._queue.get_nowait())
        for job in pending:
            if not job.future.done():
                job.future.set_exception(BatcherStoppedError("the service is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    async def run_in_model_thread(self, fn: Callable, *args):
        """Runs fn(*args) on the model's thread (e.g. the warm-up pass), awaiting the result."""
        if self._executor is None:
            raise BatcherStoppedError("the batcher is not running")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @contextlib.contextmanager
    def arrival(self) -> Iterator[Arrival]:
        """Marks a request that will probably call submit(arrival=...) soon; the worker may wait for it."""
        self._arriving += 1
        token = Arrival(self)
        try:
            yield token
        finally:
            token.close()  # no-op once submit() enqueued it

    async def submit(self, examples: Sequence[bytes], num_samples: int, seed: int | None = None,
                     arrival: Arrival | None = None) -> np.ndarray:
        """Probabilities [len(examples), num_samples * K] for serialized SequenceExamples, batched with others."""
        if not self.running or self._queue is None:
            raise BatcherStoppedError("the model is not serving yet")
        if not examples:
            raise ValueError("submit() needs at least one example")
        job = _Job(examples, num_samples, seed, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFullError(f"{self._max_queue} requests are already waiting for the model") from None
        if arrival is not None:
            # Same synchronous step as the enqueue: the worker never sees the request in neither place.
            arrival.close()
        self._metrics.queue_depth.set(self._queue.qsize())
        return await job.future

    async def _next_window(self) -> list[_Job]:
        """The next jobs to run: the first waiting one plus whatever arrives within max_wait."""
        assert self._queue is not None
        if self._carry is not None:
            first, self._carry = self._carry, None
        else:
            first = await self._queue.get()
        window, size = [first], len(first.examples)
        deadline = time.monotonic() + self.max_wait_s
        while size < self.max_batch:
            try:
                job = self._queue.get_nowait()  # already waiting: take it without a wait
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._arriving == 0:  # nobody on the way: run what we have
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if size + len(job.examples) > self.max_batch:
                self._carry = job  # would overflow: it opens the next window
                break
            window.append(job)
            size += len(job.examples)
        self._metrics.queue_depth.set(self._queue.qsize())
        return window

    async def _run(self) -> None:
        """Worker loop: forever take a window, group it, run one pass per group."""
        while True:
            window = await self._next_window()
            try:
                groups: dict[tuple, list[_Job]] = {}
                for job in window:
                    if not job.future.done():  # the client may have gone away while waiting
                        groups.setdefault(job.group_key(), []).append(job)
                for jobs in groups.values():
                    await self._run_group(jobs)
            except Exception as err:  # a dead worker would hang every later request: fail these, go on
                logger.error("micro-batcher failed a window of %d requests: %s", len(window), type(err).__name__)
                for job in window:
                    if not job.future.done():
                        job.future.set_exception(err)

    async def _run_group(self, jobs: list[_Job]) -> None:
        """One forward pass for jobs that share num_samples; splits the rows back per job."""
        examples = [e for job in jobs for e in job.examples]
        num_samples = jobs[0].num_samples
        seed = jobs[0].seed if jobs[0].seed is not None else int(self._rng.integers(0, _SEED_HIGH))
        self._metrics.batch_size.observe(len(examples))
        started = time.perf_counter()
        try:
            assert self._executor is not None
            probs = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.model.forward, examples, num_samples, seed)
        except asyncio.CancelledError:
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(BatcherStoppedError("the service is shutting down"))
            raise
        except Exception as err:  # a model failure fails these requests, never the worker
            self._metrics.model_errors.inc()
            logger.error("forward pass of %d examples failed: %s", len(examples), type(err).__name__)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        finally:
            self._metrics.forward_latency.observe(time.perf_counter() - started)
        start = 0
        for job in jobs:
            rows = probs[start:start + len(job.examples)]
            start += len(job.examples)
            if not job.future.done():
                job.future.set_result(rows)
