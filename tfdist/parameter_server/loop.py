"""The fit and evaluate loops of parameter-server training, run on the coordinator.

On Keras 3, `fit_parameter_server` / `evaluate_parameter_server` build the model on the ps
tasks (`model`), make one dataset per worker (`datasets`), and run epochs of groups of steps
through the exactly-once runner (`runner`), with Keras callbacks, History, a progress bar and
validation as in Keras' fit. Metric variables live on the ps tasks too, so after the groups
have run the coordinator reads the aggregate over all workers. Under tf_keras they go to
`tf_keras`. TensorFlow's errors after a ps is lost become a TaskUnavailableError (`watchdog`).

Callbacks run on the coordinator: `on_train_batch_begin` when a group of steps is scheduled,
`on_train_batch_end` when it has run (in scheduling order), with that group's logs: the metrics
as its worker read them from the ps after its last step, so the aggregate over all workers so
far. Other workers keep updating while a metric's variables are read, so a batch log is a
snapshot (a ratio such as accuracy can be momentarily off). Epoch logs are read after every
scheduled group has run, so they are exact. Without batch-level callbacks (no progress bar,
verbose=0 or 2) no group's logs are read but the epoch's last: groups run back to back.

A backup callback (`tfdist.BackupAndRestore`) drives the loop through a duck-typed protocol,
so that this package imports nothing of tfdist.preemption: during the fit it sets an object on
the model, `model._tfdist_backup` (past Keras' attribute tracking), with

    callback                  the Keras callback it belongs to (its batch hooks need no logs)
    initial_step()            steps of the first epoch already trained (a restored backup)
    stop_requested()          asked once after each group is scheduled: schedule no more
    after_groups(epoch, steps_done)
                              once the scheduled groups have run (`steps_done` steps of
                              `epoch`): saves if due, and raises (tfdist.Preempted) to stop
    close()                   the fit ended in an error (no on_train_end comes)

The loop then keeps at most `_Runner.window` groups in flight (a stop waits for no more than
those) and reads no group's logs for it.

Holds no state.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

from tfdist import flavour
from tfdist.parameter_server.checks import check_count, check_dataset_fn, check_strategy
from tfdist.parameter_server.datasets import per_worker_dataset
from tfdist.parameter_server.model import build_keras3
from tfdist.parameter_server.runner import coordinator_for, runner_for
from tfdist.parameter_server.tf_keras import evaluate_tf_keras, fit_tf_keras
from tfdist.parameter_server.watchdog import naming_lost_tasks

__all__ = ["evaluate_parameter_server", "fit_parameter_server"]


def _to_python(logs) -> dict:
    """Step logs as Python numbers (nested dicts flattened), as Keras gives them to callbacks."""
    result = {}
    for key, value in sorted((logs if isinstance(logs, dict) else {}).items()):
        if isinstance(value, dict):
            result.update(_to_python(value))
            continue
        try:
            value = float(value)  # a scalar tensor or number; anything else is kept as it is
        except (TypeError, ValueError):
            pass
        result[key] = value
    return result


def _history(callbacks):
    keras = flavour.keras()
    for callback in callbacks.callbacks:
        if isinstance(callback, keras.callbacks.History):
            return callback
    return None


def _has_batch_hooks(callbacks, mode: str, driver=None) -> bool:
    """True when a callback does something per batch (so each group's logs must be read).

    `driver`: a callback that drives the loop through its own protocol (a backup's), whose
    batch hooks need no logs."""
    from keras.src.utils.python_utils import is_default

    keras = flavour.keras()
    if type(callbacks) is not keras.callbacks.CallbackList:  # pylint: disable=unidiomatic-typecheck
        return True
    names = (
        ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")
        if mode == "train"
        else ("on_test_batch_begin", "on_test_batch_end")
    )

    for callback in callbacks.callbacks:
        if driver is not None and callback is driver:
            continue
        if type(callback) is keras.callbacks.ProgbarLogger:  # pylint: disable=unidiomatic-typecheck
            # It shows batch logs with verbose=1 only, and none while validating in fit.
            if callback.verbose != 1 or (mode == "test" and callback._called_in_fit):
                continue
        if any(not is_default(getattr(callback, name, None) or (lambda: None)) for name in names):
            return True
    return False


def _backup_of(model, callbacks):
    """The backup that drives this fit (see the module's docstring), or None."""
    backup = getattr(model, "_tfdist_backup", None)
    ours = getattr(callbacks, "callbacks", ())
    if backup is None or getattr(backup, "callback", None) not in ours:
        return None  # none, or one left by an earlier fit that did not end
    return backup


@contextlib.contextmanager
def _closed_on_error(backup):
    """Keras calls no on_train_end after an error: then the backup is closed (it stops turning
    SIGTERM into a stop, and leaves the model)."""
    try:
        yield
    except BaseException:
        if backup is not None:
            backup.close()
        raise


def _train_epoch(model, runner, iterator, epoch, step, steps, k, callbacks, batch_hooks, backup):
    """Trains steps `step` to `steps - 1` of `epoch`; returns the logs of its last group.

    Without a backup, one run of the runner. With one, runs until the backup asks to stop (a
    save is due, or a SIGTERM came), hands over the steps done, and goes on if it returns.
    """
    last = {}
    while step < steps:

        def should_stop():
            stop = backup is not None and backup.stop_requested()  # asked after every group
            return stop or model.stop_training

        last = (
            runner.run(
                "train",
                iterator,
                steps - step,
                k,
                lambda begin, offset=step: callbacks.on_train_batch_begin(begin + offset),
                lambda end, logs, offset=step: callbacks.on_train_batch_end(
                    end + offset, _to_python(logs)
                ),
                should_stop,
                batch_hooks=batch_hooks,
                ahead=None if backup is None else runner.window,
            )
            or last
        )
        step += runner.scheduled
        if backup is None:
            break
        backup.after_groups(epoch, step)  # raises to stop
        if model.stop_training:
            break
    return last


def _epoch_logs(model, last_logs) -> dict:
    """The model's metrics, read from the ps (exact, over all workers), as Python numbers.

    As Keras' fit: when a custom step returns other names than the model's metrics, its last
    logs are used instead.
    """
    metrics = model.get_metrics_result()
    if isinstance(last_logs, dict) and last_logs and set(last_logs) != set(metrics):
        return _to_python(last_logs)
    return _to_python(metrics)


def _evaluate_loop(model, runner, iterator, steps, steps_per_execution, callbacks) -> dict:
    model.stop_evaluating = False
    callbacks.on_test_begin()
    model.reset_metrics()
    last = runner.run(
        "test",
        iterator,
        steps,
        steps_per_execution,
        callbacks.on_test_batch_begin,
        lambda end, logs: callbacks.on_test_batch_end(end, _to_python(logs)),
        lambda: getattr(model, "stop_evaluating", False),
        batch_hooks=_has_batch_hooks(callbacks, "test"),
    )
    logs = _epoch_logs(model, last)
    callbacks.on_test_end(logs)
    return logs


def _steps_per_execution(model, value) -> int:
    if value is None:
        value = getattr(model, "steps_per_execution", None) or 1
    return check_count("steps_per_execution", value)


def fit_parameter_server(
    model,
    strategy,
    dataset_fn: Callable,
    *,
    epochs: int = 1,
    steps_per_epoch: int,
    steps_per_execution: Optional[int] = None,
    callbacks=None,
    verbose="auto",
    validation_dataset_fn: Optional[Callable] = None,
    validation_steps: Optional[int] = None,
    initial_epoch: int = 0,
    sample_batch=None,
):
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
        TaskUnavailableError: a ps task was lost (its variables with it); the job must be
            restarted from a checkpoint. A lost worker is not an error: its groups run
            again on the other workers, each step applied once.
    """
    check_dataset_fn("dataset_fn", dataset_fn)
    check_count("epochs", epochs, minimum=0)
    check_count("steps_per_epoch", steps_per_epoch)
    check_count("initial_epoch", initial_epoch, minimum=0)
    if steps_per_execution is not None:
        check_count("steps_per_execution", steps_per_execution)
    if validation_dataset_fn is not None:
        check_dataset_fn("validation_dataset_fn", validation_dataset_fn)
        if validation_steps is None:
            raise ValueError(
                "`validation_steps` is required with `validation_dataset_fn`: a dataset made "
                "per worker has no common end. Received: validation_steps=None."
            )
        check_count("validation_steps", validation_steps)
    check_strategy(strategy)
    options = dict(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        steps_per_execution=steps_per_execution,
        callbacks=callbacks,
        verbose=verbose,
        validation_dataset_fn=validation_dataset_fn,
        validation_steps=validation_steps,
        initial_epoch=initial_epoch,
        sample_batch=sample_batch,
    )
    with naming_lost_tasks(strategy):
        if flavour.uses_legacy_keras():
            return fit_tf_keras(model, strategy, dataset_fn, **options)
        return _fit_keras3(model, strategy, dataset_fn, **options)


def _fit_keras3(
    model,
    strategy,
    dataset_fn,
    *,
    epochs,
    steps_per_epoch,
    steps_per_execution,
    callbacks,
    verbose,
    validation_dataset_fn,
    validation_steps,
    initial_epoch,
    sample_batch,
):
    keras = flavour.keras()
    k = _steps_per_execution(model, steps_per_execution)
    coordinator = coordinator_for(strategy)
    build_keras3(model, strategy, dataset_fn, sample_batch, "fit_parameter_server")
    runner = runner_for(model, strategy, coordinator)
    train_iterator = iter(per_worker_dataset(coordinator, strategy, "dataset_fn", dataset_fn))
    validation = None
    if validation_dataset_fn is not None:
        validation = per_worker_dataset(
            coordinator, strategy, "validation_dataset_fn", validation_dataset_fn
        )
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps_per_epoch,
            model=model,
        )

    model.stop_training = False
    callbacks.on_train_begin()
    # As Keras' fit: BackupAndRestore.on_train_begin restores the weights and sets the epoch
    # to resume at.
    initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch
    backup = _backup_of(model, callbacks)
    first_step = backup.initial_step() if backup is not None else 0
    if first_step >= steps_per_epoch:  # the backup was saved after the epoch's last step
        initial_epoch, first_step = initial_epoch + 1, 0
    batch_hooks = _has_batch_hooks(callbacks, "train", getattr(backup, "callback", None))
    training_logs = None
    with _closed_on_error(backup):
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            callbacks.on_epoch_begin(epoch)
            last = _train_epoch(
                model,
                runner,
                train_iterator,
                epoch,
                first_step,
                steps_per_epoch,
                k,
                callbacks,
                batch_hooks,
                backup,
            )
            first_step = 0
            epoch_logs = _epoch_logs(model, last)
            if validation is not None:
                # A fresh iterator: every validation starts at the beginning of its data.
                val_logs = _evaluate_loop(
                    model, runner, iter(validation), validation_steps, k, callbacks
                )
                epoch_logs.update({f"val_{name}": value for name, value in val_logs.items()})
            callbacks.on_epoch_end(epoch, epoch_logs)
            training_logs = epoch_logs
            if model.stop_training:
                break
    if epochs > initial_epoch and isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs=training_logs)
    return _history(callbacks) or getattr(model, "history", None)


def evaluate_parameter_server(
    model,
    strategy,
    dataset_fn: Callable,
    *,
    steps: int,
    steps_per_execution: Optional[int] = None,
    callbacks=None,
    verbose="auto",
    return_dict: bool = False,
    sample_batch=None,
):
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
    check_dataset_fn("dataset_fn", dataset_fn)
    check_count("steps", steps)
    if steps_per_execution is not None:
        check_count("steps_per_execution", steps_per_execution)
    check_strategy(strategy)
    options = dict(
        steps=steps,
        steps_per_execution=steps_per_execution,
        callbacks=callbacks,
        verbose=verbose,
        return_dict=return_dict,
        sample_batch=sample_batch,
    )
    with naming_lost_tasks(strategy):
        if flavour.uses_legacy_keras():
            return evaluate_tf_keras(model, strategy, dataset_fn, **options)
        return _evaluate_keras3(model, strategy, dataset_fn, **options)


def _evaluate_keras3(
    model,
    strategy,
    dataset_fn,
    *,
    steps,
    steps_per_execution,
    callbacks,
    verbose,
    return_dict,
    sample_batch,
):
    keras = flavour.keras()
    k = _steps_per_execution(model, steps_per_execution)
    coordinator = coordinator_for(strategy)
    build_keras3(model, strategy, dataset_fn, sample_batch, "evaluate_parameter_server")
    runner = runner_for(model, strategy, coordinator)
    iterator = iter(per_worker_dataset(coordinator, strategy, "dataset_fn", dataset_fn))
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=steps, model=model
        )
    logs = _evaluate_loop(model, runner, iterator, steps, k, callbacks)
    if return_dict:
        return logs
    return model._flatten_metrics_in_order(logs)
