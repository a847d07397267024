"""Steps per execution chosen by tfdist: fit and evaluate at the speed of a custom loop.

Keras runs one training step per call of its train function unless `compile` says otherwise.
Under a strategy each call has a fixed price: Python's dispatch of a `tf.function`, the step's
logs averaged over the replicas (between processes, an all-reduce), the loop's callbacks. For
a small model that price is as large as the step itself. Where no callback reads the logs of
each step, tfdist runs several steps per call, as `compile(steps_per_execution=...)` would:
the same steps, the same weights and the same epoch logs.

Nothing here imports TensorFlow or Keras at import time.
"""

import contextlib
import functools
import inspect
import math

from tfdist import flavour
from tfdist.fixes import multi_worker
from tfdist.fixes.keras_trainer import TF_TRAINER
from tfdist.fixes.record import Fix, Target

# The most steps per call tfdist chooses: enough to spread the call's fixed cost over many
# steps, few enough that a progress bar and a preemption notice still come within a moment.
MAX_STEPS_PER_EXECUTION = 16
# A callback that takes some steps per call and not others says so with a method of this name,
# `(k) -> bool` (tfdist.BackupAndRestore: a backup taken inside an epoch resumes on a call
# boundary); its batch hooks then do not make the choice 1.
ACCEPTS_STEPS_PER_CALL = "_tfdist_accepts_steps_per_call"
_BATCH_HOOKS = {
    "fit": (
        "on_batch_begin",
        "on_batch_end",
        "on_train_batch_begin",
        "on_train_batch_end",
        "on_test_batch_begin",
        "on_test_batch_end",
    ),
    "evaluate": ("on_test_batch_begin", "on_test_batch_end"),
}

STEPS_PER_EXECUTION = Fix(
    name="steps_per_execution_chosen",
    summary=(
        "fit and evaluate call the train function once per step unless compile says "
        "otherwise, and under a strategy each call costs about as much as a small model's step "
        "(dispatch, an all-reduce of the logs, the loop)."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "fit and evaluate of a small model run at half the speed of a hand-written loop or "
        "less (benchmarks/bench_fit_step.py); results are the same."
    ),
    absent_before="Keras before 3.7 unrolls steps_per_execution in Python, which tfdist leaves",
)


def choose(steps, callbacks, kind: str) -> int:
    """The steps per call for a fit or evaluate of `steps` steps (None: until the data ends).

    1 when a callback (other than Keras' progress bar and history, and checkpoints saved once
    an epoch) reads the logs of each step; else the largest divisor of `steps` up to
    MAX_STEPS_PER_EXECUTION that every callback accepts, so that no call runs past the steps
    asked for (with no steps given, the data's end stops a call early).
    """
    listed = _listed(callbacks)
    if any(_reads_every_step(callback, kind) for callback in listed):
        return 1
    if isinstance(steps, (list, tuple)):  # fit: the epoch's and validation's steps
        known = [int(s) for s in steps if s]  # (0 means "until the data ends" to Keras too)
        steps = functools.reduce(math.gcd, known) if known else None
    if not steps or int(steps) < 1:
        steps = math.lcm(*range(1, MAX_STEPS_PER_EXECUTION + 1))  # every k divides it
    steps = int(steps)
    accepting = [c for c in listed if hasattr(c, ACCEPTS_STEPS_PER_CALL)]
    for k in range(min(steps, MAX_STEPS_PER_EXECUTION), 1, -1):
        if steps % k == 0 and all(getattr(c, ACCEPTS_STEPS_PER_CALL)(k) for c in accepting):
            return k
    return 1


def _listed(callbacks) -> list:
    if callbacks is None:
        return []
    inner = getattr(callbacks, "callbacks", None)  # a keras.callbacks.CallbackList
    return list(inner if inner is not None else callbacks)


def _reads_every_step(callback, kind: str) -> bool:
    if hasattr(callback, ACCEPTS_STEPS_PER_CALL):
        return False  # it says which steps per call it takes (choose asks it)
    if flavour.uses_legacy_keras():
        return _tf_keras_reads_every_step(callback, kind)
    from keras import callbacks as keras_callbacks

    if isinstance(callback, (keras_callbacks.ProgbarLogger, keras_callbacks.History)):
        return False  # Keras updates the bar per call; History keeps epoch logs
    hooks = [hook for hook in _BATCH_HOOKS[kind] if _overridden(getattr(callback, hook, None))]
    if hooks and _saves_once_an_epoch(callback, hooks, keras_callbacks):
        return False
    return bool(hooks)


def _tf_keras_reads_every_step(callback, kind: str) -> bool:
    """tf_keras' own rule: a callback says whether it implements batch hooks (its
    ModelCheckpoint does not with save_freq="epoch")."""
    from tf_keras import callbacks as legacy_callbacks

    if isinstance(callback, (legacy_callbacks.ProgbarLogger, legacy_callbacks.History)):
        return False
    asks = ("_implements_test_batch_hooks",)
    if kind == "fit":
        asks += ("_implements_train_batch_hooks",)
    return any(getattr(callback, ask, lambda: True)() for ask in asks)


def _saves_once_an_epoch(callback, hooks, keras_callbacks) -> bool:
    """Keras' ModelCheckpoint or BackupAndRestore with save_freq="epoch", whose batch `hooks`
    are all Keras' own (its on_train_batch_end does nothing at that frequency)."""
    for saver in (keras_callbacks.ModelCheckpoint, keras_callbacks.BackupAndRestore):
        if isinstance(callback, saver) and getattr(callback, "save_freq", None) == "epoch":
            return all(
                hook not in vars(callback)
                and getattr(type(callback), hook) is getattr(saver, hook, None)
                for hook in hooks
            )
    return False


def _overridden(method) -> bool:
    """A hook of the callback's own (its class's, or set on it, as LambdaCallback does), not
    keras.callbacks.Callback's do-nothing one (which Keras marks `_is_default`)."""
    function = getattr(method, "__func__", method)
    return function is not None and not getattr(function, "_is_default", False)


def _agreed(strategy, k: int) -> int:
    """`k` when every worker chose it, else 1 (a worker's callbacks may differ from another's,
    as a callback on the chief only does): every worker then runs the same collectives."""
    if strategy.num_replicas_in_sync <= len(strategy.extended.worker_devices):
        return k  # one process: nothing to agree
    import tensorflow as tf

    # Each replica gives (k, k*k): the choices are all equal exactly when
    # n * sum(k*k) == sum(k)**2 (Cauchy-Schwarz), with n replicas.
    choice = tf.constant([float(k), float(k * k)], tf.float64)
    total, squares = strategy.reduce("SUM", strategy.run(lambda: choice), axis=None).numpy()
    return k if strategy.num_replicas_in_sync * squares == total * total else 1


@contextlib.contextmanager
def _executing(model, k: int):
    """Runs the block with model.steps_per_execution = k, and the train and test functions
    traced for k (kept on the model for the next call, until the model is compiled again)."""
    token = (model.optimizer, getattr(model, "_compile_loss", None), model.jit_compile)
    # (in __dict__: Keras tracks what is set as an attribute of a model)
    cache = model.__dict__.get("_tfdist_functions")
    if cache is None or any(a is not b for a, b in zip(cache["token"], token)):
        cache = model.__dict__["_tfdist_functions"] = {"token": token}
    own_k, own = model.steps_per_execution, (model.train_function, model.test_function)
    model.steps_per_execution = k
    model.train_function, model.test_function = cache.get(k, (None, None))
    try:
        yield
    finally:
        cache[k] = (model.train_function, model.test_function)
        model.steps_per_execution = own_k
        model.train_function, model.test_function = own


def _steps_of(kind: str, arguments: dict):
    """The steps a fit or evaluate asks for (None: until the data ends); fit's validation
    runs with fit's steps per call, so its steps count too."""
    if kind == "evaluate":
        return arguments.get("steps")
    steps = arguments.get("steps_per_epoch")
    validation = arguments.get("validation_data") is not None or arguments.get("validation_split")
    if validation and arguments.get("validation_steps") is not None:
        return [steps, arguments["validation_steps"]]
    return steps


@STEPS_PER_EXECUTION.variant(
    "3.7",
    targets=[
        TF_TRAINER.target("fit", ("self", "x", "y", "batch_size")),
        TF_TRAINER.target("evaluate", ("self", "x", "y", "batch_size")),
        TF_TRAINER.target("make_train_function", ("self", "force")),
        TF_TRAINER.target("make_test_function", ("self", "force")),
    ],
)
def _fix_steps_per_execution():
    # Keras' TensorFlow trainer (keras/src/backend/tensorflow/trainer.py) calls its train
    # function once per step with compile's default steps_per_execution=1. Each call returns
    # the step's logs averaged over the replicas (between processes, an all-reduce) and goes
    # through fit's loop and callbacks: on 2 CPU processes, 2-3 ms a call against a 3 ms step
    # of a small MLP. Keras' own steps_per_execution runs K steps in one call, with the same
    # steps, weights and epoch logs; it changes only what callbacks see per step (one call
    # per K steps). So where the model's steps_per_execution is 1, no callback implements a
    # batch hook (Keras' progress bar updates per call, History keeps epochs) and K divides
    # the steps asked for, fit and evaluate run with K = the largest such divisor up to 16;
    # the model's own setting and functions are back after the call. Workers agree on K.
    # On multi_worker_mirrored it needs tfdist's loop (multi_worker_steps_per_execution).
    import tensorflow as tf
    from tensorflow.python.distribute import mirrored_strategy

    tf_trainer_class = TF_TRAINER.get()
    originals = {name: getattr(tf_trainer_class, name) for name in ("fit", "evaluate")}
    signatures = {name: inspect.signature(f) for name, f in originals.items()}

    def eligible(model) -> bool:
        strategy = getattr(model, "_distribute_strategy", None)
        # mirrored or multi_worker_mirrored, whose extended subclasses mirrored's
        return (
            isinstance(getattr(strategy, "extended", None), mirrored_strategy.MirroredExtended)
            and model.steps_per_execution == 1
            and not model.run_eagerly
            and (
                not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                or multi_worker.steps_loop_applied()
            )
        )

    def chosen(kind):
        original, signature = originals[kind], signatures[kind]

        @functools.wraps(original)
        def method(self, *args, **kwargs):
            if not eligible(self) or kwargs.get("_use_cached_eval_dataset"):
                return original(self, *args, **kwargs)  # (fit's validation: fit's choice)
            arguments = signature.bind(self, *args, **kwargs).arguments
            k = choose(_steps_of(kind, arguments), arguments.get("callbacks"), kind)
            k = _agreed(self._distribute_strategy, k)
            if k == 1:
                return original(self, *args, **kwargs)
            with _executing(self, k):
                return original(self, *args, **kwargs)

        return method

    tf_trainer_class.fit = chosen("fit")
    tf_trainer_class.evaluate = chosen("evaluate")


TF_KERAS_STEPS_PER_EXECUTION = Fix(
    name="tf_keras_steps_per_execution_chosen",
    summary=(
        "tf_keras' fit calls its train function once per step unless compile says otherwise, "
        "and under multi_worker_mirrored each step also all-reduces every metric's state in "
        "collectives of its own (seven collectives a step for a loss and one metric)."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "tf_keras fit of a small model runs at a fraction of a hand-written loop's speed under "
        "multi_worker_mirrored (benchmarks/bench_fit_step.py); results are the same."
    ),
    library="tf_keras",
)
_TF_KERAS_MODEL = "tf_keras.src.engine.training:Model"
_TF_KERAS_ADAPTERS = "tf_keras.src.engine.data_adapter"


@TF_KERAS_STEPS_PER_EXECUTION.variant(
    "2.16",
    targets=[
        Target(f"{_TF_KERAS_MODEL}.fit", ("self", "x", "y", "batch_size")),
        Target(f"{_TF_KERAS_MODEL}.make_train_function", ("self", "force")),
        Target(f"{_TF_KERAS_MODEL}.get_metrics_result", ("self",)),
        Target(f"{_TF_KERAS_ADAPTERS}:select_data_adapter", ("x", "y")),
        f"{_TF_KERAS_ADAPTERS}:GeneratorDataAdapter",
        f"{_TF_KERAS_ADAPTERS}:DatasetCreatorAdapter",
        f"{_TF_KERAS_ADAPTERS}:DatasetAdapter",
    ],
)
def _fix_tf_keras_steps_per_execution():
    # tf_keras' Model.fit (tf_keras/src/engine/training.py) calls its train function once per
    # step with compile's default steps_per_execution=1, and each step's logs come from
    # get_metrics_result(): every metric's result() in a merge_call, which all-reduces each
    # of its sync-on-read totals on its own, then reduce_per_replica's "sum", one strategy.reduce
    # per log. A loss and one metric: seven collectives a step with the gradients' one. Its
    # own steps_per_execution=K loop computes the logs at every one of the K steps. So where
    # the model's setting is 1 and no callback implements a batch hook, fit runs K steps per
    # call (chosen as for Keras 3) through a train function of tfdist's: K-1 steps of
    # upstream's step with get_metrics_result() giving no logs (the metrics still update), then
    # upstream's step, logs and all: the same steps, weights and logs at each call's end. The
    # model's setting and functions are back after the call. Data whose steps tf_keras cannot
    # count before it reads them (a generator, a dataset of unknown cardinality, with no
    # steps_per_epoch) keep 1: its DataHandler refuses more ("Could not infer the size").
    import tensorflow as tf
    from tensorflow.python.distribute import mirrored_strategy
    from tf_keras.src.engine import training

    original = training.Model.fit
    signature = inspect.signature(original)
    make_train_function = training.Model.make_train_function

    def eligible(model) -> bool:
        strategy = getattr(model, "_distribution_strategy", None) or model.distribute_strategy
        setting = getattr(model, "_steps_per_execution", None)
        return (
            isinstance(getattr(strategy, "extended", None), mirrored_strategy.MirroredExtended)
            and setting is not None
            and int(setting.numpy()) == 1
            and not model.autotune_steps_per_execution
            and not model.run_eagerly
            and not model.jit_compile
            and getattr(model, "_cluster_coordinator", None) is None
            # the model keeps tf_keras' own (another fix may have wrapped it since)
            and type(model).make_train_function is training.Model.make_train_function
        )

    def k_steps(model, one_step):
        """Upstream's one-step train function, run K times a call (K: the model's setting)."""
        step = one_step.python_function

        def without_logs(iterator):
            model.__dict__["get_metrics_result"] = dict  # (while traced) {}: no collectives
            try:
                step(iterator)
            finally:
                del model.__dict__["get_metrics_result"]

        def train_function(iterator):
            for _ in tf.range(model._steps_per_execution - 1):
                without_logs(iterator)
            return step(iterator)

        function = tf.function(train_function, reduce_retracing=True)
        # TensorFlow warns of "excessive" retracing when a function's code traced often among
        # its last calls: here each model and each kind of input traces once, and a fit makes
        # few calls of K steps, so the warning would fire on correct use (on tf.function's
        # own attribute for that; where a release lacks it, setting it does nothing).
        function._omit_frequent_tracing_warning = True
        return function

    @contextlib.contextmanager
    def executing(model, k: int):
        token = (model.optimizer, model.compiled_loss, model.compiled_metrics)
        cache = model.__dict__.get("_tfdist_functions")
        if cache is None or any(a is not b for a, b in zip(cache["token"], token)):
            cache = model.__dict__["_tfdist_functions"] = {"token": token}
        own = (model.train_function, getattr(model, "train_tf_function", None))
        if "steps" not in cache:
            model.train_function = None
            cache["steps"] = k_steps(model, make_train_function(model, force=True))
        model._steps_per_execution.assign(k)
        model.train_function = cache["steps"]
        try:
            yield
        finally:
            model._steps_per_execution.assign(1)
            model.train_function, model.train_tf_function = own

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if not eligible(self):
            return original(self, *args, **kwargs)
        arguments = signature.bind(self, *args, **kwargs).arguments
        k = 1  # where tf_keras cannot count the steps, it takes no other (still agreed on)
        if _tf_keras_counts_steps(arguments):
            k = choose(_steps_of("fit", arguments), arguments.get("callbacks"), "fit")
        k = _agreed(self.distribute_strategy, k)
        if k == 1:
            return original(self, *args, **kwargs)
        with executing(self, k):
            return original(self, *args, **kwargs)

    training.Model.fit = fit


def _tf_keras_counts_steps(arguments: dict) -> bool:
    """Whether tf_keras knows the steps of fit's data and validation data before it reads them.

    Where it does not (a dataset of unknown cardinality or a Python generator, with no
    steps_per_epoch / validation_steps), its DataHandler refuses steps_per_execution > 1
    ("Could not infer the size of the data"), and the data's end is what ends the epoch: fit
    then keeps one step per call.
    """
    if not _tf_keras_knows_size(arguments.get("x"), arguments.get("steps_per_epoch")):
        return False
    validation = arguments.get("validation_data")
    if validation is None:
        return True
    if isinstance(validation, tuple):  # (x, y) or (x, y, sample_weight) of arrays
        validation = validation[0]
    return _tf_keras_knows_size(validation, arguments.get("validation_steps"))


def _tf_keras_knows_size(x, steps) -> bool:
    """tf_keras' own rule (DataHandler._infer_steps): the steps given, else the adapter's size,
    else a tf.data.Dataset's cardinality; a generator or a distributed dataset has none."""
    if steps is not None and steps != -1:
        return True
    import tensorflow as tf
    from tf_keras.src.engine import data_adapter

    try:
        adapter = data_adapter.select_data_adapter(x, None)
    except (ValueError, RuntimeError):
        return False  # tf_keras refuses the data itself, with its own message
    if adapter in (data_adapter.GeneratorDataAdapter, data_adapter.DatasetCreatorAdapter):
        return False
    if adapter is data_adapter.DatasetAdapter:
        return isinstance(x, tf.data.Dataset) and int(x.cardinality()) >= 0
    return True  # arrays, tensors, lists of scalars, a keras.utils.Sequence: their length


FIXES = (STEPS_PER_EXECUTION, TF_KERAS_STEPS_PER_EXECUTION)
