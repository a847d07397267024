"""Parameter-server training of Keras models through a `ClusterCoordinator`.

Keras 3's own `fit` has no ParameterServerStrategy support (keras-team/keras#18624), so tfdist
drives a compiled Keras 3 model itself: on the coordinator (the chief) it builds the model, its
metrics and its optimizer inside the strategy's scope (every variable then lives on the ps
tasks), makes one dataset per worker from a dataset function, and schedules functions that each
run `steps_per_execution` of the model's own `train_step` / `test_step` on whichever worker is
free. Metric variables live on the ps tasks too, so after `coordinator.join()` the coordinator
reads the aggregate over all workers. Under tf_keras the same calls go to tf_keras's `fit` with
a `DatasetCreator`, which supports parameter-server training natively.

Exact step counts and metrics need the Keras fixes of `tfdist._compat` (atomic assign_add on
ps variables); sharded variables (a `variable_partitioner`) need the sharding fixes there too.
`fit_parameter_server` applies them.

Callbacks run on the coordinator: `on_train_batch_begin` when a group of steps is scheduled,
`on_train_batch_end` when it has run (in scheduling order), with that group's logs: the metrics
as its worker read them from the ps after its last step, so the aggregate over all workers so
far. Other workers keep updating while a metric's variables are read, so a batch log is a
snapshot (a ratio such as accuracy can be momentarily off). Epoch logs are read after every
scheduled group has run, so they are exact. Under tf_keras, tf_keras refuses batch-level
callbacks with a parameter-server strategy; epoch-level ones work.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Callable, Dict, Optional

from tfdist import _compat

__all__ = ["build_model", "coordinator_for", "evaluate_parameter_server",
           "fit_parameter_server", "plan_groups"]

log = logging.getLogger("tfdist")

# How many scheduled groups may wait for their on_*_batch_end per worker: enough to keep every
# worker busy while the coordinator waits for the oldest group, few enough that batch callbacks
# stay close to the training they report.
IN_FLIGHT_PER_WORKER = 4

_LOCK = threading.Lock()


# ---------------------------------------------------------------------------- small helpers


def plan_groups(steps: int, steps_per_execution: int) -> list:
    """Splits `steps` steps into scheduled groups of at most `steps_per_execution` steps.

    A pure function. Returns (first_step, last_step) pairs, inclusive, in order; the last group
    holds the remainder when `steps` is not a multiple of `steps_per_execution`.

    Example: plan_groups(7, 3) == [(0, 2), (3, 5), (6, 6)].
    """
    return [(begin, min(begin + steps_per_execution, steps) - 1)
            for begin in range(0, steps, steps_per_execution)]


def _count(name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {kind}. Received: {name}={value!r}.")
    return value


def _check_strategy(strategy) -> None:
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise TypeError(
            "Parameter-server training needs a tf.distribute.ParameterServerStrategy (the "
            f"coordinator side). Received: strategy={strategy!r} (of type "
            f"{type(strategy).__name__}). HINT: tfdist.make_strategy('parameter_server') in the "
            "chief of a job with ps tasks.")


def _check_dataset_fn(name: str, dataset_fn) -> None:
    if not callable(dataset_fn):
        raise TypeError(
            f"`{name}` must be a function of a tf.distribute.InputContext that returns a "
            f"tf.data.Dataset of batches. Received: {name}={dataset_fn!r} (of type "
            f"{type(dataset_fn).__name__}).")


def coordinator_for(strategy):
    """The one `ClusterCoordinator` of `strategy` (TensorFlow allows only one per strategy)."""
    import tensorflow as tf

    _check_strategy(strategy)
    with _LOCK:
        return tf.distribute.coordinator.ClusterCoordinator(strategy)  # cached by TensorFlow


def _repeating(name: str, dataset_fn: Callable) -> Callable:
    """`dataset_fn`, checked, and repeated so that a fixed number of steps never runs out."""
    import tensorflow as tf

    def make(input_context):
        dataset = dataset_fn(input_context)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"`{name}` must return a tf.data.Dataset of batches. Received: "
                f"{dataset!r} (of type {type(dataset).__name__}).")
        return dataset.repeat()  # a no-op in effect on an infinite dataset

    return make


def _per_worker_dataset(coordinator, strategy, name: str, dataset_fn: Callable):
    make = _repeating(name, dataset_fn)
    return coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(make))


def _local_batch(name: str, dataset_fn: Callable):
    """One batch of `dataset_fn`, made on the coordinator (to learn shapes and dtypes)."""
    import tensorflow as tf

    dataset = _repeating(name, dataset_fn)(tf.distribute.InputContext())
    try:
        return next(iter(dataset.take(1)))
    except StopIteration:
        raise ValueError(
            f"`{name}` returned an empty dataset (no batch at all, even on one input pipeline)."
            " HINT: check the data source, and that batch(..., drop_remainder=True) leaves a "
            "batch.") from None


def _to_python(logs) -> dict:
    from keras.src.utils.python_utils import pythonify_logs

    return pythonify_logs(logs if isinstance(logs, dict) else {})


def _history(callbacks):
    keras = _compat.keras()
    for callback in callbacks.callbacks:
        if isinstance(callback, keras.callbacks.History):
            return callback
    return None


# -------------------------------------------------------------------------------- building


def _check_model(model, strategy, method: str) -> None:
    model._assert_compile_called(method)
    if getattr(model, "_distribute_strategy", None) is not strategy:
        raise ValueError(
            f"The model passed to {method} was not created inside this parameter-server "
            "strategy's scope, so its variables do not live on the ps tasks. HINT: build and "
            "compile it inside the scope: `with strategy.scope(): model = build(); "
            "model.compile(...)`.")


def build_model(model, strategy, dataset_fn: Optional[Callable] = None, *, sample_batch=None):
    """Builds `model`'s weights, metrics, loss and optimizer on the ps tasks of `strategy`.

    `fit_parameter_server` / `evaluate_parameter_server` call this; call it yourself to restore
    a checkpoint into the built model (immediate restore) before training.

    Args:
        model: a compiled Keras model (Keras 3 or tf_keras), created inside
            `strategy.scope()`.
        strategy: tf.distribute.ParameterServerStrategy.
        dataset_fn: callable(InputContext) -> tf.data.Dataset. Used for one local batch when
            `sample_batch` is None.
        sample_batch: one batch (x, y[, sample_weight]) with the shapes and dtypes of the
            training data. Defaults to the first batch of `dataset_fn`.
    """
    if _compat.uses_legacy_keras():
        _check_strategy(strategy)
        _tf_keras_prepare(model, strategy, dataset_fn, None, sample_batch)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        return
    _build(model, strategy, dataset_fn, sample_batch, "build_model")


def _build(model, strategy, dataset_fn, sample_batch, method: str) -> None:
    _check_strategy(strategy)
    _compat.apply_keras_fixes()
    _check_model(model, strategy, method)
    if sample_batch is None:
        if dataset_fn is None:
            raise ValueError("build_model needs `dataset_fn` or `sample_batch` (one batch).")
        sample_batch = _local_batch("dataset_fn", dataset_fn)
    with strategy.scope():
        model._symbolic_build(data_batch=sample_batch)


# ---------------------------------------------------------------------------- the step loop


@contextlib.contextmanager
def _without_metric_results(model):
    """While tracing: `model.get_metrics_result()` returns {} (Keras' train/test_step return it)."""
    object.__setattr__(model, "get_metrics_result", dict)
    try:
        yield
    finally:
        object.__delattr__(model, "get_metrics_result")


class _Runner:
    """Schedules groups of `train_step` / `test_step` on the workers and reports each group."""

    def __init__(self, model, strategy, coordinator):
        self.model, self.strategy, self.coordinator = model, strategy, coordinator
        self.window = IN_FLIGHT_PER_WORKER * max(1, strategy.extended._num_workers)
        self._functions: Dict[tuple, Callable] = {}

    def function(self, mode: str, steps: int) -> Callable:
        """A tf.function that runs `steps` steps on one worker and returns the last logs."""
        key = (mode, steps)
        if key not in self._functions:
            import tensorflow as tf

            strategy = self.strategy
            step = self.model.train_step if mode == "train" else self.model.test_step

            def one_step(iterator):
                logs = strategy.run(step, args=(next(iterator),))
                # Metrics are read from the ps: every replica reports the same aggregate.
                return tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0], logs)

            def quiet_step(iterator):
                # The logs of all but a group's last step are dropped, but reading them would
                # still cost one read of every metric variable from the ps per step. Traced
                # with get_metrics_result() -> {} they are not read; the metric updates stay.
                with _without_metric_results(self.model):
                    strategy.run(step, args=(next(iterator),))

            def multi_step(iterator):
                for _ in tf.range(steps - 1):
                    quiet_step(iterator)
                return one_step(iterator)

            self._functions[key] = tf.function(one_step if steps == 1 else multi_step)
        return self._functions[key]

    def run(self, mode: str, iterator, steps: int, steps_per_execution: int, on_begin,
            on_end, should_stop) -> dict:
        """Runs `steps` steps; returns the logs of the last group (in scheduling order).

        `on_begin(first_step)` runs when a group is scheduled, `on_end(last_step, logs)` when
        it has run, in scheduling order; at most `window` groups wait for their `on_end`.
        `should_stop()` is asked after each group is scheduled (groups already scheduled
        still run).
        """
        pending = collections.deque()
        last = {}

        def finish():
            nonlocal last
            end, remote = pending.popleft()
            last = remote.fetch()
            on_end(end, last)

        try:
            for begin, end in plan_groups(steps, steps_per_execution):
                on_begin(begin)
                function = self.function(mode, end - begin + 1)
                pending.append((end, self.coordinator.schedule(function, args=(iterator,))))
                while len(pending) > self.window:
                    finish()
                if should_stop():
                    break
            self.coordinator.join()
            while pending:
                finish()
        except BaseException:
            # Leave no scheduled step running into the next fit/evaluate: wait for them, then
            # raise the first error (join reports errors of other groups; this one wins).
            try:
                self.coordinator.join()
            except Exception:  # pylint: disable=broad-except
                pass
            raise
        return last


def _runner_for(model, strategy, coordinator) -> _Runner:
    """The model's runner (its traced step functions), made again when it is recompiled."""
    key = (id(strategy), id(model.optimizer), id(getattr(model, "_compile_loss", None)),
           id(getattr(model, "_compile_metrics", None)))
    cached = getattr(model, "_tfdist_ps_runner", None)
    if cached is None or cached[0] != key:
        cached = (key, _Runner(model, strategy, coordinator))
        # Past Keras' and TensorFlow's attribute tracking: no checkpoint or save sees it.
        object.__setattr__(model, "_tfdist_ps_runner", cached)
    return cached[1]


def _epoch_logs(model, last_logs) -> dict:
    """The model's metrics, read from the ps (exact, over all workers), as Python numbers.

    As Keras' fit: when a custom step returns other names than the model's metrics, its last
    logs are used instead.
    """
    metrics = model.get_metrics_result()
    if isinstance(last_logs, dict) and set(last_logs) != set(metrics):
        return _to_python(last_logs)
    return _to_python(metrics)


def _evaluate_loop(model, runner, iterator, steps, steps_per_execution, callbacks) -> dict:
    model.stop_evaluating = False
    callbacks.on_test_begin()
    model.reset_metrics()
    last = runner.run("test", iterator, steps, steps_per_execution,
                      callbacks.on_test_batch_begin,
                      lambda end, logs: callbacks.on_test_batch_end(end, _to_python(logs)),
                      lambda: getattr(model, "stop_evaluating", False))
    logs = _epoch_logs(model, last)
    callbacks.on_test_end(logs)
    return logs


def _steps_per_execution(model, value) -> int:
    if value is None:
        value = getattr(model, "steps_per_execution", None) or 1
    return _count("steps_per_execution", value)


# ------------------------------------------------------------------------------ public API


def fit_parameter_server(model, strategy, dataset_fn: Callable, *, epochs: int = 1,
                         steps_per_epoch: int, steps_per_execution: Optional[int] = None,
                         callbacks=None, verbose="auto",
                         validation_dataset_fn: Optional[Callable] = None,
                         validation_steps: Optional[int] = None, initial_epoch: int = 0,
                         sample_batch=None):
    """Trains a compiled Keras model with a parameter-server strategy, from the coordinator.

    Runs on the chief of a parameter-server job; the worker and ps tasks only serve. Build and
    compile the model inside `strategy.scope()` first.

    Args:
        model: a compiled Keras model (Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1) made
            inside `strategy.scope()`.
        strategy: tf.distribute.ParameterServerStrategy.
        dataset_fn: callable(tf.distribute.InputContext) -> tf.data.Dataset of batches
            (x, y), (x, y, sample_weight), or dicts; called once per worker (shard by
            `input_context.input_pipeline_id`). It is repeated, so steps never run out.
        epochs: int. Index of the last epoch, as in Keras. Defaults to 1.
        steps_per_epoch: int. Steps (batches, over all workers) per epoch. Required.
        steps_per_execution: int. Steps per scheduled function. Defaults to the model's
            compiled `steps_per_execution`, else 1. Any remainder gets a shorter function, so
            `optimizer.iterations` grows by exactly `steps_per_epoch` per epoch.
        callbacks: list of Keras callbacks, or a `CallbackList`. History and a progress bar
            are added as in Keras.
        verbose: "auto", 0, 1 or 2, as in Keras. Defaults to "auto".
        validation_dataset_fn: callable(InputContext) -> Dataset, evaluated after every
            epoch for `validation_steps` steps; its logs get the "val_" prefix.
        validation_steps: int. Required with `validation_dataset_fn`.
        initial_epoch: int. Epoch to start at (to resume). Defaults to 0.
        sample_batch: one local batch with the shapes of the training data, to build the
            model, metrics and optimizer. Defaults to the first batch of `dataset_fn`.

    Returns:
        keras.callbacks.History.

    Raises:
        TypeError: not a ParameterServerStrategy, or `dataset_fn` is not a function of an
            InputContext returning a tf.data.Dataset.
        ValueError: bad step counts, or a model not built inside the strategy's scope.
    """
    _check_dataset_fn("dataset_fn", dataset_fn)
    _count("epochs", epochs, minimum=0)
    _count("steps_per_epoch", steps_per_epoch)
    _count("initial_epoch", initial_epoch, minimum=0)
    if steps_per_execution is not None:
        _count("steps_per_execution", steps_per_execution)
    if validation_dataset_fn is not None:
        _check_dataset_fn("validation_dataset_fn", validation_dataset_fn)
        if validation_steps is None:
            raise ValueError(
                "`validation_steps` is required with `validation_dataset_fn`: a dataset made "
                "per worker has no common end. Received: validation_steps=None.")
        _count("validation_steps", validation_steps)
    _check_strategy(strategy)
    if _compat.uses_legacy_keras():
        return _fit_tf_keras(model, strategy, dataset_fn, epochs=epochs,
                             steps_per_epoch=steps_per_epoch,
                             steps_per_execution=steps_per_execution, callbacks=callbacks,
                             verbose=verbose, validation_dataset_fn=validation_dataset_fn,
                             validation_steps=validation_steps, initial_epoch=initial_epoch,
                             sample_batch=sample_batch)
    keras = _compat.keras()
    k = _steps_per_execution(model, steps_per_execution)
    coordinator = coordinator_for(strategy)
    _build(model, strategy, dataset_fn, sample_batch, "fit_parameter_server")
    runner = _runner_for(model, strategy, coordinator)
    train_iterator = iter(_per_worker_dataset(coordinator, strategy, "dataset_fn", dataset_fn))
    validation = None
    if validation_dataset_fn is not None:
        validation = _per_worker_dataset(coordinator, strategy, "validation_dataset_fn",
                                         validation_dataset_fn)
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_history=True, add_progbar=verbose != 0, verbose=verbose,
            epochs=epochs, steps=steps_per_epoch, model=model)

    model.stop_training = False
    callbacks.on_train_begin()
    training_logs = None
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        last = runner.run(
            "train", train_iterator, steps_per_epoch, k, callbacks.on_train_batch_begin,
            lambda end, logs: callbacks.on_train_batch_end(end, _to_python(logs)),
            lambda: model.stop_training)
        epoch_logs = _epoch_logs(model, last)
        if validation is not None:
            # A fresh iterator: every validation starts at the beginning of its data.
            val_logs = _evaluate_loop(model, runner, iter(validation), validation_steps, k,
                                      callbacks)
            epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
        callbacks.on_epoch_end(epoch, epoch_logs)
        training_logs = epoch_logs
        if model.stop_training:
            break
    if epochs > initial_epoch and isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs=training_logs)
    return _history(callbacks) or getattr(model, "history", None)


def evaluate_parameter_server(model, strategy, dataset_fn: Callable, *, steps: int,
                              steps_per_execution: Optional[int] = None, callbacks=None,
                              verbose="auto", return_dict: bool = False, sample_batch=None):
    """Evaluates a compiled Keras model with a parameter-server strategy, from the coordinator.

    Args:
        model, strategy, dataset_fn, steps_per_execution, callbacks, verbose, sample_batch: as
            for `fit_parameter_server`.
        steps: int. Batches to evaluate, over all workers. Required: a dataset made per
            worker has no common end.
        return_dict: bool. Return {name: value} instead of a list in the order of
            `model.metrics_names`. Defaults to False.

    Returns:
        The loss and metrics over all `steps` batches (aggregated over every worker), as a
        list (a scalar when there is only the loss) or a dict.
    """
    _check_dataset_fn("dataset_fn", dataset_fn)
    _count("steps", steps)
    if steps_per_execution is not None:
        _count("steps_per_execution", steps_per_execution)
    _check_strategy(strategy)
    if _compat.uses_legacy_keras():
        return _evaluate_tf_keras(model, strategy, dataset_fn, steps=steps,
                                  steps_per_execution=steps_per_execution,
                                  callbacks=callbacks, verbose=verbose,
                                  return_dict=return_dict, sample_batch=sample_batch)
    keras = _compat.keras()
    k = _steps_per_execution(model, steps_per_execution)
    coordinator = coordinator_for(strategy)
    _build(model, strategy, dataset_fn, sample_batch, "evaluate_parameter_server")
    runner = _runner_for(model, strategy, coordinator)
    iterator = iter(_per_worker_dataset(coordinator, strategy, "dataset_fn", dataset_fn))
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=steps,
            model=model)
    logs = _evaluate_loop(model, runner, iterator, steps, k, callbacks)
    if return_dict:
        return logs
    return model._flatten_metrics_in_order(logs)


# ------------------------------------------------------------------------------- tf_keras


def _tf_keras_prepare(model, strategy, dataset_fn, steps_per_execution, sample_batch):
    """tf_keras trains ps natively; build a model with no known input shape, set k."""
    if getattr(model, "distribute_strategy", None) is not strategy:
        raise ValueError(
            "The model was not created inside this parameter-server strategy's scope. HINT: "
            "build and compile it inside `with strategy.scope():`.")
    if not model.built:
        if sample_batch is None:
            sample_batch = _local_batch("dataset_fn", dataset_fn)
        x = sample_batch[0] if isinstance(sample_batch, (tuple, list)) else sample_batch
        with strategy.scope():
            model(x)
    if steps_per_execution is not None:
        model._configure_steps_per_execution(_count("steps_per_execution",
                                                    steps_per_execution))


def _tf_keras_verbose(verbose):
    if verbose == 1:  # tf_keras refuses 1 with a ps strategy (a per-batch progress bar)
        log.info("tfdist: tf_keras prints one line per epoch (verbose=2) under "
                 "ParameterServerStrategy.")
        return 2
    return verbose


def _fit_tf_keras(model, strategy, dataset_fn, *, epochs, steps_per_epoch,
                  steps_per_execution, callbacks, verbose, validation_dataset_fn,
                  validation_steps, initial_epoch, sample_batch):
    keras = _compat.keras()
    creator = keras.utils.experimental.DatasetCreator
    _tf_keras_prepare(model, strategy, dataset_fn, steps_per_execution, sample_batch)
    validation = None
    if validation_dataset_fn is not None:
        validation = creator(_repeating("validation_dataset_fn", validation_dataset_fn))
    return model.fit(creator(_repeating("dataset_fn", dataset_fn)), epochs=epochs,
                     steps_per_epoch=steps_per_epoch, callbacks=callbacks,
                     verbose=_tf_keras_verbose(verbose), validation_data=validation,
                     validation_steps=validation_steps, initial_epoch=initial_epoch)


def _evaluate_tf_keras(model, strategy, dataset_fn, *, steps, steps_per_execution, callbacks,
                       verbose, return_dict, sample_batch):
    keras = _compat.keras()
    _tf_keras_prepare(model, strategy, dataset_fn, steps_per_execution, sample_batch)
    return model.evaluate(
        keras.utils.experimental.DatasetCreator(_repeating("dataset_fn", dataset_fn)),
        steps=steps, callbacks=callbacks, verbose=_tf_keras_verbose(verbose),
        return_dict=return_dict)
