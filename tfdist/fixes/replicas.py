"""Fixes for replicas of one model: the plain Keras 3 idiom under mirrored (and every strategy).

The symbolic build, gradient accumulation, per-replica random draws, XLA across local replicas,
an optimizer made outside the scope, and the mixed_float16 skip decided by all replicas. Each
is a `Fix` record (see tfdist/fixes/record.py): a no-op outside the strategies it concerns,
with a test that fails without it.

Nothing here imports TensorFlow or Keras at import time. May import: tfdist.fixes.record.
"""

from tfdist.fixes.record import Fix, Target


def _tf_trainer():
    from keras.src.backend.tensorflow import trainer

    return trainer


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
        Target("keras.src.backend.tensorflow.optimizer:TFOptimizer.build", ("self", "variables")),
    ],
)
def _fix_optimizer_outside_scope():
    # No upstream issue found. A Keras 3 TensorFlow optimizer binds the strategy that is
    # current when it is *constructed* (TFOptimizer.__init__, and its iterations variable is
    # created there too). One made outside strategy.scope() and used by a model built inside
    # fails deep in TensorFlow ("Mixing different tf.distribute.Strategy objects"); tf_keras
    # accepted it. tfdist turns that into an error that says what to move where.
    import tensorflow as tf
    from keras.src.backend.tensorflow import optimizer as tf_optimizer

    original = tf_optimizer.TFOptimizer.build

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

    tf_optimizer.TFOptimizer.build = build


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


SYMBOLIC_BUILD = Fix(
    name="symbolic_build_from_a_local_batch",
    summary=(
        "The trainer's symbolic build reduces the whole first distributed batch with MEAN just to"
        " learn its shapes."
    ),
    upstream="keras-team/keras#20585, tensorflow/tensorflow#72388, keras-team/keras#19246",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        'fit/evaluate/predict fail on multi_worker_mirrored ("Attempt to convert a value '
        '(PerReplica ...)"), on mirrored with batches that do not split over the replicas ("AddN '
        'must have the same size and shape"), and with string inputs.'
    ),
    absent_before=(
        "Keras before 3.5 builds the model when the step is traced, without the symbolic build"
    ),
)


_TRAINER = "keras.src.backend.tensorflow.trainer"
_BUILD_TARGETS = [
    Target(
        f"{_TRAINER}:TensorFlowTrainer._maybe_symbolic_build", ("self", "iterator", "data_batch")
    ),
    Target(f"{_TRAINER}:TensorFlowTrainer._symbolic_build", ("self",)),
    "keras.src.tree:map_structure",
]


def _patch_symbolic_build(batches_of):
    # keras-team/keras#20585, tensorflow/tensorflow#72388 (multi_worker_mirrored), and
    # keras-team/keras#19246 (mirrored, uneven batches). TensorFlowTrainer._maybe_symbolic_build
    # (keras/src/backend/tensorflow/trainer.py) peeks at the first distributed batch only to
    # learn shapes, but does so with strategy.reduce("MEAN", <whole batch>):
    #   multi_worker_mirrored: "Attempt to convert a value (PerReplica ...) to a Tensor";
    #   mirrored, batch not divisible by the replicas: "AddN must have the same size and shape";
    #   string inputs: "Value for attr 'T' of string is not in the list of allowed values".
    # The fix takes the first local replica's tensors: same shapes and dtypes, no collective.
    # `batches_of(epoch_iterator)` yields the per-step iterators, as that release's loop does.
    import tensorflow as tf
    from keras.src import tree

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return  # as upstream: no strategy, build lazily when tracing
        strategy = self.distribute_strategy
        if iterator is not None:
            for batches in batches_of(iterator):
                data_batch = tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(batches),
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    _tf_trainer().TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build


@SYMBOLIC_BUILD.variant(
    "3.5", "3.7", targets=[*_BUILD_TARGETS, f"{_TRAINER}:TFEpochIterator.enumerate_epoch"]
)
def _symbolic_build_enumerate_epoch():
    # Keras 3.5-3.6: `for step, iterator in epoch_iterator.enumerate_epoch()`.
    _patch_symbolic_build(lambda epoch: (it for _, it in epoch.enumerate_epoch()))


@SYMBOLIC_BUILD.variant(
    "3.7", "3.11", targets=[*_BUILD_TARGETS, f"{_TRAINER}:TFEpochIterator.__next__"]
)
def _symbolic_build_step_and_iterator():
    # Keras 3.7-3.10: iterating the epoch iterator yields (step, iterator).
    _patch_symbolic_build(lambda epoch: (it for _, it in epoch))


@SYMBOLIC_BUILD.variant("3.11", targets=[*_BUILD_TARGETS, f"{_TRAINER}:TFEpochIterator.__next__"])
def _symbolic_build_begin_end_iterator():
    # Keras 3.11 on: iterating the epoch iterator yields (begin_step, end_step, iterator).
    _patch_symbolic_build(lambda epoch: (it for _, _, it in epoch))


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


@GRADIENT_ACCUMULATION.variant(
    "3.3",
    targets=[
        Target(
            "keras.src.backend.tensorflow.optimizer:TFOptimizer._backend_apply_gradients",
            ("self", "grads", "trainable_variables"),
        ),
        "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients",
        "keras.src.backend.tensorflow.optimizer:TFOptimizer._distributed_tf_update_step",
        "keras.src.backend.tensorflow.optimizer:TFOptimizer._backend_reset_gradient_accumulators",
        "keras.src.optimizers.base_optimizer:BaseOptimizer._clip_gradients",
        "keras.src.optimizers.base_optimizer:BaseOptimizer._use_weight_decay",
    ],
)
def _fix_gradient_accumulation():
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
    from keras.src.backend.tensorflow import optimizer as tf_optimizer

    original = tf_optimizer.TFOptimizer._backend_apply_gradients

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

            is_update_step = tf.equal((self._iterations.value + 1) % steps, 0)
            tf.cond(is_update_step, update, accumulate)

        context.merge_call(merge_fn, args=(accumulated, updates))

    tf_optimizer.TFOptimizer._backend_apply_gradients = _backend_apply_gradients


PER_REPLICA_SEEDS = Fix(
    name="different_random_draws_per_replica",
    summary=(
        "Random layers draw from a mirrored seed, so every replica draws the same dropout mask."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence="every replica draws the same Dropout mask (no error; weaker regularisation).",
)


_SEED_TARGETS = [
    Target("keras.src.random.seed_generator:draw_seed", ("seed",)),
    Target("keras.src.backend.tensorflow.random:draw_seed", ("seed",)),
    "keras.src.random.seed_generator:SeedGenerator",
]


@PER_REPLICA_SEEDS.variant("3.3", "3.10", targets=_SEED_TARGETS)
def _per_replica_seeds_random():
    # Keras 3.3-3.9: the TensorFlow backend's random ops are the only users of draw_seed.
    _patch_draw_seed(image=False)


@PER_REPLICA_SEEDS.variant(
    "3.10",
    targets=[*_SEED_TARGETS, Target("keras.src.backend.tensorflow.image:draw_seed", ("seed",))],
)
def _per_replica_seeds_random_and_image():
    # Keras 3.10 on: random image ops (keras/src/backend/tensorflow/image.py) draw seeds too.
    _patch_draw_seed(image=True)


def _patch_draw_seed(image: bool):
    # No upstream issue found. Keras 3 draws dropout masks and other random values with
    # tf.random.stateless_* seeded from a SeedGenerator's state variable
    # (keras/src/random/seed_generator.py draw_seed); under a strategy that variable is
    # mirrored, so every replica draws the same mask (tf_keras drew per-device masks), which
    # silently weakens regularisation. The fix folds the replica id into the seed, in replica
    # context with more than one replica only: runs stay reproducible with
    # keras.utils.set_random_seed, explicit integer seeds and single-device runs are unchanged,
    # and initialisers (cross-replica context) still give every replica the same weights.
    import tensorflow as tf
    from keras.src.backend.tensorflow import random as tf_random
    from keras.src.random import seed_generator

    original = seed_generator.draw_seed

    def draw_seed(seed):
        drawn = original(seed)
        if seed is not None and not isinstance(seed, seed_generator.SeedGenerator):
            return drawn
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return drawn
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync <= 1:
            return drawn
        folded = tf.random.experimental.stateless_fold_in(
            tf.cast(drawn, tf.int64), tf.cast(context.replica_id_in_sync_group, tf.int64)
        )
        return tf.cast(folded, drawn.dtype)

    tf_random.draw_seed = draw_seed
    if image:
        from keras.src.backend.tensorflow import image as tf_image

        tf_image.draw_seed = draw_seed


NO_XLA_ACROSS_REPLICAS = Fix(
    name="no_xla_step_across_replicas",
    summary=(
        "jit_compile=True XLA-compiles the function that contains strategy.run, one cluster "
        "touching every local replica's variables."
    ),
    upstream="TensorFlow XLA known issue (a tf.Variable on another device)",
    strategies=("mirrored",),
    consequence=(
        'compile(jit_compile=True) with several local replicas fails with "Trying to access '
        'resource ... located in device CPU:1 from device CPU:0".'
    ),
    absent_before="Keras before 3.7 XLA-compiles the per-replica step only",
)


@NO_XLA_ACROSS_REPLICAS.variant(
    "3.7",
    targets=[
        Target(
            "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._make_function",
            ("self", "step_function"),
        ),
    ],
)
def _fix_jit_compile_across_replicas():
    # TensorFlow's XLA known issue "tf.Variable on a different device"; tf_keras fails the same
    # way on several local devices. TensorFlowTrainer._make_function
    # (keras/src/backend/tensorflow/trainer.py) XLA-compiles the function that *contains*
    # strategy.run, one cluster touching every replica's variables: "Trying to access resource
    # .../replica_1/... located in device CPU:1 from device CPU:0". With more than one local
    # replica, tfdist builds the train/test step without XLA and says so once.
    import warnings

    trainer = _tf_trainer()
    original = trainer.TensorFlowTrainer._make_function

    def _make_function(self, step_function):
        strategy = self._distribute_strategy
        if (
            strategy is None
            or not self.jit_compile
            or len(getattr(strategy.extended, "worker_devices", ())) <= 1
        ):
            return original(self, step_function)
        warnings.warn(
            "jit_compile=True cannot compile a training step that spans several local replicas "
            f"({strategy.num_replicas_in_sync} here): XLA would place every replica's variables "
            "on one device. tfdist runs the step without XLA. HINT: compile(jit_compile=False) "
            "silences this; XLA works with one replica per process (multi_worker_mirrored).",
            stacklevel=2,
        )
        saved, self._jit_compile = self._jit_compile, False
        try:
            return original(self, step_function)
        finally:
            self._jit_compile = saved

    trainer.TensorFlowTrainer._make_function = _make_function


FIXES = (
    OPTIMIZER_OUTSIDE_SCOPE,
    LOSS_SCALE_SKIP,
    SYMBOLIC_BUILD,
    GRADIENT_ACCUMULATION,
    PER_REPLICA_SEEDS,
    NO_XLA_ACROSS_REPLICAS,
)
