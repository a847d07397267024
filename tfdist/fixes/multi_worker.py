"""Fixes for multi_worker_mirrored: the step logs' mean over workers, steps_per_execution.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.keras_trainer import TF_TRAINER, TRAINER, tf_trainer
from tfdist.fixes.record import Fix, Target

MULTI_WORKER_MEAN = Fix(
    name="multi_worker_mean_of_metric_results",
    summary=(
        "The step logs are averaged over the workers with an axis=0 reduction, but they are "
        "scalars."
    ),
    upstream="keras-team/keras#20585",
    strategies=("multi_worker_mirrored",),
    consequence=(
        'fit and evaluate on multi_worker_mirrored fail with "Invalid reduction dimension 0 for '
        'input with 0 dimensions".'
    ),
)


@MULTI_WORKER_MEAN.variant(
    "3.3",
    targets=[
        Target(f"{TRAINER}:reduce_per_replica", ("values", "strategy", "reduction")),
        f"{TRAINER}:_collective_all_reduce_multi_worker",
    ],
)
def _fix_reduce_per_replica():
    # keras-team/keras#20585 (the second failure once the first is fixed). reduce_per_replica
    # (keras/src/backend/tensorflow/trainer.py) averages the per-replica step logs under
    # multi_worker_mirrored with strategy.reduce("MEAN", v, axis=0), but the logs are scalars:
    # "Invalid reduction dimension 0 for input with 0 dimensions". The element-wise mean over
    # all replicas of all workers is strategy.reduce("MEAN", v, axis=None). Upstream would
    # reduce each log on its own, one all-reduce between the processes per log per step, and
    # an all-reduce costs about as much as a small model's whole step there; tfdist averages
    # all logs of one dtype in one all-reduce (`mean_over_replicas`). Other strategies and
    # reductions go to the original function.
    trainer = tf_trainer()
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            return mean_over_replicas(values, strategy)
        return original(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica  # looked up when the step is traced


def mean_over_replicas(values, strategy):
    """The element-wise mean over all replicas of each distributed value in `values`.

    The values of one dtype (and known shape) go in one all-reduce: they are flattened and
    joined on each replica, averaged, then split back. A plain tensor is this worker's value
    (its one replica's, as strategy.run returns it with one device per worker) and is averaged
    too; anything else is returned as it is.
    """
    import tensorflow as tf
    from keras.src import tree

    flat = tree.flatten(values)
    groups = {}
    for index, value in enumerate(flat):
        if not isinstance(value, (tf.distribute.DistributedValues, tf.Tensor)):
            continue
        local = strategy.experimental_local_results(value)[0]
        key = (local.dtype, local.shape.is_fully_defined())
        groups.setdefault(key, []).append((index, local.shape))
    result = list(flat)
    for (_, known), members in groups.items():
        if len(members) == 1 or not known:
            for index, _ in members:
                result[index] = strategy.reduce("MEAN", flat[index], axis=None)
            continue
        joined = strategy.run(
            lambda *parts: tf.concat([tf.reshape(part, [-1]) for part in parts], axis=0),
            args=tuple(flat[index] for index, _ in members),
        )
        mean = strategy.reduce("MEAN", joined, axis=None)
        pieces = tf.split(mean, [shape.num_elements() for _, shape in members])
        for (index, shape), piece in zip(members, pieces):
            result[index] = tf.reshape(piece, shape)
    return tree.pack_sequence_as(values, result)


MULTI_WORKER_STEPS_PER_EXECUTION = Fix(
    name="multi_worker_steps_per_execution",
    summary=(
        "steps_per_execution runs the step (a tf.function of collectives) inside cond inside "
        "while_loop, which multi_worker_mirrored cannot feed."
    ),
    upstream="keras-team/keras#19246",
    strategies=("multi_worker_mirrored",),
    consequence=(
        'compile(steps_per_execution>1) on multi_worker_mirrored fails with "You must feed a '
        'value for placeholder tensor".'
    ),
    absent_before="Keras before 3.7 unrolls steps_per_execution in Python, without a nested loop",
)


@MULTI_WORKER_STEPS_PER_EXECUTION.variant(
    "3.7",
    targets=[
        TF_TRAINER.target("_make_function", ("self", "step_function")),
        f"{TRAINER}:reduce_per_replica",
        f"{TRAINER}:_collective_all_reduce_multi_worker",
    ],
)
def _fix_multi_worker_steps_per_execution():
    # keras-team/keras#19246 ("You must feed a value for placeholder tensor"). With
    # steps_per_execution > 1, the TensorFlow trainer's _make_function
    # (keras/src/backend/tensorflow/trainer.py) runs the step, itself a tf.function holding
    # collective all-reduces, inside tf.cond inside tf.while_loop. Under multi_worker_mirrored
    # TensorFlow cannot feed that nested function's collective keys: "You must feed a value for
    # placeholder tensor 'while/body/.../while/cond/Placeholder'". The same loop with the step
    # inlined (no nested tf.function) works, so for multi-worker strategies tfdist builds that
    # loop: up to steps_per_execution steps, stopping early when the data ends, as upstream.
    # Upstream also averages every step's logs over all workers (one cross-worker all-reduce
    # per log per step) and keeps only the last step's; with one replica per worker, tfdist
    # carries the worker's own logs through the loop and averages the last ones once: the
    # same values, with steps_per_execution - 1 fewer collectives per call. (With several
    # local replicas the logs are PerReplica values; they are averaged every step, as
    # upstream.) With steps_per_execution=1 (compile's default) the step is built the same
    # way, without the loop: upstream's nested tf.function, Optional wrapping and the eager
    # has_value / get_value that follow it cost about a tenth of a small model's step between
    # processes (benchmarks/bench_fit_step.py); jit_compile keeps upstream's function.
    import tensorflow as tf

    trainer, cls = tf_trainer(), TF_TRAINER.get()
    original = cls._make_function

    def _make_function(self, step_function):
        strategy = self._distribute_strategy
        if (
            strategy is None
            or self.run_eagerly
            or (self.steps_per_execution == 1 and self.jit_compile)
            or not trainer._collective_all_reduce_multi_worker(strategy)
        ):
            return original(self, step_function)
        steps = self.steps_per_execution
        fallback = original(self, step_function)

        reduce_once = len(strategy.extended.worker_devices) == 1

        def reduce(outputs):
            return trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        def local_step(data):  # deliberately not a tf.function: see above
            outputs = strategy.run(step_function, args=(data,))  # this worker's logs
            return outputs if reduce_once else reduce(outputs)

        if hasattr(self, "_autoconvert_optionals"):  # Keras 3.12 on: Optional inputs -> None
            local_step = self._autoconvert_optionals(local_step)

        @tf.function(reduce_retracing=True)
        def multi_step(iterator):
            outputs = local_step(iterator.get_next())  # OutOfRange ends the epoch, as upstream
            if steps == 1:
                return reduce(outputs) if reduce_once else outputs

            def keep_going(step, outputs, exhausted):
                return tf.logical_and(step < steps, tf.logical_not(exhausted))

            def body(step, outputs, exhausted):
                optional = iterator.get_next_as_optional()
                outputs, exhausted = tf.cond(
                    optional.has_value(),
                    lambda: (local_step(optional.get_value()), tf.constant(False)),
                    lambda: (outputs, tf.constant(True)),
                )
                return step + 1, outputs, exhausted

            _, outputs, _ = tf.while_loop(
                keep_going, body, [tf.constant(1), outputs, tf.constant(False)]
            )
            return reduce(outputs) if reduce_once else outputs

        def function(iterator):
            if isinstance(iterator, tf.distribute.DistributedIterator):
                return multi_step(iterator)
            return fallback(iterator)

        return function

    cls._make_function = _make_function
    _LOOP["applied"] = True


_LOOP = {"applied": False}


def steps_loop_applied() -> bool:
    """True once this process runs several steps per call on multi-worker strategies (the
    multi_worker_steps_per_execution fix is applied); without it such a call fails there."""
    return _LOOP["applied"]


FIXES = (MULTI_WORKER_MEAN, MULTI_WORKER_STEPS_PER_EXECUTION)
