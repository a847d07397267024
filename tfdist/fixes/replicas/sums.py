"""Fixes of the sums over the replicas (keras-team/keras#19891, fixed upstream since): the
gradients summed over the replicas, metric totals summed over them, and the loss scaled so
that the summed gradients make one device's step.

Each applies under mirrored and multi_worker_mirrored only (`_under_mirrored`). Nothing here
imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.keras_backend import OPTIMIZER, VARIABLE
from tfdist.fixes.keras_trainer import TF_TRAINER
from tfdist.fixes.record import Fix, Target


def _under_mirrored() -> bool:
    """True under mirrored or multi_worker_mirrored (whose extended subclasses mirrored's)."""
    import tensorflow as tf
    from tensorflow.python.distribute import mirrored_strategy

    return tf.distribute.has_strategy() and isinstance(
        tf.distribute.get_strategy().extended, mirrored_strategy.MirroredExtended
    )


GRADIENTS_SUMMED = Fix(
    name="gradients_summed_over_replicas",
    summary=(
        "The optimizer sums the gradients over the replicas inside its merge call, where there is "
        "no replica context, so nothing is summed and each replica applies its own gradient."
    ),
    upstream="keras-team/keras#19891 (fixed by keras-team/keras#19969, #20051)",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "under a strategy every replica trains on its own batch only: the replicas' weights "
        "drift apart and differ from one-device training (no error)."
    ),
    fixed_in="3.5",
)


@GRADIENTS_SUMMED.variant(
    "3.3",
    targets=[
        OPTIMIZER.target(
            "_backend_update_step", ("self", "grads", "trainable_variables", "learning_rate")
        ),
        OPTIMIZER.target(
            "_distributed_tf_update_step",
            ("self", "distribution", "grads_and_vars", "learning_rate"),
        ),
        OPTIMIZER.target("_all_reduce_sum_gradients", ("self", "grads_and_vars")),
    ],
)
def _fix_gradients_summed():
    # keras-team/keras#19891. Keras 3.3-3.4's TFOptimizer._backend_update_step hands the
    # per-replica gradients to maybe_merge_call(_distributed_tf_update_step), which calls
    # _all_reduce_sum_gradients in cross-replica context: there get_replica_context() is None,
    # so it returns the gradients unreduced and each replica's copy of a weight is updated with
    # that replica's own gradient. Keras 3.5 (keras-team/keras#19969, #20051) all-reduces in
    # replica context, before the merge call, and the update step applies what it is given.
    # The fix does the same.
    import tensorflow as tf
    from keras.src import backend

    cls = OPTIMIZER.get()
    original_update, original_distributed = (
        cls._backend_update_step,
        cls._distributed_tf_update_step,
    )

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not _under_mirrored():  # parameter_server: as upstream
            return original_update(self, grads, trainable_variables, learning_rate)
        variables = [v.value if isinstance(v, backend.Variable) else v for v in trainable_variables]
        grads_and_vars = self._all_reduce_sum_gradients(list(zip(grads, variables)))
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step,
            self._distribution_strategy,
            grads_and_vars,
            learning_rate,
        )

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        if not _under_mirrored():
            return original_distributed(self, distribution, grads_and_vars, learning_rate)

        def apply_grad_to_update_var(var, grad, learning_rate):
            return self.update_step(grad, var, learning_rate)

        for grad, var in grads_and_vars:  # already summed over the replicas
            distribution.extended.update(
                var, apply_grad_to_update_var, args=(grad, learning_rate), group=False
            )

    cls._backend_update_step = _backend_update_step
    cls._distributed_tf_update_step = _distributed_tf_update_step


METRICS_SUMMED = Fix(
    name="metric_variables_summed_over_replicas",
    summary=(
        "Metric totals and counts are plain mirrored variables: each replica adds its own "
        "batch to its own copy, and the result reads one replica's."
    ),
    upstream="keras-team/keras#19891 (the evaluate half), keras-team/keras#20699",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "the loss and metrics that fit and evaluate report under a strategy are wrong (one "
        "replica's examples only before Keras 3.7, every replica's running total summed again "
        "on each update in 3.7-3.9); no error, and different numbers on each worker."
    ),
    fixed_in="3.10",
)


@METRICS_SUMMED.variant("3.3", "3.5", targets=[VARIABLE.target("_initialize", ("self", "value"))])
def _metrics_summed_initialize():
    _patch_metric_variables(("_initialize",))


@METRICS_SUMMED.variant(
    "3.5",
    targets=[
        VARIABLE.target("_initialize", ("self", "value")),
        VARIABLE.target("_initialize_with_initializer", ("self", "initializer")),
    ],
)
def _metrics_summed_both_initializers():
    _patch_metric_variables(("_initialize", "_initialize_with_initializer"))


def _patch_metric_variables(methods):
    # keras-team/keras#19891 ("incorrect output from evaluate/fit in distributed context").
    # Keras before 3.7 creates every variable as a plain tf.Variable: the aggregation a metric
    # asks for ("sum", keras/src/metrics/metric.py add_variable) never reaches TensorFlow, so
    # under a strategy a metric's total and count are mirrored variables that each replica
    # updates alone, and reading them gives one replica's share. Keras 3.7-3.9 pass SUM on,
    # but the variable stays on-write and Keras' assign_add is assign(self + value), so each
    # update sums every replica's running total (keras-team/keras#20699). tf_keras (and Keras
    # 3.10 on) make them sync-on-read sums: each replica adds locally, a read sums the
    # replicas. The fix creates "sum" variables that way under mirrored and
    # multi_worker_mirrored. Other variables: unchanged.
    import tensorflow as tf

    cls = VARIABLE.get()

    def make(self, initial_value):
        self._value = tf.Variable(
            initial_value,
            dtype=self._dtype,
            trainable=self.trainable,
            name=self.name,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )

    def summed(self) -> bool:
        return getattr(self, "_aggregation", None) == "sum" and _under_mirrored()

    original = {name: getattr(cls, name) for name in methods}

    def _initialize(self, value):
        if not summed(self):
            return original["_initialize"](self, value)
        make(self, value)

    def _initialize_with_initializer(self, initializer):
        if not summed(self):
            return original["_initialize_with_initializer"](self, initializer)
        make(self, lambda: initializer(self._shape, dtype=self._dtype))

    cls._initialize = _initialize
    if "_initialize_with_initializer" in original:
        cls._initialize_with_initializer = _initialize_with_initializer


LOSS_SCALED_FOR_REPLICAS = Fix(
    name="loss_scaled_for_replicas",
    summary=(
        "The training loss is not divided by the number of replicas, whose gradients are then "
        "summed: training under a strategy differs from one device (N times the step)."
    ),
    upstream="keras-team/keras#19891 (fixed by keras-team/keras#20609)",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "model.fit under a strategy with N replicas takes N times the one-device step (no "
        "error; different, often unstable, training)."
    ),
    fixed_in="3.8",
)


@LOSS_SCALED_FOR_REPLICAS.variant(
    "3.3",
    targets=[
        TF_TRAINER.target("train_step", ("self", "data")),
        Target("keras.src.optimizers.base_optimizer:BaseOptimizer.scale_loss", ("self", "loss")),
    ],
)
def _fix_loss_scaled_for_replicas():
    # keras-team/keras#19891. Before Keras 3.8, TensorFlowTrainer.train_step takes the gradient of
    # each replica's mean loss and the optimizer sums the gradients over all replicas, so a
    # step is num_replicas times the one-device step. Keras 3.8 (keras-team/keras#20609) divides
    # the loss by the number of replicas before the gradient. The fix does the same at the one
    # place train_step turns the loss into the gradient's source, optimizer.scale_loss (the
    # logged loss is not changed). One replica: unchanged.
    import tensorflow as tf

    cls = TF_TRAINER.get()
    original = cls.train_step

    def train_step(self, data):
        optimizer = getattr(self, "optimizer", None)
        context = tf.distribute.get_replica_context()
        if optimizer is None or context is None or not _under_mirrored():
            return original(self, data)
        replicas = context.num_replicas_in_sync
        if replicas <= 1:
            return original(self, data)
        scale = type(optimizer).scale_loss

        def scale_loss(loss):
            scaled = scale(optimizer, loss)
            return scaled * tf.cast(1.0 / replicas, scaled.dtype)

        optimizer.__dict__["scale_loss"] = scale_loss  # this trace only; no attribute tracking
        try:
            return original(self, data)
        finally:
            optimizer.__dict__.pop("scale_loss", None)

    cls.train_step = train_step
