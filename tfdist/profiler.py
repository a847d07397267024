"""A TensorFlow profiler trace of chosen training steps in every task (TFDIST_PROFILE).

With TFDIST_PROFILE=START:END (`tfdist launch --profile START:END`), `make_strategy` adds a
callback to every fit of the process (`install`: through Keras' `CallbackList`, of Keras 3 or
tf_keras): it starts `tf.profiler.experimental` before the call of the train function that runs
optimizer step START, and stops it after the call that ran step END - 1, into
TFDIST_PROFILE_DIR/<task> (`worker-0`, ...), where TensorBoard's profile plugin finds it
(`plugins/profile/<run>/<host>.xplane.pb`). A call runs `steps_per_execution` steps (tfdist
chooses more than one where nothing reads every step), so the trace covers whole calls: it
writes `steps.json` there too, the first and last step it covers. One trace a process; without
TFDIST_PROFILE nothing is added. Under parameter_server the chief's trace shows the coordinator,
which schedules the steps; the workers run them.

Imports the settings and the Keras in use; TensorFlow when a trace starts.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from tfdist import flavour, settings

__all__ = ["install", "trace_dir"]

_INSTALLED = []


def trace_dir() -> str:
    """This task's trace directory: TFDIST_PROFILE_DIR (default `tfdist-profile`)/<task>."""
    task = (settings.TASK.get() or "task").replace(":", "-")
    return os.path.join(settings.PROFILE_DIR.get() or "tfdist-profile", task)


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


def _callback_class():
    keras = flavour.keras()

    class ProfileSteps(keras.callbacks.Callback):
        """Traces optimizer steps `start` to `end` - 1 of the fit it is in; appends to `done`
        once it stopped (the process traces once)."""

        def __init__(self, start: int, end: int, done: list):
            super().__init__()
            self.start, self.end, self.done = start, end, done
            self.first: Optional[int] = None
            self.last: Optional[int] = None

        def _step(self) -> Optional[int]:
            iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
            return None if iterations is None else int(iterations.numpy())

        def on_train_batch_begin(self, batch, logs=None):
            if self.first is not None or self.done:
                return
            step = self._step()
            if step is not None and step < self.end and step + _per_call(self.model) > self.start:
                import tensorflow as tf

                os.makedirs(trace_dir(), exist_ok=True)
                tf.profiler.experimental.start(trace_dir())
                self.first = step

        def on_train_batch_end(self, batch, logs=None):
            if self.first is not None and self.last is None:
                step = self._step()
                if step is not None and step >= self.end:
                    self._stop(step - 1)

        def on_train_end(self, logs=None):
            if self.first is not None and self.last is None:
                step = self._step()
                self._stop(step - 1 if step is not None else self.first)

        def _stop(self, last: int) -> None:
            import tensorflow as tf

            tf.profiler.experimental.stop()
            self.last = last
            self.done.append(last)
            with open(os.path.join(trace_dir(), "steps.json"), "w") as f:
                json.dump({"first": self.first, "last": last}, f)

    return ProfileSteps


def install() -> bool:
    """Adds the trace's callback to every fit of this process when TFDIST_PROFILE is set;
    returns True once installed."""
    steps = settings.PROFILE.get()
    if steps is None:
        return False
    if _INSTALLED:
        return True
    profile_steps = _callback_class()
    callback_list = flavour.keras().callbacks.CallbackList
    original = callback_list.__init__
    done = []  # one trace a process: the first fit that reaches the steps

    def __init__(self, callbacks=None, *args, **kwargs):
        callbacks = list(callbacks or [])
        if not done and not any(isinstance(c, profile_steps) for c in callbacks):
            callbacks.append(profile_steps(*steps, done))
        original(self, callbacks, *args, **kwargs)

    callback_list.__init__ = __init__
    _INSTALLED.append(True)
    return True
