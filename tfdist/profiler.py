"""A TensorFlow profiler trace of chosen training steps in every task (TFDIST_PROFILE).

With TFDIST_PROFILE=START:END (`tfdist launch --profile START:END`), `make_strategy` adds a
callback to every fit of the process (`install`: through Keras' `CallbackList`, of Keras 3 or
tf_keras): it starts `tf.profiler.experimental` before the call of the train function that runs
optimizer step START, and stops it after the call that ran step END - 1, into
TFDIST_PROFILE_DIR/<task> (`worker-0`, ...), where TensorBoard's profile plugin finds it
(`plugins/profile/<run>/<host>.xplane.pb`). A call runs `steps_per_execution` steps (tfdist
chooses more than one where nothing reads every step; its parameter-server loop runs groups of
steps, whose size shows after the first), so the trace covers whole calls: it writes
`steps.json` there too, the first and last step it covers. One trace a process; without
TFDIST_PROFILE nothing is added.

Under parameter_server the chief's trace shows the coordinator, which schedules the steps; the
workers run them, and the ps tasks hold the variables. Under the launcher those tasks trace too:
each runs TensorFlow's server (`tfdist serve`) and follows the chief (`follow_the_chief`): the
chief writes a start file beside the tasks' reports before the steps and waits (at most
`ANSWER_SECONDS`) until every server started its trace, and a stop file after them, waiting
until every server wrote its trace, with the same `steps.json`. tf_keras refuses batch-level
callbacks under parameter_server: there the trace covers whole epochs.

Imports the settings and the Keras in use; TensorFlow when a trace starts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import List, Optional

from tfdist import flavour, settings

__all__ = ["follow_the_chief", "install", "trace_dir"]

_INSTALLED = []
ANSWER_SECONDS = 30.0  # the chief's wait for the servers to start, or write, their traces
_POLL_SECONDS = 0.1  # a server's look for the chief's start and stop files
_START, _STOP = "profile.start", "profile.stop"  # beside the tasks' reports


def trace_dir() -> str:
    """This task's trace directory: TFDIST_PROFILE_DIR (default `tfdist-profile`)/<task>."""
    task = (settings.TASK.get() or "task").replace(":", "-")
    return os.path.join(settings.PROFILE_DIR.get() or "tfdist-profile", task)


def _meeting() -> Optional[str]:
    """The directory of the tasks' reports (the launcher's), where the chief and the servers of
    a parameter-server job meet; None without the launcher."""
    report = settings.REPORT_FILE.get()
    return os.path.dirname(report) if report else None


def _servers() -> List[str]:
    """The tasks that only serve in this process's parameter-server job ("worker-0", ...), when
    this is its chief under the launcher; else none."""
    from tfdist import task

    current = task.current()
    if current.strategy != "parameter_server" or not current.is_chief or not _meeting():
        return []
    return [f"{job}-{index}" for job, index in current.cluster.tasks if job in ("worker", "ps")]


def _tell_servers(name: str, content: dict, servers: List[str]) -> None:
    """Writes the file `name` for the servers, then waits until each answered (its own
    `name.<task>` file), at most ANSWER_SECONDS; a server that does not answer costs its
    trace, not the training."""
    meeting = _meeting()
    with open(os.path.join(meeting, name + ".tmp"), "w") as f:
        json.dump(content, f)
    os.replace(os.path.join(meeting, name + ".tmp"), os.path.join(meeting, name))
    deadline = time.monotonic() + ANSWER_SECONDS
    waiting = list(servers)
    while waiting and time.monotonic() < deadline:
        waiting = [s for s in waiting if not os.path.exists(os.path.join(meeting, f"{name}.{s}"))]
        if waiting:
            time.sleep(_POLL_SECONDS)


def _start_trace() -> None:
    import tensorflow as tf

    os.makedirs(trace_dir(), exist_ok=True)
    tf.profiler.experimental.start(trace_dir())


def _stop_trace(first: int, last: int) -> None:
    import tensorflow as tf

    tf.profiler.experimental.stop()
    with open(os.path.join(trace_dir(), "steps.json"), "w") as f:
        json.dump({"first": first, "last": last}, f)


def follow_the_chief() -> bool:
    """In a task that only serves (a worker or ps of a parameter-server job, `tfdist serve`)
    under the launcher with TFDIST_PROFILE: a thread that starts this process's trace when the
    chief starts its own and writes it when the chief stops. Returns True when it runs."""
    meeting, task = _meeting(), (settings.TASK.get() or "").replace(":", "-")
    if settings.PROFILE.get() is None or not meeting or not task:
        return False

    def follow():
        started = False
        while True:
            time.sleep(_POLL_SECONDS)
            try:
                if not started and os.path.exists(os.path.join(meeting, _START)):
                    _start_trace()
                    started = True
                    open(os.path.join(meeting, f"{_START}.{task}"), "w").close()
                stop = os.path.join(meeting, _STOP)
                if started and os.path.exists(stop):
                    with open(stop) as f:
                        steps = json.load(f)
                    _stop_trace(steps["first"], steps["last"])
                    open(os.path.join(meeting, f"{_STOP}.{task}"), "w").close()
                    return
            except Exception:  # pylint: disable=broad-except
                return  # a trace that cannot be taken costs the trace, not the server

    threading.Thread(target=follow, name="tfdist-profile", daemon=True).start()
    return True


def _per_call(model) -> int:
    """The steps of one call of the model's train function (Keras 3, then tf_keras)."""
    for value in (
        getattr(model, "steps_per_execution", None),
        getattr(model, "_steps_per_execution", None),
    ):
        if value is None:
            continue
        try:
            return max(1, int(value.numpy() if hasattr(value, "numpy") else value))
        except (TypeError, ValueError):
            continue
    return 1


class _Trace:
    """Traces optimizer steps `start` to `end` - 1 of the fit it is in; appends to `done` once
    it stopped (the process traces once). Mixed into a Keras callback (`_callback_classes`)."""

    def __init__(self, start: int, end: int, done: list):
        super().__init__()
        self.start, self.end, self.done = start, end, done
        self.first: Optional[int] = None
        self.last: Optional[int] = None
        self.servers: List[str] = []  # of a parameter-server job, tracing with the chief
        self.before: Optional[int] = None  # the step before the call in progress
        self.seen = 0  # the most steps one call ran so far (tfdist's parameter-server loop
        # runs groups of steps whose size the model does not show)

    def _step(self) -> Optional[int]:
        iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
        return None if iterations is None else int(iterations.numpy())

    def _begin(self, steps: int) -> None:
        """Before a call (or an epoch) that runs `steps` steps."""
        if self.first is not None or self.done:
            return
        step = self.before = self._step()
        if step is not None and step < self.end and step + max(steps, self.seen) > self.start:
            servers = _servers()
            if servers:
                _tell_servers(_START, {}, servers)
            _start_trace()
            self.first, self.servers = step, servers

    def _end(self) -> None:
        """After a call (or an epoch)."""
        if self.last is not None or (self.first is None and self.done):
            return
        step = self._step()
        if step is not None and self.before is not None:
            self.seen = max(self.seen, step - self.before)
        if self.first is not None and step is not None and step >= self.end:
            self._stop(step - 1)

    def on_train_end(self, logs=None):
        if self.first is not None and self.last is None:
            step = self._step()
            self._stop(step - 1 if step is not None else self.first)

    def _stop(self, last: int) -> None:
        _stop_trace(self.first, last)
        self.last = last
        self.done.append(last)
        if self.servers:
            _tell_servers(_STOP, {"first": self.first, "last": last}, self.servers)


def _callback_classes():
    """(by call of the train function, by epoch): the trace as callbacks of the Keras in use."""
    keras = flavour.keras()

    class ProfileSteps(_Trace, keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self._begin(_per_call(self.model))

        def on_train_batch_end(self, batch, logs=None):
            self._end()

    class ProfileEpochs(_Trace, keras.callbacks.Callback):
        """By whole epochs, for tf_keras under parameter_server, which refuses batch-level
        callbacks there."""

        def on_epoch_begin(self, epoch, logs=None):
            self._begin((self.params or {}).get("steps") or 1)

        def on_epoch_end(self, epoch, logs=None):
            self._end()

    return ProfileSteps, ProfileEpochs


def _choose(by_call, by_epoch):
    from tfdist import task

    if flavour.uses_legacy_keras() and task.current().strategy == "parameter_server":
        return by_epoch
    return by_call


def install() -> bool:
    """Adds the trace's callback to every fit of this process when TFDIST_PROFILE is set;
    returns True once installed."""
    steps = settings.PROFILE.get()
    if steps is None:
        return False
    if _INSTALLED:
        return True
    by_call, by_epoch = _callback_classes()
    callback_list = flavour.keras().callbacks.CallbackList
    original = callback_list.__init__
    done = []  # one trace a process: the first fit that reaches the steps

    def __init__(self, callbacks=None, *args, **kwargs):
        callbacks = list(callbacks or [])
        if not done and not any(isinstance(c, (by_call, by_epoch)) for c in callbacks):
            callbacks.append(_choose(by_call, by_epoch)(*steps, done))
        original(self, callbacks, *args, **kwargs)

    callback_list.__init__ = __init__
    _INSTALLED.append(True)
    return True
