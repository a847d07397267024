"""The loss a custom `train_step` / `test_step` logs: the one-device value on every strategy.

Since Keras 3.8 (keras-team/keras#20609), `compute_loss` returns the loss divided by the number
of replicas under a strategy, so that the replicas' gradients, summed, make one device's step.
Keras' own train_step and test_step multiply it back before they update the "loss" metric; the
custom step of the Keras guide "Customizing what happens in fit()" passes it to the metric as it
is (`metric.update_state(loss)`), so `fit` logs the loss divided by the number of replicas
(0.276 on 2 replicas where one device logs 0.552), while the weights train as on one device.

Nothing here imports TensorFlow or Keras at import time.
"""

import weakref

from tfdist.fixes.keras_trainer import BASE_TRAINER
from tfdist.fixes.record import Fix, Target

CUSTOM_STEP_LOSS = Fix(
    name="custom_step_logs_the_unscaled_loss",
    summary=(
        "`compute_loss` returns the loss divided by the number of replicas (for the summed "
        "gradients); a custom train_step or test_step that updates the loss metric with it, as "
        "the Keras guide's does, logs that fraction of the loss."
    ),
    upstream="none found (the division came with keras-team/keras#20609)",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "a custom train_step / test_step logs the loss divided by the number of replicas "
        "(the weights still train as on one device; no error)."
    ),
    absent_before="Keras before 3.8 does not divide the loss compute_loss returns",
)

_MEAN = "keras.src.metrics.reduction_metrics:Mean"

# id(the loss compute_loss returned, divided) -> (weak reference to it, the number of replicas)
_SCALED: dict = {}


def _remember(loss, replicas: int) -> None:
    key = id(loss)
    _SCALED[key] = (weakref.ref(loss, lambda _, key=key: _SCALED.pop(key, None)), replicas)


def _replicas_of(values):
    """The number of replicas `values` was divided by, when it is a loss compute_loss returned."""
    entry = _SCALED.get(id(values))
    if entry is not None and entry[0]() is values:
        return entry[1]
    return None


@CUSTOM_STEP_LOSS.variant(
    "3.8",
    targets=[
        BASE_TRAINER.target("compute_loss", ("self", "x", "y", "y_pred", "sample_weight")),
        Target(f"{_MEAN}.update_state", ("self", "values", "sample_weight")),
        Target("keras.src.losses.loss:scale_loss_for_distribution"),
    ],
)
def _fix_custom_step_loss():
    # compute_loss (keras/src/trainers/trainer.py) returns the loss divided by
    # num_replicas_in_sync (keras/src/losses/loss.py scale_loss_for_distribution, where that is
    # more than 1); the TensorFlow trainer's own train_step and test_step update the loss
    # tracker with unscale_loss_for_distribution(loss), a new tensor. The fix remembers the
    # tensor compute_loss returned (weakly, by identity), and a Mean metric updated with that
    # very tensor (the guide's `metric.update_state(loss)`) is updated with the loss multiplied
    # back, as Keras' own step does. The gradient's source is unchanged; one replica, and a
    # value derived from the loss (Keras' own steps): unchanged.
    import tensorflow as tf
    from keras.src.metrics import reduction_metrics

    cls = BASE_TRAINER.get()
    original_compute_loss = cls.compute_loss
    original_update_state = reduction_metrics.Mean.update_state

    def compute_loss(self, *args, **kwargs):
        loss = original_compute_loss(self, *args, **kwargs)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1 and isinstance(loss, (tf.Tensor, tf.Variable)):
            _remember(loss, replicas)
        return loss

    def update_state(self, values, sample_weight=None):
        replicas = _replicas_of(values)
        if replicas is not None:
            values = values * tf.cast(replicas, values.dtype)
        return original_update_state(self, values, sample_weight=sample_weight)

    cls.compute_loss = compute_loss
    reduction_metrics.Mean.update_state = update_state


FIXES = (CUSTOM_STEP_LOSS,)
