"""Learning-rate scaling for a larger global batch: the linear scaling rule with warmup.

    lr = tfdist.scale_learning_rate(0.001, strategy, warmup_steps=500)

With N replicas at the same per-replica batch, the global batch is N times larger; Goyal et
al. (2017) scale the learning rate by N too, ramping up to it over the first steps. Opt-in:
tfdist never changes a learning rate by itself. The schedule is a LearningRateSchedule of the
Keras in use (Keras 3 or tf_keras), registered for serialization under the package "tfdist".

TensorFlow and Keras are imported inside the functions only.
"""

from __future__ import annotations

import math

from tfdist.errors import is_count

__all__ = ["scale_learning_rate"]

_SCHEDULE_CLASSES: dict = {}


def _schedule_class():
    """The warmup schedule class, subclassing the LearningRateSchedule of the Keras in use."""
    from tfdist import flavour

    keras = flavour.keras()
    key = keras.__name__
    if key in _SCHEDULE_CLASSES:
        return _SCHEDULE_CLASSES[key]
    import tensorflow as tf

    if flavour.uses_legacy_keras():
        register = keras.utils.register_keras_serializable(package="tfdist")
    else:
        register = keras.saving.register_keras_serializable(package="tfdist")

    class LinearScalingWarmup(keras.optimizers.schedules.LearningRateSchedule):
        """lr(step) = base(step) x (1 + (num_replicas - 1) x min(step / warmup_steps, 1))."""

        def __init__(self, base_lr, num_replicas, warmup_steps=0, name=None):
            super().__init__()
            self.base_lr = base_lr
            self.num_replicas = int(num_replicas)
            self.warmup_steps = int(warmup_steps)
            self.name = name

        def _base(self, step):
            if isinstance(self.base_lr, keras.optimizers.schedules.LearningRateSchedule):
                return tf.cast(self.base_lr(step), tf.float32)
            return tf.constant(float(self.base_lr), tf.float32)

        def __call__(self, step):
            step = tf.cast(step, tf.float32)
            if self.warmup_steps > 0:
                progress = tf.minimum(step / float(self.warmup_steps), 1.0)
            else:
                progress = tf.constant(1.0)
            factor = 1.0 + (self.num_replicas - 1.0) * progress
            return self._base(step) * factor

        def get_config(self):
            base = self.base_lr
            if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
                base = keras.optimizers.schedules.serialize(base)
            return {
                "base_lr": base,
                "num_replicas": self.num_replicas,
                "warmup_steps": self.warmup_steps,
                "name": self.name,
            }

        @classmethod
        def from_config(cls, config):
            config = dict(config)
            if isinstance(config["base_lr"], dict):
                config["base_lr"] = keras.optimizers.schedules.deserialize(config["base_lr"])
            return cls(**config)

        def __repr__(self):
            return (
                f"<LinearScalingWarmup base_lr={self.base_lr!r} "
                f"num_replicas={self.num_replicas} warmup_steps={self.warmup_steps}>"
            )

    cls = register(LinearScalingWarmup)
    _SCHEDULE_CLASSES[key] = cls
    return cls


def scale_learning_rate(base_lr, num_replicas, *, warmup_steps: int = 0, name=None):
    """The linear scaling rule with gradual warmup (Goyal et al. 2017, as Horovod users know it).

    Opt-in. With N replicas the global batch is N times larger, so the learning rate is N
    times larger too: `lr = base_lr x N`. Starting there can diverge, so the rate ramps
    linearly from `base_lr` at step 0 to `base_lr x N` at `warmup_steps`, and stays scaled.

    Args:
        base_lr: float, or a Keras LearningRateSchedule: the rate tuned for one replica.
            A schedule is followed step by step and multiplied by the same factor.
        num_replicas: int, or a tf.distribute.Strategy (its `num_replicas_in_sync`).
        warmup_steps: int. Optimizer steps of the warmup; 0 scales at once. Defaults to 0.
        name: str. Defaults to None.

    Returns:
        A LearningRateSchedule of the Keras in use (Keras 3 or tf_keras), for
        `optimizer(learning_rate=...)`.

    Raises:
        ValueError / TypeError: num_replicas < 1, warmup_steps < 0, base_lr <= 0.

    Example:

    ```python
    strategy = tfdist.make_strategy()
    lr = tfdist.scale_learning_rate(0.001, strategy, warmup_steps=500)
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(lr), ...)
    ```
    """
    replicas = getattr(num_replicas, "num_replicas_in_sync", num_replicas)
    if not is_count(replicas, 1):
        raise ValueError(
            f"num_replicas must be a positive int or a strategy. Received: "
            f"num_replicas={num_replicas!r}. HINT: pass the strategy itself, or "
            "strategy.num_replicas_in_sync."
        )
    if not is_count(warmup_steps):
        raise ValueError(
            f"warmup_steps must be an int >= 0. Received: warmup_steps={warmup_steps!r}. "
            "HINT: 0 for no warmup."
        )
    cls = _schedule_class()
    if isinstance(base_lr, (int, float)) and not isinstance(base_lr, bool):
        if not math.isfinite(base_lr) or base_lr <= 0:
            raise ValueError(f"base_lr must be a positive number. Received: base_lr={base_lr!r}.")
    elif not callable(base_lr):
        raise TypeError(
            f"base_lr must be a float or a LearningRateSchedule. Received: "
            f"base_lr={base_lr!r} (of type {type(base_lr).__name__})."
        )
    return cls(base_lr, replicas, warmup_steps, name)
