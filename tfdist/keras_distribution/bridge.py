"""Making a Keras distribution current on TensorFlow: its strategy, its datasets, its shards.

`activate(distribution)` runs when Keras sets the distribution (`set_distribution`, entering
or leaving `Distribution.scope()`), before Keras stores it, so a distribution TensorFlow
cannot carry is refused and nothing changes. It makes the plan's strategy TensorFlow's current
one (`tf.distribute.experimental_set_strategy`), so Keras builds mirrored variables and
`model.fit`, `evaluate`, `predict` and custom loops run on it, as inside `strategy.scope()`. A
model keeps the strategy it was built under, as in TensorFlow; `keras.utils.clear_session()`
drops both the distribution and the strategy.

Strategies are made once per set of devices (`tfdist.make_strategy("mirrored", devices=...)`,
with tfdist's fixes); a multi-process job has one, made by `keras.distribution.initialize()`.

Imports tfdist.strategy, tfdist.fixes and the sibling modules (TensorFlow inside functions).
"""

from __future__ import annotations

import threading
from typing import Optional

from tfdist.keras_distribution import devices as keras_devices
from tfdist.keras_distribution import plans, processes

__all__ = [
    "activate",
    "check_built_under_the_distribution",
    "distribute_dataset",
    "row_sharded_value",
    "shard_devices_for",
    "strategy_to_compile_under",
]

_LOCK = threading.RLock()
_STRATEGIES: dict = {}  # replica devices -> MirroredStrategy, once per process
_CURRENT = {"distribution": None, "plan": None, "strategy": None}


def _strategy_for(plan: Optional[plans.Plan]):
    if plan is None:
        return None
    if plan.row_sharded:
        from tfdist.fixes import apply_fixes

        apply_fixes()  # Keras 3 trains and saves sharded variables with tfdist's fixes only
        return None
    if plan.multi_process:
        return processes.strategy()
    with _LOCK:
        if plan.replicas not in _STRATEGIES:
            from tfdist.strategy import make_strategy

            _STRATEGIES[plan.replicas] = make_strategy(
                "mirrored", devices=keras_devices.local_tf_devices(plan.replicas)
            )
        return _STRATEGIES[plan.replicas]


def _global_scope():
    from tensorflow.python.framework import ops

    return getattr(ops.get_default_graph(), "_global_distribute_strategy_scope", None)


def activate(distribution) -> None:
    """Makes `distribution`'s strategy current (None: TensorFlow's default).

    Raises:
        ValueError / TypeError: a distribution TensorFlow cannot carry (see `plans`).
        RuntimeError: called inside another strategy's `with strategy.scope()`.
    """
    import tensorflow as tf

    plan = plans.plan_for(distribution)
    strategy = _strategy_for(plan)
    with _LOCK:
        ours = _CURRENT["strategy"] if _global_scope() is not None else None
        if tf.distribute.has_strategy() and tf.distribute.get_strategy() is not ours:
            raise RuntimeError(
                f"keras.distribution set {distribution!r} inside `with strategy.scope()` of "
                f"{tf.distribute.get_strategy()!r}. Both say how to distribute, and only one "
                "can. HINT: use either the Keras distribution (tfdist carries it on "
                "tf.distribute) or tfdist.make_strategy() with strategy.scope(), not both."
            )
        if strategy is not ours:
            tf.distribute.experimental_set_strategy(strategy)
        _CURRENT.update(distribution=distribution, plan=plan, strategy=strategy)


def strategy_to_compile_under(model):
    """The strategy `model` was built under by a Keras distribution, when no strategy is
    current now (else None: compile as Keras does)."""
    import tensorflow as tf

    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or tf.distribute.has_strategy():
        return None
    made_here = any(strategy is s for s in _STRATEGIES.values())
    return strategy if made_here or strategy is processes.strategy() else None


def check_built_under_the_distribution(model) -> None:
    """Raises when `model`, built with no strategy, is about to run under a distribution's.

    Raises:
        ValueError: the distribution was set after the model was built.
    """
    import tensorflow as tf

    if not tf.distribute.has_strategy() or not getattr(model, "variables", None):
        return
    current = tf.distribute.get_strategy()
    if current is _CURRENT["strategy"] and current is not None:
        raise ValueError(
            f"Model {model.name!r} was built before keras.distribution.set_distribution("
            f"{_CURRENT['distribution']!r}): its variables are on one device, and setting a "
            "distribution does not move them. HINT: set the distribution (or enter "
            "distribution.scope()) before building the model, as on JAX; or train this model "
            "on one device after keras.distribution.set_distribution(None)."
        )


def _plan_of(distribution) -> Optional[plans.Plan]:
    if distribution is None:
        return None
    if _CURRENT["distribution"] is distribution:
        return _CURRENT["plan"]
    return plans.plan_for(distribution)


def distribute_dataset(distribution, dataset, upstream):
    """`Distribution.distribute_dataset` on TensorFlow.

    One process: the dataset unchanged (the strategy splits each batch over the replicas in
    `fit`), as on JAX. Several processes: the strategy's distributed dataset, each process
    reading its share of every global batch (or, with `auto_shard_dataset=False`, its own
    batches whole). `fit`, `evaluate` and `predict` take it as it is.
    """
    import tensorflow as tf

    if processes.num_processes() == 1:
        return upstream(distribution, dataset)
    if isinstance(dataset, tf.distribute.DistributedDataset):
        return dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            f"A multi-process keras.distribution job distributes a tf.data.Dataset. Received: "
            f"{type(dataset).__name__}. HINT: tf.data.Dataset.from_tensor_slices(...).batch(B) "
            "with B the global batch size."
        )
    strategy = processes.strategy()
    if getattr(distribution, "auto_shard_dataset", True):  # a property from Keras 3.11
        return strategy.experimental_distribute_dataset(dataset)
    local_replicas = strategy.num_replicas_in_sync // processes.num_processes()
    if local_replicas > 1:  # this process's batches, split over its own replicas
        from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute

        local_batch = int(tf_data_distribute.compute_batch_size(dataset).numpy())
        if local_batch < 0 or local_batch % local_replicas:
            raise ValueError(
                f"With auto_shard_dataset=False each process's dataset is its own; its batch "
                f"size ({local_batch}, -1: unknown) must split over its {local_replicas} "
                "replicas. HINT: batch it with a multiple of the local replica count."
            )
        dataset = dataset.rebatch(local_batch // local_replicas)

    def this_process(context):  # distribute_datasets_from_function wants per-replica batches
        return dataset

    return strategy.distribute_datasets_from_function(this_process)


def shard_devices_for(variable):
    """TensorFlow devices for `variable`'s row shards under the current distribution, or None."""
    from keras.src.distribution import distribution_lib

    distribution = distribution_lib.distribution()
    plan = _plan_of(distribution)
    names = plans.row_sharding(distribution, plan, variable)
    return None if names is None else keras_devices.local_tf_devices(names)


def row_sharded_value(variable, value, devices):
    """A ShardedVariable holding `value` split by rows, shard i on `devices[i]`.

    Rows are split as TensorFlow's partitioners split them: the first shards take one more row
    when the count does not divide. The whole initial value is made once, then split.
    """
    import tensorflow as tf
    from tensorflow.python.distribute import sharded_variable

    if callable(value):
        value = value()
    full = tf.convert_to_tensor(value, dtype=variable.dtype)
    rows, count = (int(full.shape[0]) if full.shape.rank else 0), len(devices)
    if rows < count:
        raise ValueError(
            f"Variable {variable.path!r} of shape {tuple(full.shape)} is laid out by rows over "
            f"{count} devices, but has {rows} row(s). HINT: shard only variables with at least "
            "one row per device (change the LayoutMap key so it does not match this one)."
        )
    sizes = [rows // count + (1 if i < rows % count else 0) for i in range(count)]
    shards = []
    for i, (part, device) in enumerate(zip(tf.split(full, sizes, axis=0), devices)):
        with tf.device(device):
            shards.append(
                tf.Variable(
                    tf.identity(part),
                    trainable=variable.trainable,
                    name=f"{variable.name}/part_{i}",
                )
            )
    return sharded_variable.ShardedVariable(shards, name=variable.name)
