"""The one home of TensorFlow / Keras version gates and of the Keras flavour.

tfdist supports Keras 3 (the default Keras since TensorFlow 2.16) and tf_keras (the legacy
Keras 2, selected by TensorFlow when TF_USE_LEGACY_KERAS=1). Every other module asks this one
which Keras is in use, instead of testing versions itself.

Nothing here imports TensorFlow at import time.
"""

from __future__ import annotations

import functools
import os
from typing import Mapping, Optional

MIN_TENSORFLOW = (2, 16)

_TRUE = ("1", "true", "yes", "on")


def uses_legacy_keras(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when TF_USE_LEGACY_KERAS selects tf_keras (how TensorFlow itself decides)."""
    env = os.environ if env is None else env
    return env.get("TF_USE_LEGACY_KERAS", "").strip().lower() in _TRUE


def keras_flavour() -> str:
    """"tf_keras" (legacy Keras 2) or "keras3"."""
    return "tf_keras" if uses_legacy_keras() else "keras3"


@functools.lru_cache(maxsize=None)
def keras():
    """Returns the Keras module TensorFlow uses in this process (keras or tf_keras)."""
    if uses_legacy_keras():
        try:
            import tf_keras
        except ImportError:
            raise ImportError(
                "TF_USE_LEGACY_KERAS=1 selects tf_keras, which is not installed. HINT: "
                "pip install 'tfdist[legacy]' (or pip install tf_keras), or unset "
                "TF_USE_LEGACY_KERAS to use Keras 3."
            ) from None
        return tf_keras
    import keras as keras3

    return keras3


def _version_tuple(text: str) -> tuple:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def versions() -> dict:
    """TensorFlow / Keras versions and the Keras flavour, for reports."""
    import tensorflow as tf

    return {
        "tensorflow": tf.__version__,
        "keras": keras().__version__,
        "keras_flavour": keras_flavour(),
    }


def check_tensorflow() -> None:
    """Raises ImportError when TensorFlow is older than tfdist supports."""
    import tensorflow as tf

    if _version_tuple(tf.__version__)[:2] < MIN_TENSORFLOW:
        raise ImportError(
            f"tfdist needs TensorFlow >= {'.'.join(map(str, MIN_TENSORFLOW))}. Found: "
            f"{tf.__version__}. HINT: pip install -U 'tensorflow>=2.16'."
        )


_QUIET_PROGRESS = []  # the CallbackList class made quiet, once per process


def quiet_progress_off_the_chief(is_chief: bool, env: Optional[Mapping[str, str]] = None) -> bool:
    """Keras progress bars on the chief only, in a task of a multi-worker job.

    Every worker of a multi-worker job runs the same `fit`, and each would draw the same
    progress bar (`tfdist launch` shows them all). In a task that is not the chief, Keras'
    own `CallbackList` (Keras 3 or tf_keras) then adds no progress bar; a ProgbarLogger the
    script passes itself is kept. TFDIST_PROGRESS=all shows them on every task. Returns True
    when this process's bars are off.
    """
    env = os.environ if env is None else env
    if is_chief or env.get("TFDIST_PROGRESS", "").strip().lower() == "all":
        return False
    callback_list = keras().callbacks.CallbackList
    if callback_list in _QUIET_PROGRESS:
        return True
    original = callback_list.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        kwargs["add_progbar"] = False  # Keras' fit, evaluate and predict pass it by keyword
        original(self, *args, **kwargs)

    callback_list.__init__ = __init__
    _QUIET_PROGRESS.append(callback_list)
    return True


# =============================================================================================
# Fixes of Keras 3 internals under tf.distribute.
#
# Each fix is a function registered with @keras_fix: it patches one Keras 3 internal at the
# right depth, is a no-op outside the strategies it concerns (single-device Keras behaviour is
# never changed), names its upstream issue in a comment, and has a test that fails without it
# (tests run with TFDIST_KERAS_FIXES=0 to show the upstream failure).
# `apply_keras_fixes()` is called by `tfdist.make_strategy`; users call nothing else.
# Opt out: TFDIST_KERAS_FIXES=0 (all), or a comma list of "-name" to skip single fixes.
# =============================================================================================

_FIXES: dict = {}
_APPLIED: set = set()
# Keras 3 releases whose internals the fixes were written against and tested with.
KERAS_FIXES_TESTED = ((3, 10), (3, 15))


def keras_fix(name: str):
    """Registers a fix of Keras 3 internals, applied once by `apply_keras_fixes`."""

    def register(function):
        _FIXES[name] = function
        return function

    return register


def keras_fixes_enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if env is None else env
    return env.get("TFDIST_KERAS_FIXES", "1").strip().lower() not in ("0", "false", "no", "off")


def _skipped_fixes(env: Optional[Mapping[str, str]] = None) -> set:
    """Fixes named "-name" in TFDIST_KERAS_FIXES (e.g. "-no_xla_step_across_replicas")."""
    env = os.environ if env is None else env
    names = {part.strip()[1:] for part in env.get("TFDIST_KERAS_FIXES", "").split(",")
             if part.strip().startswith("-")}
    unknown = names - set(_FIXES)
    if unknown:
        raise ValueError(
            f"TFDIST_KERAS_FIXES names unknown fix(es) {sorted(unknown)}. Known: "
            f"{', '.join(_FIXES)}.")
    return names


def apply_keras_fixes() -> list:
    """Applies every registered fix once (Keras 3 only). Returns the names applied so far.

    A no-op under tf_keras, or with TFDIST_KERAS_FIXES=0. Fixes listed as "-name" in
    TFDIST_KERAS_FIXES are skipped.
    """
    if uses_legacy_keras() or not keras_fixes_enabled():
        return sorted(_APPLIED)
    version = _version_tuple(keras().__version__)[:2]
    if not KERAS_FIXES_TESTED[0] <= version <= KERAS_FIXES_TESTED[1]:
        import warnings

        warnings.warn(
            f"tfdist's Keras fixes were tested with Keras {KERAS_FIXES_TESTED[0]} to "
            f"{KERAS_FIXES_TESTED[1]}; this is Keras {keras().__version__}. They are applied, "
            "but report problems (TFDIST_KERAS_FIXES=0 turns them off).", stacklevel=2)
    skipped = _skipped_fixes()
    for name, function in _FIXES.items():
        if name not in _APPLIED and name not in skipped:
            function()
            _APPLIED.add(name)
    return sorted(_APPLIED)


# --------------------------------------------------- mirrored and multi_worker_mirrored fixes


def _tf_trainer():
    from keras.src.backend.tensorflow import trainer

    return trainer


def _multi_worker_role(model):
    """(is_chief, task_id) when `model` trains under a multi-worker strategy, else None."""
    strategy = getattr(model, "_distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    in_multi_worker = getattr(extended, "_in_multi_worker_mode", None)
    if in_multi_worker is None or not in_multi_worker():
        return None
    resolver = getattr(strategy, "cluster_resolver", None)
    return bool(extended.should_checkpoint), getattr(resolver, "task_id", 0) or 0


@keras_fix("optimizer_made_outside_the_scope")
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
                "keras.optimizers.Adam(...), ...)` (or pass the name, optimizer='adam').")
        return original(self, variables)

    tf_optimizer.TFOptimizer.build = build


@keras_fix("loss_scale_skip_agreed_by_all_replicas")
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
        if (context is None or not tf.distribute.has_strategy()
                or context.num_replicas_in_sync <= 1):
            return finite
        overflowed = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                        tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(overflowed, 0.0)

    loss_scale_optimizer.LossScaleOptimizer.check_finite = check_finite


@keras_fix("symbolic_build_from_a_local_batch")
def _fix_symbolic_build():
    # keras-team/keras#20585, tensorflow/tensorflow#72388 (multi_worker_mirrored), and
    # keras-team/keras#19246 (mirrored, uneven batches). TensorFlowTrainer._maybe_symbolic_build
    # (keras/src/backend/tensorflow/trainer.py) peeks at the first distributed batch only to
    # learn shapes, but does so with strategy.reduce("MEAN", <whole batch>):
    #   multi_worker_mirrored: "Attempt to convert a value (PerReplica ...) to a Tensor";
    #   mirrored, batch not divisible by the replicas: "AddN must have the same size and shape";
    #   string inputs: "Value for attr 'T' of string is not in the list of allowed values".
    # The fix takes the first local replica's tensors: same shapes and dtypes, no collective.
    import tensorflow as tf
    from keras.src import tree

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return  # as upstream: no strategy, build lazily when tracing
        strategy = self.distribute_strategy
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tree.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v,
                    next(batches))
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    _tf_trainer().TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build


@keras_fix("multi_worker_mean_of_metric_results")
def _fix_reduce_per_replica():
    # keras-team/keras#20585 (the second failure once the first is fixed). reduce_per_replica
    # (keras/src/backend/tensorflow/trainer.py) averages the per-replica step logs under
    # multi_worker_mirrored with strategy.reduce("MEAN", v, axis=0), but the logs are scalars:
    # "Invalid reduction dimension 0 for input with 0 dimensions". The element-wise mean over
    # all replicas of all workers is strategy.reduce("MEAN", v, axis=None). Other strategies
    # and reductions go to the original function.
    from keras.src import tree

    trainer = _tf_trainer()
    original = trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(
                strategy):
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica  # looked up when the step is traced


@keras_fix("gradient_accumulation_under_a_strategy")
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
        if (not self.gradient_accumulation_steps or self.use_ema
                or not tf.distribute.has_strategy() or context is None):
            return original(self, grads, trainable_variables)
        steps = self.gradient_accumulation_steps
        keras_vars = list(trainable_variables)
        tf_vars = [v.value if isinstance(v, backend.Variable) else v for v in keras_vars]
        accumulators = [self._accumulated_gradients[self._get_variable_index(v)]
                        for v in keras_vars]
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
                                var, lambda v: v.assign_sub(
                                    v * tf.cast(self.weight_decay, v.dtype)
                                    * tf.cast(learning_rate, v.dtype)), group=False)
                self._distributed_tf_update_step(
                    distribution, list(zip(updates, tf_vars)), learning_rate)
                self._backend_reset_gradient_accumulators()
                return tf.constant(True)

            def accumulate():
                for accumulator, value in zip(accumulators, accumulated):
                    distribution.extended.update(
                        accumulator.value, lambda v, g: v.assign(g), args=(value,), group=False)
                return tf.constant(False)

            is_update_step = tf.equal((self._iterations.value + 1) % steps, 0)
            tf.cond(is_update_step, update, accumulate)

        context.merge_call(merge_fn, args=(accumulated, updates))

    tf_optimizer.TFOptimizer._backend_apply_gradients = _backend_apply_gradients


@keras_fix("different_random_draws_per_replica")
def _fix_per_replica_seeds():
    # No upstream issue found. Keras 3 draws dropout masks and other random values with
    # tf.random.stateless_* seeded from a SeedGenerator's state variable
    # (keras/src/random/seed_generator.py draw_seed); under a strategy that variable is
    # mirrored, so every replica draws the same mask (tf_keras drew per-device masks), which
    # silently weakens regularisation. The fix folds the replica id into the seed, in replica
    # context with more than one replica only: runs stay reproducible with
    # keras.utils.set_random_seed, explicit integer seeds and single-device runs are unchanged,
    # and initialisers (cross-replica context) still give every replica the same weights.
    import tensorflow as tf
    from keras.src.backend.tensorflow import image as tf_image
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
            tf.cast(drawn, tf.int64), tf.cast(context.replica_id_in_sync_group, tf.int64))
        return tf.cast(folded, drawn.dtype)

    tf_random.draw_seed = draw_seed
    tf_image.draw_seed = draw_seed


@keras_fix("no_xla_step_across_replicas")
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
        if (strategy is None or not self.jit_compile
                or len(getattr(strategy.extended, "worker_devices", ())) <= 1):
            return original(self, step_function)
        warnings.warn(
            "jit_compile=True cannot compile a training step that spans several local replicas "
            f"({strategy.num_replicas_in_sync} here): XLA would place every replica's variables "
            "on one device. tfdist runs the step without XLA. HINT: compile(jit_compile=False) "
            "silences this; XLA works with one replica per process (multi_worker_mirrored).",
            stacklevel=2)
        saved, self._jit_compile = self._jit_compile, False
        try:
            return original(self, step_function)
        finally:
            self._jit_compile = saved

    trainer.TensorFlowTrainer._make_function = _make_function


@keras_fix("multi_worker_steps_per_execution")
def _fix_multi_worker_steps_per_execution():
    # keras-team/keras#19246 ("You must feed a value for placeholder tensor"). With
    # steps_per_execution > 1, TensorFlowTrainer._make_function
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
    # upstream.)
    import tensorflow as tf

    trainer = _tf_trainer()
    original = trainer.TensorFlowTrainer._make_function

    def _make_function(self, step_function):
        strategy = self._distribute_strategy
        if (strategy is None or self.run_eagerly or self.steps_per_execution == 1
                or not trainer._collective_all_reduce_multi_worker(strategy)):
            return original(self, step_function)
        steps = self.steps_per_execution
        fallback = original(self, step_function)

        reduce_once = len(strategy.extended.worker_devices) == 1

        def reduce(outputs):
            return trainer.reduce_per_replica(outputs, strategy, reduction="auto")

        def local_step(data):  # deliberately not a tf.function: see above
            outputs = strategy.run(step_function, args=(data,))  # this worker's logs
            return outputs if reduce_once else reduce(outputs)

        local_step = self._autoconvert_optionals(local_step)

        @tf.function(reduce_retracing=True)
        def multi_step(iterator):
            outputs = local_step(iterator.get_next())  # OutOfRange ends the epoch, as upstream

            def keep_going(step, outputs, exhausted):
                return tf.logical_and(step < steps, tf.logical_not(exhausted))

            def body(step, outputs, exhausted):
                optional = iterator.get_next_as_optional()
                outputs, exhausted = tf.cond(
                    optional.has_value(),
                    lambda: (local_step(optional.get_value()), tf.constant(False)),
                    lambda: (outputs, tf.constant(True)))
                return step + 1, outputs, exhausted

            _, outputs, _ = tf.while_loop(
                keep_going, body, [tf.constant(1), outputs, tf.constant(False)])
            return reduce(outputs) if reduce_once else outputs

        def function(iterator):
            if isinstance(iterator, tf.distribute.DistributedIterator):
                return multi_step(iterator)
            return fallback(iterator)

        return function

    trainer.TensorFlowTrainer._make_function = _make_function


@keras_fix("multi_worker_checkpoint_callbacks")
def _fix_multi_worker_checkpoints():
    # keras-team/keras#20585 (multi-worker support in general); tf_keras handled this in
    # distribute/distributed_file_utils.py and worker_training_state.py. Keras 3's
    # ModelCheckpoint._save_model and BackupAndRestore._save_model / on_train_end
    # (keras/src/callbacks/) let every worker write and delete the same paths: "BlockingIOError:
    # Unable to synchronously create file (unable to lock file)", "FileExistsError: ... backup",
    # then the peers' collectives abort. As in tf_keras: every worker still saves (saving may
    # read distributed variables collectively), non-chief workers into a private temporary
    # directory removed right after (not inside the chief's directory, which the chief may
    # delete while a slower peer still writes); only the chief writes the real path and
    # deletes the backup at the end. All workers restore from the chief's backup (a shared
    # filesystem, as in tf_keras).
    import shutil
    import tempfile

    from keras.src.callbacks import backup_and_restore, model_checkpoint

    def temp_dir(task_id):
        return tempfile.mkdtemp(prefix=f"tfdist-worker{task_id}-")

    checkpoint_cls = model_checkpoint.ModelCheckpoint
    original_path, original_save = checkpoint_cls._get_file_path, checkpoint_cls._save_model

    def _get_file_path(self, epoch, batch, logs):
        path = original_path(self, epoch, batch, logs)
        role = _multi_worker_role(self.model)
        if role is None or role[0]:
            return path
        directory = temp_dir(role[1])
        self._tfdist_temp_dir = directory
        return os.path.join(directory, os.path.basename(path))

    def _save_model(self, epoch, batch, logs):
        try:
            return original_save(self, epoch, batch, logs)
        finally:
            directory = getattr(self, "_tfdist_temp_dir", None)
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
                self._tfdist_temp_dir = None

    checkpoint_cls._get_file_path, checkpoint_cls._save_model = _get_file_path, _save_model

    backup_cls = backup_and_restore.BackupAndRestore
    original_backup, original_end = backup_cls._save_model, backup_cls.on_train_end
    paths = ("_weights_path", "_training_metadata_path", "_prev_weights_path",
             "_prev_training_metadata_path")

    def save_backup(self):
        role = _multi_worker_role(self.model)
        if role is None:
            return original_backup(self)
        if role[0]:
            os.makedirs(self.backup_dir, exist_ok=True)  # before peers can race for it
            return original_backup(self)
        saved = {name: getattr(self, name) for name in ("backup_dir",) + paths}
        directory = temp_dir(role[1])
        try:
            self.backup_dir = directory
            for name in paths:
                setattr(self, name, os.path.join(directory, os.path.basename(saved[name])))
            return original_backup(self)
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
            shutil.rmtree(directory, ignore_errors=True)

    def on_train_end(self, logs=None):
        role = _multi_worker_role(self.model)
        if role is not None and not role[0]:
            return  # only the chief removes the shared backup
        return original_end(self, logs)

    backup_cls._save_model, backup_cls.on_train_end = save_backup, on_train_end



# ------------------------------------------------------------------ parameter_server fixes


def _ps_value_types() -> tuple:
    """The tf.Variable types a Keras variable wraps when it lives on a parameter server."""
    import tensorflow as tf
    from tensorflow.python.distribute import ps_values

    return (ps_values.CachingVariable, ps_values.AggregatingVariable,
            tf.__internal__.distribute.ShardedVariable)


@keras_fix("parameter_server_atomic_assign_add")
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
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow.core import Variable

    ps_types = _ps_value_types()
    original_add, original_sub = Variable.assign_add, Variable.assign_sub

    def on_ps(variable) -> bool:
        return isinstance(variable._value, ps_types) and not in_stateless_scope()

    def _cast(variable, value):
        import tensorflow as tf

        return tf.cast(variable._convert_to_tensor(value, dtype=variable._dtype),
                       variable._value.dtype)

    def assign_add(self, value):
        if not on_ps(self):
            return original_add(self, value)
        return self._value.assign_add(_cast(self, value))

    def assign_sub(self, value):
        if not on_ps(self):
            return original_sub(self, value)
        return self._value.assign_sub(_cast(self, value))

    Variable.assign_add, Variable.assign_sub = assign_add, assign_sub


@keras_fix("parameter_server_fit_evaluate_predict")
def _fix_ps_fit_evaluate_predict():
    # keras-team/keras#18624: Keras 3's fit / evaluate / predict have no ParameterServerStrategy
    # support. A model built in a ps strategy's scope fails on its first batch with "To use
    # this dataset, you need to pass this dataset to
    # ClusterCoordinator.create_per_worker_dataset" (tf_keras trains it natively). The fix
    # sends fit and evaluate of such a model to tfdist's ClusterCoordinator loop
    # (tfdist._coordinator.keras_fit / keras_evaluate, Keras' own arguments), and runs
    # predict on the coordinator itself, outside the strategy (each batch reads the variables
    # from the ps tasks), as tf_keras does for predict. Other strategies: unchanged.
    import inspect

    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib

    cls = _tf_trainer().TensorFlowTrainer
    original = {name: getattr(cls, name) for name in ("fit", "evaluate", "predict")}

    def on_ps(model) -> bool:
        return isinstance(getattr(model, "_distribute_strategy", None),
                          tf.distribute.ParameterServerStrategy)

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
            from tfdist import _coordinator

            return getattr(_coordinator, to)(self, **arguments)

        return method

    @functools.wraps(original["predict"])
    def predict(self, *args, **kwargs):
        if not on_ps(self):
            return original["predict"](self, *args, **kwargs)
        if tf.distribute.has_strategy():
            raise RuntimeError(
                "model.predict of a parameter-server model runs on the coordinator, outside "
                "the strategy, but was called inside `strategy.scope()`. HINT: call it after "
                "the `with strategy.scope():` block.")
        strategy, self._distribute_strategy = (self._distribute_strategy,
                                               distribute_lib._get_default_strategy())
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
        from keras.src import backend
        from keras.src.backend.common import global_state

        scope = global_state.get_global_attribute("stateless_scope")
        global_state.set_global_attribute("stateless_scope", None)
        try:
            shards = [backend.Variable(initializer=shard, trainable=variable.trainable,
                                       name=f"{variable.name}_shard_{i}")
                      for i, shard in enumerate(variable._value.variables)]
        finally:
            global_state.set_global_attribute("stateless_scope", scope)
        for shard in shards:
            # Elementwise regularizers (l1, l2) and constraints add up / apply per shard.
            shard.regularizer, shard.constraint = variable.regularizer, variable.constraint
            shard._tfdist_sharded_parent = variable
        variable._tfdist_shards = shards
    return shards


@keras_fix("parameter_server_sharded_trainable_variables")
def _fix_ps_sharded_trainable_variables():
    # With a variable_partitioner, ParameterServerStrategy makes a ShardedVariable for a large
    # weight (an Embedding table) and Keras 3 wraps it in one Keras variable
    # (keras/src/backend/tensorflow/core.py: Variable._initialize). Keras 3 knows nothing of
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


@keras_fix("parameter_server_sharded_checkpoint")
def _fix_ps_sharded_checkpoint():
    # tf.train.Checkpoint of a Keras 3 model with a sharded weight fails in
    # tensorflow/python/checkpoint/functional_saver.py MultiDeviceSaver.__init__ with
    # "'ShardedVariable' object has no attribute 'device'": Keras 3's
    # Variable._serialize_to_tensors (keras/src/backend/tensorflow/core.py) falls back to
    # {"VARIABLE_VALUE": <ShardedVariable>} because ShardedVariable only has the legacy
    # saveables API. The fix saves the whole logical tensor (the shards concatenated), the same
    # entry an unsharded variable writes, and restores by assigning it to the ShardedVariable
    # (which splits it by shard). Checkpoints are then interchangeable between models with any
    # number of ps tasks, or none. Keras weight files fail the same way (Variable.__array__,
    # keras/src/backend/common/variables.py: "'ShardedVariable' object has no attribute
    # '__array__'") and get the same whole tensor. Only for sharded variables.
    import numpy as np
    import tensorflow as tf
    from keras.src.backend.tensorflow.core import Variable

    sharded = _ps_value_types()[-1]
    original_save, original_restore = Variable._serialize_to_tensors, Variable._restore_from_tensors
    original_array = Variable.__array__

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

    Variable._serialize_to_tensors = _serialize_to_tensors
    Variable._restore_from_tensors = _restore_from_tensors
    Variable.__array__ = __array__
