"""Fixes for parameter_server under Keras 3, which has no parameter-server support of its own.

Atomic assign_add on the ps (and, on Keras 3.3, metric totals that use it), model.fit /
evaluate / predict through tfdist's coordinator loop, sharded variables trained shard by shard
and checkpointed whole (keras-team/keras#18624). tf_keras' own parameter-server fit:
`tf_keras_parameter_server`.

Nothing here imports TensorFlow or Keras at import time; tfdist.parameter_server is imported
when fit is called.
"""

import functools

from tfdist.fixes.keras_backend import VARIABLE
from tfdist.fixes.keras_trainer import TF_TRAINER
from tfdist.fixes.record import Fix, Target


def _ps_value_types() -> tuple:
    """The tf.Variable types a Keras variable wraps when it lives on a parameter server."""
    import tensorflow as tf
    from tensorflow.python.distribute import ps_values

    return (
        ps_values.CachingVariable,
        ps_values.AggregatingVariable,
        tf.__internal__.distribute.ShardedVariable,
    )


def _on_ps():
    """A predicate: the Keras variable lives on a ps (and is not read in a stateless scope)."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    ps_types = _ps_value_types()

    def on_ps(variable) -> bool:
        return isinstance(variable._value, ps_types) and not in_stateless_scope()

    return on_ps


PS_ATOMIC_ASSIGN_ADD = Fix(
    name="parameter_server_atomic_assign_add",
    summary=(
        "Variable.assign_add is a read, an add on the worker and an assign back, so concurrent "
        "workers lose updates."
    ),
    upstream="keras-team/keras#18624",
    strategies=("parameter_server",),
    consequence=(
        "optimizer.iterations, learning-rate schedules and metric totals come out short with "
        "several parameter-server workers."
    ),
)


@PS_ATOMIC_ASSIGN_ADD.variant(
    "3.3",
    targets=[
        VARIABLE.target("assign_add", ("self", "value")),
        VARIABLE.target("assign_sub", ("self", "value")),
        "keras.src.backend.common.stateless_scope:in_stateless_scope",
    ],
)
def _fix_ps_assign_add():
    # The root cause of "optimizer.iterations ends short" under ParameterServerStrategy with a
    # ClusterCoordinator (keras-team/keras#18624: Keras 3 has no ps support): Keras 3's
    # Variable.assign_add / assign_sub (keras/src/backend/common/variables.py) are
    # `self.assign(self + value)`, a read on the ps, an add on the worker, then a plain assign
    # back. Two workers doing that at once lose one update. It hits optimizer.iterations
    # (BaseOptimizer.apply) and every metric total/count (reduction_metrics.Reduce), so step
    # counts, learning-rate schedules and the global metrics all come out short. The fix sends
    # the update to the wrapped tf.Variable's assign_add (one AssignAddVariableOp on the ps,
    # atomic under the variable's lock). Only for variables that live on a ps.
    variable = VARIABLE.get()
    on_ps = _on_ps()
    original_add, original_sub = variable.assign_add, variable.assign_sub

    def _cast(variable, value):
        import tensorflow as tf

        return tf.cast(
            variable._convert_to_tensor(value, dtype=variable._dtype), variable._value.dtype
        )

    def assign_add(self, value):
        if not on_ps(self):
            return original_add(self, value)
        return self._value.assign_add(_cast(self, value))

    def assign_sub(self, value):
        if not on_ps(self):
            return original_sub(self, value)
        return self._value.assign_sub(_cast(self, value))

    variable.assign_add, variable.assign_sub = assign_add, assign_sub


PS_ATOMIC_METRIC_TOTALS = Fix(
    name="parameter_server_atomic_metric_totals",
    summary=(
        "Keras 3.3's Sum and Mean metrics (the loss tracker and every mean metric among them) "
        "add to their totals with assign(total + value), not assign_add, so concurrent workers "
        "lose updates even with atomic assign_add."
    ),
    upstream="keras-team/keras#18624",
    strategies=("parameter_server",),
    consequence=(
        "the loss and the mean metrics of a parameter-server fit or evaluate with several "
        "workers are wrong (an accuracy above 1 is possible)."
    ),
    fixed_in="3.4",  # Keras 3.4's metrics use assign_add, which the fix above makes atomic
)


@PS_ATOMIC_METRIC_TOTALS.variant(
    "3.3",
    targets=[
        Target("keras.src.metrics.reduction_metrics:Sum.update_state", ("self", "values")),
        Target("keras.src.metrics.reduction_metrics:Mean.update_state", ("self", "values")),
        "keras.src.metrics.reduction_metrics:reduce_to_samplewise_values",
    ],
)
def _fix_ps_metric_totals():
    # Keras 3.3's reduction_metrics.Sum / Mean.update_state do `self.total.assign(self.total +
    # ...)` (and the same for `count`): a read on the ps, an add on the worker, an assign back,
    # which parameter_server_atomic_assign_add cannot reach. Keras 3.4 changed both to
    # assign_add; this is that form, for variables on a ps only.
    from keras.src import ops
    from keras.src.metrics import reduction_metrics

    on_ps = _on_ps()
    Sum, Mean = reduction_metrics.Sum, reduction_metrics.Mean
    original_sum, original_mean = Sum.update_state, Mean.update_state
    samplewise = reduction_metrics.reduce_to_samplewise_values

    def sum_update_state(self, values, sample_weight=None):
        if not on_ps(self.total):
            return original_sum(self, values, sample_weight)
        values, _ = samplewise(values, sample_weight, reduce_fn=ops.sum, dtype=self.dtype)
        self.total.assign_add(ops.sum(values))

    def mean_update_state(self, values, sample_weight=None):
        if not on_ps(self.total):
            return original_mean(self, values, sample_weight)
        values, sample_weight = samplewise(
            values, sample_weight, reduce_fn=ops.mean, dtype=self.dtype
        )
        self.total.assign_add(ops.sum(values))
        num_samples = ops.shape(values)[0] if len(values.shape) >= 1 else 1
        if sample_weight is not None:
            num_samples = ops.sum(sample_weight)
        self.count.assign_add(ops.cast(num_samples, dtype=self.dtype))

    Sum.update_state, Mean.update_state = sum_update_state, mean_update_state


PS_FIT_EVALUATE_PREDICT = Fix(
    name="parameter_server_fit_evaluate_predict",
    summary="Keras 3's fit, evaluate and predict have no ParameterServerStrategy support.",
    upstream="keras-team/keras#18624",
    strategies=("parameter_server",),
    consequence=(
        'model.fit / evaluate / predict of a parameter-server model fail with "To use this '
        'dataset, you need to pass this dataset to ClusterCoordinator.create_per_worker_dataset" '
        "(tfdist.fit still works)."
    ),
)


@PS_FIT_EVALUATE_PREDICT.variant(
    "3.3",
    targets=[
        TF_TRAINER.target("fit", ("self", "x", "y", "batch_size")),
        TF_TRAINER.target("evaluate", ("self", "x", "y", "batch_size")),
        TF_TRAINER.target("predict", ("self", "x", "batch_size")),
    ],
)
def _fix_ps_fit_evaluate_predict():
    # keras-team/keras#18624: Keras 3's fit / evaluate / predict have no ParameterServerStrategy
    # support. A model built in a ps strategy's scope fails on its first batch with "To use
    # this dataset, you need to pass this dataset to
    # ClusterCoordinator.create_per_worker_dataset" (tf_keras trains it natively). The fix
    # sends fit and evaluate of such a model to tfdist's ClusterCoordinator loop
    # (tfdist.parameter_server.keras_fit / keras_evaluate, Keras' own arguments), and runs
    # predict on the coordinator itself, outside the strategy (each batch reads the variables
    # from the ps tasks), as tf_keras does for predict. Other strategies: unchanged.
    import inspect

    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib

    cls = TF_TRAINER.get()
    original = {name: getattr(cls, name) for name in ("fit", "evaluate", "predict")}

    def on_ps(model) -> bool:
        return isinstance(
            getattr(model, "_distribute_strategy", None), tf.distribute.ParameterServerStrategy
        )

    def routed(name, to):
        signature = inspect.signature(original[name])

        @functools.wraps(original[name])
        def method(self, *args, **kwargs):
            if not on_ps(self):
                return original[name](self, *args, **kwargs)
            self._assert_compile_called(name)
            arguments = signature.bind(self, *args, **kwargs).arguments
            del arguments["self"]
            arguments.update(arguments.pop("kwargs", {}))
            from tfdist import parameter_server

            return getattr(parameter_server, to)(self, **arguments)

        return method

    @functools.wraps(original["predict"])
    def predict(self, *args, **kwargs):
        if not on_ps(self):
            return original["predict"](self, *args, **kwargs)
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "model.predict of a parameter-server model runs on the coordinator, outside "
                "the strategy, but was called inside `strategy.scope()`. HINT: call it after "
                "the `with strategy.scope():` block."
            )
        strategy, self._distribute_strategy = (
            self._distribute_strategy,
            distribute_lib._get_default_strategy(),
        )
        try:  # its predict_function, made under the default strategy, is kept for next time
            return original["predict"](self, *args, **kwargs)
        finally:
            self._distribute_strategy = strategy

    cls.fit = routed("fit", "keras_fit")
    cls.evaluate = routed("evaluate", "keras_evaluate")
    cls.predict = predict


def _shards_of(variable) -> list:
    """One Keras variable per shard of a Keras variable that wraps a ShardedVariable.

    Made once and kept on the variable, so the optimizer sees the same objects every time. Each
    wraps the existing shard (no tf.Variable is made, nothing moves), so making them is allowed
    where Keras forbids new state (a stateless scope, as in Keras' symbolic build).
    """
    shards = variable.__dict__.get("_tfdist_shards")
    if shards is None:
        from keras.src.backend.common import global_state

        scope = global_state.get_global_attribute("stateless_scope")
        global_state.set_global_attribute("stateless_scope", None)
        try:
            shards = [
                _SHARD_VIEW[0](shard, variable.trainable, f"{variable.name}_shard_{i}")
                for i, shard in enumerate(variable._value.variables)
            ]
        finally:
            global_state.set_global_attribute("stateless_scope", scope)
        for shard in shards:
            # Elementwise regularizers (l1, l2) and constraints add up / apply per shard.
            shard.regularizer = getattr(variable, "regularizer", None)
            shard.constraint = variable.constraint
            shard._tfdist_sharded_parent = variable
        variable._tfdist_shards = shards
    return shards


PS_SHARDED_TRAINABLE = Fix(
    name="parameter_server_sharded_trainable_variables",
    summary=(
        "A weight sharded by a variable_partitioner is one Keras variable, which the tape and the"
        " optimizer cannot train."
    ),
    upstream="keras-team/keras#18624",
    strategies=("parameter_server",),
    consequence=(
        "training a model with a sharded weight fails with \"'ShardedVariable' object has no "
        "attribute 'handle'\"."
    ),
)


_SHARDED_TARGETS = [
    "keras.src.layers.layer:Layer.trainable_weights",
    "keras.src.layers.layer:Layer.trainable_variables",
    "keras.src.backend.common.global_state:get_global_attribute",
]
_SHARD_VIEW = [None]  # how to wrap one shard in a Keras variable on this release


def _view_by_initializer(shard, trainable, name):
    # Keras 3.10 on: a Variable made from an existing tf.Variable wraps it.
    from keras.src import backend

    return backend.Variable(initializer=shard, trainable=trainable, name=name)


def _view_by_subclass(shard, trainable, name):
    # Keras before 3.10 copies the initial value into a new tf.Variable (on whatever device is
    # current); a view must wrap the shard itself, so its _initialize keeps the value given.
    from keras.src import backend

    class ShardView(backend.Variable):
        def _initialize(self, value):
            self._value = value

    return ShardView(initializer=shard, trainable=trainable, name=name)


@PS_SHARDED_TRAINABLE.variant(
    "3.3",
    "3.10",
    targets=[*_SHARDED_TARGETS, VARIABLE.target("_initialize")],
)
def _sharded_trainable_by_subclass():
    _SHARD_VIEW[0] = _view_by_subclass
    _fix_ps_sharded_trainable_variables()


@PS_SHARDED_TRAINABLE.variant("3.10", targets=_SHARDED_TARGETS)
def _sharded_trainable_by_initializer():
    _SHARD_VIEW[0] = _view_by_initializer
    _fix_ps_sharded_trainable_variables()


def _fix_ps_sharded_trainable_variables():
    # With a variable_partitioner, ParameterServerStrategy makes a ShardedVariable for a large
    # weight (an Embedding table) and Keras 3 wraps it in one Keras variable
    # (keras/src/backend/tensorflow/[ops/]core.py: Variable._initialize). Keras 3 knows nothing of
    # ShardedVariable (keras-team/keras#18624): the forward pass works (the shards are
    # concatenated), but train_step's tape.gradient asks for `Variable.handle` ->
    # "'ShardedVariable' object has no attribute 'handle'", and the optimizer would place that
    # weight's slots next to the ShardedVariable, on the coordinator. The fix is what tf_keras
    # does: the list the tape and the optimizer train (Layer.trainable_weights and
    # Layer.trainable_variables, keras/src/layers/layer.py) holds one variable per shard, each
    # with its slots on its own ps. Layer.weights keeps the logical variable, so weight files and
    # checkpoints hold the whole table. Only for sharded variables.
    from keras.src.layers.layer import Layer

    sharded = _ps_value_types()[-1]

    def expanded(prop):
        def getter(self):
            variables = prop.fget(self)
            if not any(isinstance(getattr(v, "_value", None), sharded) for v in variables):
                return variables
            out = []
            for v in variables:
                if isinstance(getattr(v, "_value", None), sharded):
                    out.extend(_shards_of(v))
                else:
                    out.append(v)
            return out

        return property(getter, prop.fset, prop.fdel, prop.__doc__)

    Layer.trainable_weights = expanded(Layer.trainable_weights)
    Layer.trainable_variables = expanded(Layer.trainable_variables)


PS_SHARDED_CHECKPOINT = Fix(
    name="parameter_server_sharded_checkpoint",
    summary=(
        "Checkpoints and weight files of a sharded Keras variable fall back to APIs "
        "ShardedVariable lacks."
    ),
    upstream="keras-team/keras#18624",
    strategies=("parameter_server",),
    consequence=(
        "tf.train.Checkpoint / save_weights of a model with a sharded weight fail with "
        "\"'ShardedVariable' object has no attribute 'device'\" / \"'__array__'\"."
    ),
)


@PS_SHARDED_CHECKPOINT.variant(
    "3.3",
    targets=[
        VARIABLE.target("_serialize_to_tensors", ("self",)),
        VARIABLE.target("_restore_from_tensors", ("self", "restored_tensors")),
        VARIABLE.target("__array__"),
    ],
)
def _fix_ps_sharded_checkpoint():
    # tf.train.Checkpoint of a Keras 3 model with a sharded weight fails in
    # tensorflow/python/checkpoint/functional_saver.py MultiDeviceSaver.__init__ with
    # "'ShardedVariable' object has no attribute 'device'": Keras 3's
    # Variable._serialize_to_tensors (keras/src/backend/tensorflow/[ops/]core.py) falls back to
    # {"VARIABLE_VALUE": <ShardedVariable>} because ShardedVariable only has the legacy
    # saveables API. The fix saves the whole logical tensor (the shards concatenated), the same
    # entry an unsharded variable writes, and restores by assigning it to the ShardedVariable
    # (which splits it by shard). Checkpoints are then interchangeable between models with any
    # number of ps tasks, or none. Keras weight files fail the same way (Variable.__array__,
    # keras/src/backend/common/variables.py: "'ShardedVariable' object has no attribute
    # '__array__'") and get the same whole tensor. Only for sharded variables.
    import numpy as np
    import tensorflow as tf

    variable = VARIABLE.get()
    sharded = _ps_value_types()[-1]
    original_save, original_restore = variable._serialize_to_tensors, variable._restore_from_tensors
    original_array = variable.__array__

    def _serialize_to_tensors(self):
        if isinstance(self._value, sharded):
            return {"VARIABLE_VALUE": tf.convert_to_tensor(self._value)}
        return original_save(self)

    def _restore_from_tensors(self, restored_tensors):
        if isinstance(self._value, sharded):
            return self._value.assign(restored_tensors["VARIABLE_VALUE"])
        return original_restore(self, restored_tensors)

    def __array__(self, dtype=None):  # Keras weight files (.weights.h5, .keras) read this
        if isinstance(self._value, sharded):
            return np.asarray(tf.convert_to_tensor(self._value).numpy(), dtype=dtype)
        return original_array(self, dtype)

    variable._serialize_to_tensors = _serialize_to_tensors
    variable._restore_from_tensors = _restore_from_tensors
    variable.__array__ = __array__


FIXES = (
    PS_ATOMIC_ASSIGN_ADD,
    PS_ATOMIC_METRIC_TOTALS,
    PS_FIT_EVALUATE_PREDICT,
    PS_SHARDED_TRAINABLE,
    PS_SHARDED_CHECKPOINT,
)
