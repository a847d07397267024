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


def _under_mirrored() -> bool:
    """True under mirrored or multi_worker_mirrored (whose extended subclasses mirrored's)."""
    import tensorflow as tf
    from tensorflow.python.distribute import mirrored_strategy

    return tf.distribute.has_strategy() and isinstance(
        tf.distribute.get_strategy().extended, mirrored_strategy.MirroredExtended
    )


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
        Target(
            "keras.src.backend.tensorflow.optimizer:TFOptimizer._backend_update_step",
            ("self", "grads", "trainable_variables", "learning_rate"),
        ),
        Target(
            "keras.src.backend.tensorflow.optimizer:TFOptimizer._distributed_tf_update_step",
            ("self", "distribution", "grads_and_vars", "learning_rate"),
        ),
        Target(
            "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients",
            ("self", "grads_and_vars"),
        ),
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
    from keras.src.backend.tensorflow import optimizer as tf_optimizer

    cls = tf_optimizer.TFOptimizer
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

_CORE = "keras.src.backend.tensorflow.core"


@METRICS_SUMMED.variant(
    "3.3", "3.5", targets=[Target(f"{_CORE}:Variable._initialize", ("self", "value"))]
)
def _metrics_summed_initialize():
    _patch_metric_variables(("_initialize",))


@METRICS_SUMMED.variant(
    "3.5",
    targets=[
        Target(f"{_CORE}:Variable._initialize", ("self", "value")),
        Target(f"{_CORE}:Variable._initialize_with_initializer", ("self", "initializer")),
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
    from keras.src.backend.tensorflow import core

    cls = core.Variable

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
        Target(f"{_TRAINER}:TensorFlowTrainer.train_step", ("self", "data")),
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

    cls = _tf_trainer().TensorFlowTrainer
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
    Target(
        "keras.src.backend.tensorflow.optimizer:TFOptimizer._backend_apply_gradients",
        ("self", "grads", "trainable_variables"),
    ),
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients",
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._distributed_tf_update_step",
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._backend_reset_gradient_accumulators",
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
)


def _without_xla_across_replicas(original):
    # TensorFlow's XLA known issue "tf.Variable on a different device"; tf_keras fails the same
    # way on several local devices. Keras XLA-compiles a function that touches every local
    # replica's variables: "Trying to access resource .../replica_1/... located in device CPU:1
    # from device CPU:0". With more than one local replica, tfdist builds the step without XLA
    # and says so once. Returns `original` (a method building a step function) wrapped.
    import functools
    import warnings

    @functools.wraps(original)
    def build(self, *args, **kwargs):
        strategy = self._distribute_strategy
        if (
            strategy is None
            or not self.jit_compile
            or len(getattr(strategy.extended, "worker_devices", ())) <= 1
        ):
            return original(self, *args, **kwargs)
        warnings.warn(
            "jit_compile=True cannot compile a training step that spans several local replicas "
            f"({strategy.num_replicas_in_sync} here): XLA would place every replica's variables "
            "on one device. tfdist runs the step without XLA. HINT: compile(jit_compile=False) "
            "silences this; XLA works with one replica per process (multi_worker_mirrored).",
            stacklevel=2,
        )
        saved, self._jit_compile = self._jit_compile, False
        try:
            return original(self, *args, **kwargs)
        finally:
            self._jit_compile = saved

    return build


_MAKE_FUNCTIONS = ("make_train_function", "make_test_function", "make_predict_function")


@NO_XLA_ACROSS_REPLICAS.variant(
    "3.3",
    "3.7",
    targets=[
        Target(f"{_TRAINER}:TensorFlowTrainer.{name}", ("self", "force"))
        for name in _MAKE_FUNCTIONS
    ],
)
def _no_xla_in_make_functions():
    # Keras 3.3-3.6: make_train/test/predict_function jit-compile the per-replica step itself.
    cls = _tf_trainer().TensorFlowTrainer
    for name in _MAKE_FUNCTIONS:
        setattr(cls, name, _without_xla_across_replicas(getattr(cls, name)))


@NO_XLA_ACROSS_REPLICAS.variant(
    "3.7",
    targets=[Target(f"{_TRAINER}:TensorFlowTrainer._make_function", ("self", "step_function"))],
)
def _no_xla_in_make_function():
    # Keras 3.7 on: TensorFlowTrainer._make_function compiles the function that *contains*
    # strategy.run, one XLA cluster for every replica.
    cls = _tf_trainer().TensorFlowTrainer
    cls._make_function = _without_xla_across_replicas(cls._make_function)


FIXES = (
    GRADIENTS_SUMMED,
    METRICS_SUMMED,
    LOSS_SCALED_FOR_REPLICAS,
    OPTIMIZER_OUTSIDE_SCOPE,
    LOSS_SCALE_SKIP,
    SYMBOLIC_BUILD,
    GRADIENT_ACCUMULATION,
    PER_REPLICA_SEEDS,
    NO_XLA_ACROSS_REPLICAS,
)
