"""A distributed dataset's iterator released off the caller's thread.

Dropping the iterator of `strategy.experimental_distribute_dataset` (as `fit` does at the end of
every call, and at every epoch where it makes a new one) waits, in the thread that drops it,
for TensorFlow to stop its per-device prefetching: nothing to compute, often 0.1-0.5 s. Here the
iterator's per-worker parts go to one thread of the process that drops them, so the caller's
next step starts at once. Nothing else changes: the same resources are freed, moments later.

Nothing here imports TensorFlow at import time.
"""

import atexit
import os
import queue
import threading
import time

from tfdist.fixes.record import Fix, Target

# A backlog this long is dropped by the caller itself, so that no more iterators wait in memory
# than a few fits or epochs made.
MAX_PENDING = 8
# At the interpreter's exit, the longest wait for the iterators still waiting to be dropped
# (after it, the interpreter drops them as it would have).
EXIT_WAIT_SECONDS = 10.0
THREAD_NAME = "tfdist-iterator-release"

ITERATORS_RELEASED = Fix(
    name="distributed_iterators_released_in_background",
    summary=(
        "Dropping the iterator of a distributed dataset blocks its thread until TensorFlow "
        "stops the iterator's per-device prefetching (often 0.1-0.5 s with nothing to "
        "compute), and fit drops one at the end of every call and every epoch that makes a "
        "new one."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "each fit call (and each epoch that makes a new iterator) ends 0.1-0.5 s later under "
        "mirrored: fit of 240 steps of a small model at about 0.4x a hand-written loop "
        "(benchmarks/bench_fit_step.py); results are the same."
    ),
    library="tensorflow",
)


class _Releaser:
    """One daemon thread per process that drops what it is handed, in order."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue = None
        self._pid = None

    def release(self, parts) -> None:
        """Drops `parts` in the releaser's thread; in the caller's when the backlog is full."""
        pending = self._started()
        if pending.qsize() >= MAX_PENDING:
            return  # `parts` is dropped here, when the caller's frame lets it go
        pending.put(parts)

    def _started(self) -> queue.Queue:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child (which has no thread)
                self._queue, self._pid = queue.Queue(), os.getpid()
                threading.Thread(
                    target=self._run, args=(self._queue,), name=THREAD_NAME, daemon=True
                ).start()
            return self._queue

    @staticmethod
    def _run(pending: queue.Queue) -> None:
        while True:
            parts = pending.get()
            del parts  # the wait happens here, in this thread
            pending.task_done()

    def drain(self, seconds: float = EXIT_WAIT_SECONDS) -> bool:
        """Waits up to `seconds` for every handed iterator to be dropped; whether they were."""
        pending = self._queue if self._pid == os.getpid() else None
        deadline = time.monotonic() + seconds
        while pending is not None and pending.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True


RELEASER = _Releaser()
atexit.register(RELEASER.drain)


@ITERATORS_RELEASED.variant(
    "2.16",
    targets=[
        Target(
            "tensorflow.python.distribute.input_lib:DistributedIterator.__init__",
            ("self", "input_workers", "iterators", "strategy", "components", "element_spec"),
        ),
        Target(
            "tensorflow.python.distribute.input_lib:DistributedIteratorBase.__init__",
            ("self", "input_workers", "iterators"),
        ),
    ],
)
def _fix_iterators_released():
    # tensorflow/python/distribute/input_lib.py: a DistributedIterator keeps its per-worker
    # iterators (_SingleWorkerOwnedDatasetIterator, each owning a MultiDeviceIterator and one
    # prefetching iterator per device) in `_iterators`, set by both __init__ paths. Destroying
    # them cancels and joins the per-device prefetching, in whichever thread drops the last
    # reference. The DistributedIterator gets a __del__ that hands `_iterators` to RELEASER;
    # the iterator itself, its spec and its strategy are freed as before. (Inside a traced
    # function, a DistributedIterator rebuilt from its components holds symbolic parts: handed
    # over too, harmlessly.)
    from tensorflow.python.distribute import input_lib

    cls = input_lib.DistributedIterator
    if getattr(cls, "_tfdist_released_in_background", False):
        return
    previous = cls.__dict__.get("__del__")

    def __del__(self):
        parts = self.__dict__.pop("_iterators", None)
        if parts:
            RELEASER.release(parts)
        if previous is not None:
            previous(self)

    cls.__del__ = __del__
    cls._tfdist_released_in_background = True


FIXES = (ITERATORS_RELEASED,)
