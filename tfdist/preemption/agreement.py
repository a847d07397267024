"""The step after which every worker stops, agreed through TensorFlow's coordination service.

Synchronous workers are at most one step apart: a worker cannot finish step c + 1 before every
other worker has started it (the step's all-reduce needs them all). So the worker that got the
SIGTERM, at the boundary after its step c, claims the preemption (a key only the first claimer
can set), publishes "stop after step c + 1", and waits until every worker has acknowledged it
before it runs step c + 1. No worker can finish step c + 1 before acknowledging, so each one
knows the stop step by the time it gets there (the scheme of TensorFlow's
PreemptionCheckpointHandler, which serves only custom loops). Each worker learns the stop step
from a watcher thread that waits on the key with a short timeout, so the check at every step is
a flag read.

In one process (mirrored, one_device), there is no one to agree with: training stops after the
step that is running when the signal comes.

Steps are counted per `fit`: every worker runs the same fits, so the n-th fit of each process
uses keys of its own. Imports TensorFlow lazily.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

__all__ = ["Agreement"]

log = logging.getLogger("tfdist")

_POLL_MS = 1000  # the watcher's wait on the key, before it checks whether to stop
STOP_DEADLINE = 60.0  # seconds from SIGTERM to the stop, after which the process just ends
_FITS = [0]  # fits that used an agreement in this process


class Agreement:
    """One fit's agreement on where to stop.

    Args:
        worker: int. This worker's index among `num_workers` (the chief is 0).
        num_workers: int. Workers that train in lockstep; 1 for a single process.
        ack_timeout: float. Seconds the claimer waits for every acknowledgement; after that
            it goes on (a worker that never acknowledged is dead or stuck, and the job ends
            anyway), with a warning.
    """

    def __init__(self, worker: int, num_workers: int, ack_timeout: float = 20.0):
        self.worker, self.num_workers, self.ack_timeout = worker, num_workers, ack_timeout
        self.signalled = threading.Event()  # this process got SIGTERM
        self.known = threading.Event()  # the stop step is known
        self.stop_after: Optional[int] = None
        self.claimed_by: Optional[int] = None
        self._closing = threading.Event()
        self._timer: Optional[threading.Timer] = None
        self._watcher: Optional[threading.Thread] = None
        _FITS[0] += 1
        self._prefix = f"tfdist_preemption/{_FITS[0]}"
        if num_workers > 1:
            self._watcher = threading.Thread(
                target=self._watch, name="tfdist-preemption", daemon=True
            )
            self._watcher.start()

    @property
    def multi_worker(self) -> bool:
        return self.num_workers > 1

    def notice(self, signum: int = 15) -> None:
        """The signal came to this process (any thread; idempotent). If training has not
        stopped `STOP_DEADLINE` seconds later (a step waits for a peer that is gone), the
        process ends as SIGTERM would have ended it."""
        if self.signalled.is_set():
            return
        self.signalled.set()
        timer = threading.Timer(STOP_DEADLINE, self._too_late, args=(signum,))
        timer.daemon = True
        timer.start()
        self._timer = timer

    def reached(self) -> None:
        """The stop step is reached: no deadline any more (the save may take its time)."""
        if self._timer is not None:
            self._timer.cancel()

    def _too_late(self, signum: int) -> None:
        if self._closing.is_set():
            return
        from tfdist import signals

        signals.die(
            signum,
            f"tfdist: SIGTERM came {STOP_DEADLINE:g} s ago and training has not reached the "
            "step to stop at (a step waits for a peer that is gone?); exiting without a new "
            "backup. The last backup is kept.",
        )

    def at_boundary(self, steps_done: int) -> bool:
        """Called by every worker after each step; True when it must stop now (after
        `steps_done` steps of this fit)."""
        if self.signalled.is_set() and self.claimed_by is None and not self.known.is_set():
            self._claim(steps_done)
        return (
            self.known.is_set() and self.stop_after is not None and (steps_done >= self.stop_after)
        )

    # ----------------------------------------------------------------------- internals

    def _context(self):
        from tensorflow.python.eager import context

        return context.context()

    def _claim(self, steps_done: int) -> None:
        if not self.multi_worker:
            self.claimed_by, self.stop_after = self.worker, steps_done
            self.known.set()
            return
        import tensorflow as tf

        ctx = self._context()
        try:
            ctx.set_config_key_value(f"{self._prefix}/claim", str(self.worker))
        except tf.errors.AlreadyExistsError:
            self.claimed_by = -1  # another worker claimed first and decides; wait for its key
            return
        self.claimed_by = self.worker
        try:
            ctx.set_config_key_value(f"{self._prefix}/stop_after", str(steps_done + 1))
        except tf.errors.AlreadyExistsError:
            return
        deadline = time.monotonic() + self.ack_timeout
        for peer in range(self.num_workers):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise tf.errors.DeadlineExceededError(None, None, "no time left")
                ctx.get_config_key_value(f"{self._prefix}/ack/{peer}", int(left * 1000) + 1)
            except tf.errors.OpError as err:
                log.warning(
                    "tfdist: worker %d did not acknowledge the preemption within %g s (%s); "
                    "stopping anyway.",
                    peer,
                    self.ack_timeout,
                    type(err).__name__,
                )
                return

    def _watch(self) -> None:
        import tensorflow as tf

        key = f"{self._prefix}/stop_after"
        while not self._closing.is_set():
            try:
                value = self._context().get_config_key_value(key, _POLL_MS)
            except tf.errors.DeadlineExceededError:
                continue
            except Exception:  # pylint: disable=broad-except
                # the service is gone (a peer or the leader exited): nothing left to agree on
                time.sleep(_POLL_MS / 1000)
                continue
            self.stop_after = int(value)
            self.known.set()  # before the acknowledgement: the claimer waits for it
            try:
                self._context().set_config_key_value(f"{self._prefix}/ack/{self.worker}", "1")
            except Exception:  # pylint: disable=broad-except
                pass
            return

    def close(self) -> None:
        """Stops the watcher (the fit ended, or stopped for the preemption)."""
        self._closing.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.join(timeout=2 * _POLL_MS / 1000 + 1)
            self._watcher = None
