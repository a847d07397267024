"""Fixes for batches that do not split evenly over the replicas.

A global batch of 15 examples on 2 replicas gives them 8 and 7; the last batch of an epoch is
often smaller still. Keras takes each replica's mean loss, divides it by the number of replicas
and sums the gradients: the mean of the replicas' means, which weighs the 7 examples more than
the 8 and is not the global batch's mean. The fix weighs each replica's gradient by its share of
the examples instead, and reads the step's logged loss and metrics over all replicas. On
mirrored only: between processes (multi_worker_mirrored) the two extra all-reduces a step cost
more than they are worth on CPUs, and an uneven batch there weighs as in Keras.

Nothing here imports TensorFlow or Keras at import time.
"""

import threading

from tfdist.fixes.keras_trainer import BASE_TRAINER, TF_TRAINER, TRAINER, tf_trainer
from tfdist.fixes.record import Fix, Target

UNEVEN_BATCHES = Fix(
    name="uneven_batches_weighted_by_examples",
    summary=(
        "Each replica's mean loss counts the same in the summed gradient, however many of the "
        "batch's examples the replica had."
    ),
    upstream="none found (tf_keras has the same mean of means)",
    strategies=("mirrored",),
    consequence=(
        "a batch that does not split evenly over the replicas (8 and 7 of 15, or an epoch's "
        "smaller last batch) takes another step than on one device (no error)."
    ),
)


def _local_examples(tf, data):
    """The number of examples in this replica's batch: the first dimension of the first input."""
    x = data[0] if isinstance(data, (tuple, list)) and 1 <= len(data) <= 3 else data
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return first.shape[0], tf.shape(first)[0]


_LOSS_SCALE = "keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer"


_TARGETS = [
    TF_TRAINER.target("train_step", ("self", "data")),
    Target("keras.src.optimizers.base_optimizer:BaseOptimizer.scale_loss", ("self", "loss")),
    Target(f"{_LOSS_SCALE}.scale_loss", ("self", "loss")),
    BASE_TRAINER.target("get_metrics_result", ("self",)),
    Target(f"{TRAINER}:reduce_per_replica", ("values", "strategy", "reduction")),
]


@UNEVEN_BATCHES.variant("3.3", "3.16", targets=_TARGETS)
def _uneven_batches_traced_from_the_iterator():
    # Keras 3.3-3.15 trace the step around iterator.get_next(): a replica's batch has a static
    # size only when every batch has it, so every replica has the same.
    _fix_uneven_batches(static_is_even=True)


@UNEVEN_BATCHES.variant("3.16", targets=_TARGETS)
def _uneven_batches_traced_from_the_batch():
    # Keras 3.16 takes the batch eagerly with steps_per_execution=1 and traces the step for its
    # shapes: each replica's batch has a static size there, which differs between replicas
    # when the batch does not split evenly (4 and 3 of 7).
    _fix_uneven_batches(static_is_even=False)


def _fix_uneven_batches(static_is_even: bool):
    # No upstream issue found. The TensorFlow trainer's train_step (keras/src/backend/tensorflow/
    # trainer.py) differentiates the replica's mean loss over its own examples, scaled by
    # 1 / num_replicas (Keras >= 3.8, or tfdist's loss_scaled_for_replicas), and the optimizer
    # sums the gradients over the replicas. With n_r examples on replica r of N in all, the
    # global batch's mean needs the weight n_r / N, not 1 / num_replicas. The fix multiplies
    # the loss by num_replicas * n_r / N where train_step turns it into the gradient's source,
    # optimizer.scale_loss (one scalar all-reduce for N), so that gradients that cross the
    # replicas (a synchronized BatchNormalization's all-reduce) are weighted right too. The
    # logged loss is already weighted by n_r. And the step's logs, each replica's results
    # averaged over the replicas (a mean of means), are read from the metrics' totals and
    # counts summed over the replicas instead (reduce_per_replica, after strategy.run).
    # Batches of a static size, where that means equal (`static_is_even`): unchanged, no
    # all-reduce. One replica, a custom train_step, or multi_worker_mirrored (there the two
    # all-reduces between processes cost fit half its throughput on CPUs,
    # benchmarks/bench_uneven_batches.py): unchanged.
    import tensorflow as tf
    from keras.src.optimizers import base_optimizer, loss_scale_optimizer

    trainer, cls = tf_trainer(), TF_TRAINER.get()
    original_train_step = cls.train_step

    def train_step(self, data):
        context = tf.distribute.get_replica_context()
        if getattr(self, "optimizer", None) is None or context is None:
            return original_train_step(self, data)
        replicas = context.num_replicas_in_sync
        static, local = _local_examples(tf, data)
        if replicas <= 1 or (static_is_even and static is not None) or _across_workers(tf):
            return original_train_step(self, data)
        local = tf.cast(local, tf.float32)
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
        # Mirrored traces its replicas in threads of their own: the share is per thread.
        _SHARE.value = tf.math.divide_no_nan(local * replicas, total)
        try:
            logs = original_train_step(self, data)
        finally:
            _SHARE.value = None
        _EXACT_LOGS["model"] = self  # for reduce_per_replica, right after strategy.run
        return logs

    def weighted(original):
        def scale_loss(self, loss):
            scaled = original(self, loss)
            share = getattr(_SHARE, "value", None)
            if share is None:
                return scaled
            _SHARE.value = None  # once per step
            return scaled * tf.cast(share, scaled.dtype)

        return scale_loss

    original_reduce = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        # Each replica's results read its own totals; Keras averages them over the replicas, a
        # mean of means. Outside strategy.run a read of the metrics' sync-on-read totals and
        # counts sums them over the replicas (on one host: an add, no synchronisation).
        model = _EXACT_LOGS.pop("model", None)
        if model is not None and reduction in ("auto", "mean") and isinstance(values, dict):
            exact = model.get_metrics_result()
            if set(exact) == set(values):
                return exact
        return original_reduce(values, strategy, reduction)

    cls.train_step = train_step
    trainer.reduce_per_replica = reduce_per_replica  # looked up when the step is traced
    for optimizer in (base_optimizer.BaseOptimizer, loss_scale_optimizer.LossScaleOptimizer):
        optimizer.scale_loss = weighted(optimizer.scale_loss)


def _across_workers(tf) -> bool:
    """multi_worker_mirrored: each all-reduce is a collective between processes, which costs as
    much as a small step on CPUs; the fix's two would halve fit's throughput there."""
    return isinstance(tf.distribute.get_strategy(), tf.distribute.MultiWorkerMirroredStrategy)


_SHARE = threading.local()  # this replica's num_replicas * n_r / N while its train_step traces
_EXACT_LOGS: dict = {}  # "model": the model whose step logs the traced step reads exactly


EMPTY_REPLICA_LOSS = Fix(
    name="empty_replica_batch_loss_is_zero",
    summary=(
        "A loss's mean over a replica's batch divides by its number of examples, so a replica "
        "that gets none of a small last batch has the loss 0 / 0 = NaN, and the logged loss, "
        "a total over every replica, is NaN from then on."
    ),
    upstream="tensorflow/tensorflow#41657",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "fit and evaluate log loss: nan for an epoch whose last batch has fewer examples "
        "than there are replicas (the weights still train; no error)."
    ),
    fixed_in="3.7",
)


@EMPTY_REPLICA_LOSS.variant(
    "3.3",
    targets=[
        Target("keras.src.losses.loss:reduce_values", ("values", "reduction")),
        Target(
            "keras.src.losses.loss:reduce_weighted_values",
            ("values", "sample_weight", "mask", "reduction"),
        ),
    ],
)
def _fix_empty_replica_loss():
    # tensorflow/tensorflow#41657 (tf.keras), the same in Keras 3 before 3.7: reduce_values
    # (keras/src/losses/loss.py), which Loss.__call__ reaches through reduce_weighted_values,
    # divides the sum of a batch's losses by its size with `/=`. A replica whose share of a
    # batch is empty (2 examples on 4 replicas) gets 0 / 0 = NaN; train_step and test_step add
    # it to the loss metric weighted by that replica's 0 examples, and NaN * 0 is NaN, so the
    # epoch's logged loss is NaN. The gradient stays 0 (an empty sum). Keras 3.7 divides with
    # divide_no_nan; so does the fix, for the same reduction only: 0 examples give 0.
    from keras.src import ops
    from keras.src.losses import loss as loss_module

    original = loss_module.reduce_values

    def reduce_values(values, reduction="sum_over_batch_size"):
        if (
            reduction != "sum_over_batch_size"
            or tuple(values.shape) == ()
            or tuple(values.shape) == (0,)
        ):
            return original(values, reduction)
        size = ops.prod(ops.convert_to_tensor(ops.shape(values), dtype="int32"))
        return ops.divide_no_nan(ops.sum(values), ops.cast(size, values.dtype))

    loss_module.reduce_values = reduce_values


FIXES = (UNEVEN_BATCHES, EMPTY_REPLICA_LOSS)
