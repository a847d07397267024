"""Horovod's Keras callbacks, for the Keras in use (Keras 3, or tf_keras):
`BroadcastGlobalVariablesCallback`, `MetricAverageCallback`, `LearningRateScheduleCallback`
and `LearningRateWarmupCallback`.

`callback_classes(keras)` builds them on that Keras' `Callback`; the module
`tfdist.horovod.tensorflow.keras.callbacks` holds the ones of this process's Keras.

BroadcastGlobalVariablesCallback broadcasts the model's variables (and the optimizer's, where
they exist) when training begins, so that the first step already starts from the root's
weights, and again after the first batch, when every optimizer has made its slots (Horovod
broadcasts then only). Imports TensorFlow only inside functions.
"""

from __future__ import annotations

import functools

from tfdist.horovod.collectives import allreduce, broadcast_variables
from tfdist.horovod.runtime import rank, size

__all__ = ["callback_classes"]


def _optimizer_variables(optimizer) -> list:
    variables = getattr(optimizer, "variables", [])
    return list(variables() if callable(variables) else variables)


def _learning_rate(optimizer) -> float:
    import numpy as np
    import tensorflow as tf

    value = getattr(optimizer, "learning_rate", None)
    if value is None or callable(getattr(optimizer, "_learning_rate", None)):
        raise ValueError(
            f"The learning-rate callbacks set the optimizer's learning rate, but "
            f"{type(optimizer).__name__} has a schedule or none. HINT: compile with a float "
            "learning rate (the callbacks make the schedule)."
        )
    return float(np.asarray(tf.convert_to_tensor(value)))


@functools.lru_cache(maxsize=None)
def callback_classes(keras) -> dict:
    """The four callbacks, on `keras.callbacks.Callback`, by name."""
    schedule = _learning_rate_schedule_callback(keras)
    return {
        cls.__name__: cls
        for cls in (
            _broadcast_callback(keras),
            _metric_average_callback(keras),
            schedule,
            _learning_rate_warmup_callback(schedule),
        )
    }


def _broadcast_callback(keras):
    """`BroadcastGlobalVariablesCallback` on `keras.callbacks.Callback`."""

    class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
        """Makes every process start from the weights of `root_rank`, except
        `local_variables` (variables each process keeps its own of)."""

        def __init__(self, root_rank: int = 0, device: str = "", local_variables=None):
            super().__init__()
            self.root_rank = root_rank
            self.local_variables = list(local_variables or ())
            self.broadcast_done = False

        def _broadcast(self):
            local = {id(variable) for variable in self.local_variables}
            variables = [v for v in self.model.variables if id(v) not in local]
            broadcast_variables(variables, root_rank=self.root_rank)
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None:
                variables = _optimizer_variables(optimizer)
                if variables:
                    broadcast_variables(variables, root_rank=self.root_rank)

        def on_train_begin(self, logs=None):
            if self.model.variables:
                self._broadcast()

        def on_train_batch_end(self, batch, logs=None):
            if not self.broadcast_done:
                self._broadcast()
                self.broadcast_done = True

    return BroadcastGlobalVariablesCallback


def _metric_average_callback(keras):
    """`MetricAverageCallback` on `keras.callbacks.Callback`."""
    import numpy as np
    import tensorflow as tf

    class MetricAverageCallback(keras.callbacks.Callback):
        """Averages the epoch's logs (metrics, loss) over the processes, in place: put it
        before the callbacks that read them (checkpoints, early stopping)."""

        def __init__(self, device: str = ""):
            super().__init__()

        def on_epoch_end(self, epoch, logs=None):
            if not logs or size() == 1:
                return
            names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and _is_number(v))
            values = tf.constant([float(logs[name]) for name in names], tf.float64)
            averaged = allreduce(values).numpy()
            for name, value in zip(names, averaged):
                logs[name] = float(value)

    return MetricAverageCallback


def _learning_rate_schedule_callback(keras):
    """`LearningRateScheduleCallback` on `keras.callbacks.Callback`."""
    import tensorflow as tf

    class LearningRateScheduleCallback(keras.callbacks.Callback):
        """Sets the learning rate to `initial_lr * multiplier(epoch)` from `start_epoch` to
        before `end_epoch`; a number `multiplier` means `multiplier ** epoch`. `staircase=False`
        adjusts every batch with a fractional epoch."""

        def __init__(
            self,
            initial_lr,
            multiplier,
            start_epoch: int = 0,
            end_epoch=None,
            staircase: bool = True,
            momentum_correction: bool = True,
            steps_per_epoch=None,
        ):
            super().__init__()
            if initial_lr is None:
                raise ValueError(
                    "initial_lr is required. HINT: the learning rate of the compiled optimizer, "
                    "e.g. LearningRateScheduleCallback(initial_lr=0.1 * hvd.size(), ...)."
                )
            self.initial_lr = float(initial_lr)
            self.multiplier = multiplier if callable(multiplier) else (lambda e: multiplier**e)
            self.start_epoch = start_epoch
            self.end_epoch = end_epoch
            self.staircase = staircase
            self.momentum_correction = momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.current_epoch = 0
            self._restore_momentum = None

        def on_train_begin(self, logs=None):
            _learning_rate(self.model.optimizer)  # a clear error now, not mid-epoch
            if not self.staircase and not self.steps_per_epoch:
                steps = (self.params or {}).get("steps")
                if not steps:
                    raise ValueError(
                        f"{type(self).__name__} could not tell the steps per epoch. HINT: pass "
                        "steps_per_epoch=."
                    )
                self.steps_per_epoch = steps

        def _adjust(self, epoch: float) -> None:
            optimizer = self.model.optimizer
            old = _learning_rate(optimizer)
            new = self.initial_lr * self.multiplier(epoch)
            optimizer.learning_rate = new
            momentum = getattr(optimizer, "momentum", None)
            if self.momentum_correction and isinstance(momentum, tf.Variable) and old:
                self._restore_momentum = float(momentum.numpy())
                momentum.assign(self._restore_momentum * new / old)

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            epoch = _scheduled_epoch(self, self.current_epoch, batch)
            if epoch is not None:
                self._adjust(epoch)

        def on_train_batch_end(self, batch, logs=None):
            if self._restore_momentum is not None:
                self.model.optimizer.momentum.assign(self._restore_momentum)
                self._restore_momentum = None

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _learning_rate(self.model.optimizer)

    return LearningRateScheduleCallback


def _learning_rate_warmup_callback(schedule):
    """`LearningRateWarmupCallback`, a subclass of `schedule` (LearningRateScheduleCallback)."""

    class LearningRateWarmupCallback(schedule):
        """Raises the learning rate from `initial_lr / size` to `initial_lr` over
        `warmup_epochs`, every batch (Goyal et al., 2017)."""

        def __init__(
            self,
            initial_lr,
            warmup_epochs: int = 5,
            momentum_correction: bool = True,
            steps_per_epoch=None,
            verbose: int = 0,
        ):
            def multiplier(epoch):
                epoch += 1.0 / self.steps_per_epoch
                return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

            super().__init__(
                initial_lr,
                multiplier,
                start_epoch=0,
                end_epoch=warmup_epochs,
                staircase=False,
                momentum_correction=momentum_correction,
                steps_per_epoch=steps_per_epoch,
            )
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
                print(
                    f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                    f"{_learning_rate(self.model.optimizer):g}."
                )

    return LearningRateWarmupCallback


def _scheduled_epoch(callback, epoch: int, batch: int):
    """The epoch (fractional without `staircase`) whose learning rate a schedule `callback`
    sets before `batch` of `epoch`, or None: the rate stays (outside the schedule's epochs;
    with `staircase`, after an epoch's first batch)."""
    if epoch < callback.start_epoch or (
        callback.end_epoch is not None and epoch >= callback.end_epoch
    ):
        return None
    if callback.staircase:
        return epoch if batch == 0 else None
    return epoch + float(batch) / callback.steps_per_epoch


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
