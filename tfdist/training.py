"""The training helper: build and compile in scope, feed the data, fit. On every strategy.

    history = tfdist.fit(build_model, (x, y), global_batch_size=64, epochs=3)

On mirrored and multi_worker_mirrored this is Keras' own `model.fit` (made to work on Keras 3
by the fixes tfdist applies when it makes the strategy). On parameter_server, where Keras 3's
fit has no support at all, tfdist drives the compiled model through a ClusterCoordinator
loop of its own (`tfdist.parameter_server`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from tfdist import data as data_lib
from tfdist import flavour, task
from tfdist.errors import TaskUnavailableError, is_count

__all__ = ["TaskUnavailableError", "evaluate", "fit"]


def _is_parameter_server(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def _build(build_model: Callable, strategy):
    if not callable(build_model) or hasattr(build_model, "compile"):  # a model is callable
        raise TypeError(
            f"build_model must be a callable that returns a compiled Keras model (tfdist calls "
            f"it inside strategy.scope()). Received: {build_model!r}. HINT: pass the function, "
            "not the model: tfdist.fit(build_model, ...), not tfdist.fit(build_model(), ...)."
        )
    with strategy.scope():
        model = build_model()
    if not hasattr(model, "fit") or not hasattr(model, "compile"):
        raise TypeError(
            f"build_model() must return a Keras model. It returned: {model!r} (of type "
            f"{type(model).__name__}). HINT: end build_model with `return model`, after "
            "model.compile(...)."
        )
    if not getattr(model, "compiled", getattr(model, "_is_compiled", False)):
        raise ValueError(
            "build_model() returned a model that is not compiled. HINT: call model.compile(...) "
            "inside build_model, so that the optimizer and metrics are created in the strategy's "
            "scope."
        )
    return model


def fit(
    build_model: Callable,
    data: Any,
    *,
    strategy=None,
    epochs: int = 1,
    steps_per_epoch: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    validation_data: Any = None,
    validation_steps: Optional[int] = None,
    callbacks=None,
    verbose="auto",
    shuffle: bool = False,
    seed: Optional[int] = None,
):
    """Builds, compiles and trains a Keras model on any tfdist strategy.

    Args:
        build_model: callable() -> compiled keras.Model. Called inside `strategy.scope()`, so
            the model's variables, optimizer and metrics are distributed.
        data: tf.data.Dataset | callable(tf.distribute.InputContext) -> Dataset | numpy arrays
            (x, (x, y) or (x, y, sample_weight); dicts of arrays for named inputs). A Dataset
            without `global_batch_size` is taken as already batched with the global batch.
        strategy: tf.distribute.Strategy. Defaults to `tfdist.make_strategy()`.
        epochs: int. Defaults to 1.
        steps_per_epoch: int. Defaults to one pass over the data (arrays, a finite dataset);
            otherwise the data repeat and every epoch trains exactly this many steps. Needed
            for data of unknown length on parameter_server (and by tf_keras).
        global_batch_size: int. The batch over all replicas; each replica gets
            global_batch_size / num_replicas_in_sync. Required for arrays; for a Dataset,
            given means "batch these examples", left out means "already batched".
        validation_data / validation_steps: evaluated after each epoch, same forms as `data`.
        callbacks: list of keras.callbacks.Callback.
        verbose: "auto", 0, 1 or 2. Progress is shown on the chief only.
        shuffle / seed: shuffle examples each epoch (arrays and unbatched datasets).

    Returns:
        keras.callbacks.History; `history.model` is the trained model.

    Raises:
        TaskUnavailableError: on parameter_server, a ps task was lost (it holds variables,
            so training cannot go on); restart the job and restore the last checkpoint. A
            lost worker is not an error: its unfinished steps run on the other workers.

    Example (the same script in every process of a job; TF_CONFIG differs):

    ```python
    def build_model():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    history = tfdist.fit(build_model, (x, y), global_batch_size=64, epochs=3,
                         steps_per_epoch=100)
    ```
    """
    # Checked before the strategy is made: a multi-worker start-up waits for the peers.
    _check_counts(epochs, steps_per_epoch, validation_steps)
    _check_callbacks(callbacks)
    strategy = _resolve_strategy(strategy)
    model = _build(build_model, strategy)
    plan = _Plan(
        data=data_lib.classify(data),  # once per input: every later step takes the Input
        validation=None if validation_data is None else data_lib.classify(validation_data),
        global_batch_size=global_batch_size,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        validation_steps=validation_steps,
        callbacks=callbacks,
        verbose=_chief_verbose(verbose),
        shuffle=shuffle,
        seed=seed,
    )
    if _is_parameter_server(strategy):
        history = _fit_parameter_server(model, strategy, plan)
    else:
        history = _fit_keras(model, strategy, plan)
    if getattr(history, "model", None) is not model:
        history.set_model(model)  # Keras 3's History.model is a read-only property
    return history


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What `fit` trains on and for how long: its inputs, each classified once, and the rest of
    its arguments, checked."""

    data: data_lib.Input
    validation: Optional[data_lib.Input]
    global_batch_size: Optional[int]
    epochs: int
    steps_per_epoch: Optional[int]
    validation_steps: Optional[int]
    callbacks: Any
    verbose: Any
    shuffle: bool
    seed: Optional[int]


def _check_callbacks(callbacks) -> None:
    """None, or a list (or tuple) of objects with Keras' callback methods."""
    if callbacks is None:
        return
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            f"callbacks must be a list of keras.callbacks.Callback. Received: "
            f"callbacks={callbacks!r} (of type {type(callbacks).__name__}). HINT: wrap one "
            "callback in a list: callbacks=[callback]."
        )
    for index, callback in enumerate(callbacks):
        if not (hasattr(callback, "set_model") and hasattr(callback, "on_train_begin")):
            raise TypeError(
                f"callbacks[{index}] is not a Keras callback. Received: {callback!r} (of type "
                f"{type(callback).__name__}). HINT: pass instances of keras.callbacks.Callback "
                "(or its subclasses), e.g. callbacks=[tfdist.BackupAndRestore(path)]."
            )


def _resolve_strategy(strategy):
    """The strategy given, else `tfdist.make_strategy()` (which, in the worker and ps tasks of a
    parameter-server job, serves and does not return)."""
    if strategy is not None:
        import tensorflow as tf

        if not isinstance(strategy, tf.distribute.Strategy):
            hint = (
                f"tfdist.make_strategy({strategy!r})"
                if isinstance(strategy, str)
                else "tfdist.make_strategy()"
            )
            raise TypeError(
                f"strategy must be a tf.distribute.Strategy. Received: strategy={strategy!r} (of "
                f"type {type(strategy).__name__}). HINT: pass strategy={hint}, or leave it out "
                "for make_strategy()'s choice."
            )
        return strategy
    from tfdist.strategy import make_strategy

    return make_strategy()


def _steps_or_refuse(given, data, global_batch_size, refusal: str) -> int:
    """`given` steps, else one pass over `data`; a ValueError saying `refusal` when neither
    is known (data of unknown length)."""
    steps = given if given is not None else data_lib.steps_per_pass(data, global_batch_size)
    if steps is None:
        raise ValueError(refusal)
    return steps


def _fit_parameter_server(model, strategy, plan: _Plan):
    """tfdist's own ClusterCoordinator loop: an epoch is a number of steps of repeated data."""
    from tfdist import parameter_server
    from tfdist.fixes import apply_fixes

    apply_fixes()  # also for a strategy that tfdist did not make
    steps_per_epoch = _steps_or_refuse(
        plan.steps_per_epoch,
        plan.data,
        plan.global_batch_size,
        "steps_per_epoch is required on parameter_server for data of unknown length "
        "(a dataset function, an infinite dataset): each worker reads its own "
        "repeated input, so an epoch has no natural end. HINT: steps_per_epoch = "
        "number of examples // global_batch_size.",
    )
    dataset_fn = data_lib.dataset_fn_for(
        plan.data, plan.global_batch_size, shuffle=plan.shuffle, seed=plan.seed, repeat=True
    )
    validation_fn, validation_steps = None, plan.validation_steps
    if plan.validation is not None:
        validation_fn = data_lib.dataset_fn_for(
            plan.validation, plan.global_batch_size, repeat=True
        )
        validation_steps = _steps_or_refuse(
            validation_steps,
            plan.validation,
            plan.global_batch_size,
            "validation_steps is required on parameter_server for validation_data of "
            "unknown length. HINT: validation_steps = number of validation examples "
            "// global_batch_size.",
        )
    return parameter_server.fit_parameter_server(
        model,
        strategy,
        dataset_fn,
        epochs=plan.epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=plan.callbacks,
        verbose=plan.verbose,
        validation_dataset_fn=validation_fn,
        validation_steps=validation_steps,
    )


def _fit_keras(model, strategy, plan: _Plan):
    """Keras' own `model.fit` on distributed datasets (mirrored, multi_worker_mirrored, ...).

    An epoch: one pass over data of known size, or steps_per_epoch steps of it repeated (a
    pass may end inside an epoch; nothing runs out). tf_keras needs the step counts of a
    distributed dataset, so they are given to it whenever they are known.
    """
    one_pass = data_lib.steps_per_pass(plan.data, plan.global_batch_size)
    legacy = flavour.uses_legacy_keras()
    steps_per_epoch = plan.steps_per_epoch
    if steps_per_epoch is None and legacy:
        steps_per_epoch = _tf_keras_steps(one_pass, "steps_per_epoch", "data")
    repeat = steps_per_epoch is not None and one_pass is not None
    dataset = data_lib.distribute_dataset(
        plan.data,
        strategy,
        plan.global_batch_size,
        shuffle=plan.shuffle,
        seed=plan.seed,
        repeat=repeat,
    )
    validation, validation_steps = None, plan.validation_steps
    if plan.validation is not None:
        validation = data_lib.distribute_dataset(plan.validation, strategy, plan.global_batch_size)
        if validation_steps is None and legacy:
            validation_steps = _tf_keras_steps(
                data_lib.steps_per_pass(plan.validation, plan.global_batch_size),
                "validation_steps",
                "validation_data",
            )
    # shuffle=False: `dataset` is already shuffled as asked (Keras 3 warns that it ignores
    # its default shuffle=True for a dataset)
    try:
        return model.fit(
            dataset,
            epochs=plan.epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=validation,
            validation_steps=validation_steps,
            callbacks=plan.callbacks,
            verbose=plan.verbose,
            shuffle=False,
        )
    except StopIteration as err:  # Keras' bare error for data that yields no batch
        raise ValueError(
            "The data gave no batch: it is empty (e.g. filtered to nothing, or fewer "
            "examples than one batch with drop_remainder=True). HINT: check the dataset "
            "with `for batch in dataset.take(1): print(batch)`."
        ) from err


def _tf_keras_steps(steps: Optional[int], argument: str, what: str) -> int:
    """`steps` of one pass, which tf_keras needs for a distributed dataset; a ValueError naming
    `argument` when the length of `what` is not known."""
    if steps is None:
        raise ValueError(
            f"The {what} is of unknown length (a generator, or a dataset after filter() or "
            f"from_generator()), and tf_keras' fit and evaluate need the number of steps of a "
            f"distributed dataset. HINT: pass {argument}=N (the batches of one pass), or use "
            "Keras 3 (TF_USE_LEGACY_KERAS unset), whose fit ends each epoch with the data."
        )
    return steps


def evaluate(
    model,
    data: Any,
    *,
    strategy=None,
    steps: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    verbose="auto",
    return_dict: bool = True,
):
    """Evaluates a model built by `tfdist.fit` (or in a strategy's scope) on any strategy.

    Args:
        model: keras.Model, compiled, built under `strategy`'s scope.
        data: the same forms as for `tfdist.fit`.
        strategy: tf.distribute.Strategy. Defaults to the strategy the model was built under.
        steps: int. Defaults to one pass over the data when its length is known.
        global_batch_size: int. See `tfdist.fit`.
        return_dict: bool. Return {metric name: value}. Defaults to True.

    Returns:
        dict of metric values (or a list with return_dict=False), aggregated over all replicas.
    """
    _check_steps("steps", steps)
    if strategy is None:
        strategy = getattr(model, "distribute_strategy", None) or _default_strategy()
    verbose = _chief_verbose(verbose)
    source = data_lib.classify(data)  # once: every later step takes the Input
    if _is_parameter_server(strategy):
        return _evaluate_parameter_server(
            model, strategy, source, steps, global_batch_size, verbose, return_dict
        )
    dataset = data_lib.distribute_dataset(source, strategy, global_batch_size)
    if steps is None and flavour.uses_legacy_keras():  # tf_keras needs it for this dataset
        steps = _tf_keras_steps(data_lib.steps_per_pass(source, global_batch_size), "steps", "data")
    return model.evaluate(dataset, steps=steps, verbose=verbose, return_dict=return_dict)


def _evaluate_parameter_server(
    model, strategy, source, steps, global_batch_size, verbose, return_dict
):
    from tfdist import parameter_server
    from tfdist.fixes import apply_fixes

    apply_fixes()  # also for a strategy that tfdist did not make
    if steps is None:
        steps = data_lib.steps_per_pass(source, global_batch_size)
    if steps is None:
        raise ValueError(
            "steps is required to evaluate on parameter_server for data of unknown "
            "length. HINT: steps = number of examples // global_batch_size."
        )
    dataset_fn = data_lib.dataset_fn_for(source, global_batch_size, repeat=True)
    return parameter_server.evaluate_parameter_server(
        model, strategy, dataset_fn, steps=steps, verbose=verbose, return_dict=return_dict
    )


def _check_counts(epochs, steps_per_epoch, validation_steps) -> None:
    """fit's counts: at least one epoch, and step counts as `_check_steps` takes them."""
    if not is_count(epochs, 1):
        raise ValueError(
            f"epochs must be a positive integer. Received: epochs={epochs!r}. HINT: train at "
            "least one epoch, e.g. epochs=1."
        )
    _check_steps("steps_per_epoch", steps_per_epoch)
    _check_steps("validation_steps", validation_steps)


def _check_steps(name: str, value) -> None:
    """Step counts are None (one pass over the data) or a positive int; never 0 or negative
    (Keras reads a negative count as "until the data ends", which on repeated data is never)."""
    if value is not None and not is_count(value, 1):
        raise ValueError(
            f"{name} must be a positive integer or None (one pass over the data). Received: "
            f"{name}={value!r}. HINT: steps = number of examples // global_batch_size."
        )


def _default_strategy():
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _chief_verbose(verbose):
    """Progress bars on the chief only; other tasks stay quiet."""
    if verbose in (0, "0"):
        return 0
    if not task.is_chief():
        return 0
    return verbose
