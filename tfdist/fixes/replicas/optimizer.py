"""Fixes of Keras 3's TensorFlow optimizer under a strategy: one made outside the scope, the
mixed_float16 skip decided by all replicas, and gradient accumulation.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.keras_backend import OPTIMIZER
from tfdist.fixes.record import Fix, Target

OPTIMIZER_OUTSIDE_SCOPE = Fix(
    name="optimizer_made_outside_the_scope",
    summary=(
        "An optimizer created outside strategy.scope() and used by a model built inside it fails "
        "deep in TensorFlow."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored", "parameter_server"),
    consequence=(
        "an optimizer made outside the scope fails with TensorFlow's \"Mixing different "
        'tf.distribute.Strategy objects" instead of an error that says where to create it.'
    ),
)


@OPTIMIZER_OUTSIDE_SCOPE.variant(
    "3.3",
    targets=[
        OPTIMIZER.target("build", ("self", "variables")),
    ],
)
def _fix_optimizer_outside_scope():
    # No upstream issue found. A Keras 3 TensorFlow optimizer binds the strategy that is
    # current when it is *constructed* (TFOptimizer.__init__, and its iterations variable is
    # created there too). One made outside strategy.scope() and used by a model built inside
    # fails deep in TensorFlow ("Mixing different tf.distribute.Strategy objects"); tf_keras
    # accepted it. tfdist turns that into an error that says what to move where.
    import tensorflow as tf

    cls = OPTIMIZER.get()
    original = cls.build

    def build(self, variables):
        current = tf.distribute.get_strategy()
        if tf.distribute.has_strategy() and current is not self._distribution_strategy:
            raise ValueError(
                f"The optimizer {self.name!r} was created outside the strategy's scope, but "
                f"the model it trains was built inside it ({type(current).__name__}). Keras 3 "
                "binds an optimizer to the strategy current when it is created. HINT: create "
                "it inside the scope: `with strategy.scope(): model.compile(optimizer="
                "keras.optimizers.Adam(...), ...)` (or pass the name, optimizer='adam')."
            )
        return original(self, variables)

    cls.build = build


LOSS_SCALE_SKIP = Fix(
    name="loss_scale_skip_agreed_by_all_replicas",
    summary=(
        "Under mixed_float16 each replica decides alone whether to skip a step whose gradients "
        "overflowed."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "under mixed_float16 with several replicas, a step where only some replicas overflow "
        "writes inf/NaN into every weight."
    ),
)


@LOSS_SCALE_SKIP.variant(
    "3.3",
    targets=[
        Target(
            "keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer.check_finite",
            ("self", "grads"),
        ),
    ],
)
def _fix_loss_scale_check_finite():
    # No upstream issue found. Keras 3's LossScaleOptimizer (keras/src/optimizers/
    # loss_scale_optimizer.py, check_finite) decides whether to skip a step from each
    # replica's own gradients, before they are summed over the replicas. When replica 0's are
    # finite and another replica's overflow, the replicas disagree and inf/NaN reaches every
    # weight under mixed_float16 on mirrored / multi_worker_mirrored. The fix makes the skip
    # a joint decision (one scalar all-reduce). One replica (or none): unchanged.
    import tensorflow as tf
    from keras.src.optimizers import loss_scale_optimizer

    original = loss_scale_optimizer.LossScaleOptimizer.check_finite

    def check_finite(self, grads):
        finite = original(self, grads)
        context = tf.distribute.get_replica_context()
        if context is None or not tf.distribute.has_strategy() or context.num_replicas_in_sync <= 1:
            return finite
        overflowed = context.all_reduce(
            tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32)
        )
        return tf.equal(overflowed, 0.0)

    loss_scale_optimizer.LossScaleOptimizer.check_finite = check_finite


GRADIENT_ACCUMULATION = Fix(
    name="gradient_accumulation_under_a_strategy",
    summary=(
        "gradient_accumulation_steps synchronises replicas inside both branches of a cond, and "
        "accumulates un-reduced local gradients."
    ),
    upstream="none found (keras-team/keras#19246's comments meet the same limit)",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        'an optimizer with gradient_accumulation_steps fails under a strategy with "`merge_call` '
        'called while defining a new graph".'
    ),
)


_ACCUMULATION_TARGETS = [
    OPTIMIZER.target("_backend_apply_gradients", ("self", "grads", "trainable_variables")),
    OPTIMIZER.target("_all_reduce_sum_gradients"),
    OPTIMIZER.target("_distributed_tf_update_step"),
    OPTIMIZER.target("_backend_reset_gradient_accumulators"),
    "keras.src.optimizers.base_optimizer:BaseOptimizer._clip_gradients",
    "keras.src.optimizers.base_optimizer:BaseOptimizer._use_weight_decay",
]


@GRADIENT_ACCUMULATION.variant("3.3", "3.10", targets=_ACCUMULATION_TARGETS)
def _gradient_accumulation_counting_iterations():
    # Keras 3.3-3.9: _backend_apply_gradients also counts the step (optimizer.iterations).
    _patch_gradient_accumulation(count_iteration=True)


@GRADIENT_ACCUMULATION.variant("3.10", targets=_ACCUMULATION_TARGETS)
def _gradient_accumulation():
    # Keras 3.10 on: BaseOptimizer.apply counts the step after _backend_apply_gradients.
    _patch_gradient_accumulation(count_iteration=False)


def _patch_gradient_accumulation(count_iteration: bool):
    # No upstream issue found; keras-team/keras#19246's comments meet the same limit.
    # BaseOptimizer._backend_apply_gradients (keras/src/optimizers/base_optimizer.py) chooses
    # between "update" and "accumulate" with ops.cond in replica context, and both branches
    # synchronise (all_reduce, merge_call): "`merge_call` called while defining a new graph or
    # a tf.function". It also accumulates un-reduced local gradients, so the replicas'
    # copies of a mirrored accumulator would diverge. The fix all-reduces the gradients first,
    # computes both candidates in replica context, and takes the branch in one merge_call,
    # where the branches only update variables. Without a strategy, or with EMA, unchanged.
    import tensorflow as tf
    from keras.src import backend

    cls = OPTIMIZER.get()
    original = cls._backend_apply_gradients

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = tf.distribute.get_replica_context()
        if (
            not self.gradient_accumulation_steps
            or self.use_ema
            or not tf.distribute.has_strategy()
            or context is None
        ):
            return original(self, grads, trainable_variables)
        steps = self.gradient_accumulation_steps
        # The step counter: `_iterations` from Keras 3.5 on (`iterations` is then the count
        # of updates), `iterations` itself before.
        counter = getattr(self, "_iterations", None)
        counter = self.iterations if counter is None else counter
        keras_vars = list(trainable_variables)
        tf_vars = [v.value if isinstance(v, backend.Variable) else v for v in keras_vars]
        accumulators = [
            self._accumulated_gradients[self._get_variable_index(v)] for v in keras_vars
        ]
        reduced = [g for g, _ in self._all_reduce_sum_gradients(list(zip(grads, tf_vars)))]
        accumulated = [g + tf.cast(a.value, g.dtype) for g, a in zip(reduced, accumulators)]
        updates = self._clip_gradients([a / steps for a in accumulated])
        learning_rate = self.learning_rate

        def merge_fn(distribution, accumulated, updates):
            def update():
                if self.weight_decay is not None:
                    for keras_var, var in zip(keras_vars, tf_vars):
                        if self._use_weight_decay(keras_var):
                            distribution.extended.update(
                                var,
                                lambda v: v.assign_sub(
                                    v
                                    * tf.cast(self.weight_decay, v.dtype)
                                    * tf.cast(learning_rate, v.dtype)
                                ),
                                group=False,
                            )
                self._distributed_tf_update_step(
                    distribution, list(zip(updates, tf_vars)), learning_rate
                )
                self._backend_reset_gradient_accumulators()
                return tf.constant(True)

            def accumulate():
                for accumulator, value in zip(accumulators, accumulated):
                    distribution.extended.update(
                        accumulator.value, lambda v, g: v.assign(g), args=(value,), group=False
                    )
                return tf.constant(False)

            is_update_step = tf.equal((counter.value + 1) % steps, 0)
            tf.cond(is_update_step, update, accumulate)

        context.merge_call(merge_fn, args=(accumulated, updates))
        if count_iteration:
            counter.assign_add(1)

    cls._backend_apply_gradients = _backend_apply_gradients
