"""Parameter-server training under tf_keras (TF_USE_LEGACY_KERAS=1), through its own fit.

tf_keras supports ParameterServerStrategy natively: fit / evaluate go to the model's own `fit`
/ `evaluate` with a `DatasetCreator` of the repeated dataset function. tf_keras refuses
batch-level callbacks with a parameter-server strategy (epoch-level ones work), so verbose=1
becomes one line per epoch.

`loop` and `model` dispatch to it under tf_keras. Holds no state.
"""

from __future__ import annotations

import logging

from tfdist import flavour
from tfdist.parameter_server.checks import check_count
from tfdist.parameter_server.datasets import local_batch, repeating

log = logging.getLogger("tfdist")


def prepare_model(model, strategy, dataset_fn, steps_per_execution, sample_batch):
    """Readies a tf_keras model for its own parameter-server fit / evaluate: checks it was made
    in `strategy`'s scope, builds it on one local batch if its input shape is unknown, and sets
    `steps_per_execution` (when given)."""
    if getattr(model, "distribute_strategy", None) is not strategy:
        raise ValueError(
            "The model was not created inside this parameter-server strategy's scope. HINT: "
            "build and compile it inside `with strategy.scope():`."
        )
    if not model.built:
        if sample_batch is None:
            sample_batch = local_batch("dataset_fn", dataset_fn)
        x = sample_batch[0] if isinstance(sample_batch, (tuple, list)) else sample_batch
        with strategy.scope():
            model(x)
    if steps_per_execution is not None:
        model._configure_steps_per_execution(
            check_count("steps_per_execution", steps_per_execution)
        )


def _tf_keras_verbose(verbose):
    if verbose == 1:  # tf_keras refuses 1 with a ps strategy (a per-batch progress bar)
        log.info(
            "tfdist: tf_keras prints one line per epoch (verbose=2) under ParameterServerStrategy."
        )
        return 2
    return verbose


def fit_tf_keras(
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
    """`fit_parameter_server` under tf_keras: the model's own fit on a DatasetCreator."""
    keras = flavour.keras()
    creator = keras.utils.experimental.DatasetCreator
    prepare_model(model, strategy, dataset_fn, steps_per_execution, sample_batch)
    validation = None
    if validation_dataset_fn is not None:
        validation = creator(repeating("validation_dataset_fn", validation_dataset_fn))
    try:
        return model.fit(
            creator(repeating("dataset_fn", dataset_fn)),
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            callbacks=callbacks,
            verbose=_tf_keras_verbose(verbose),
            validation_data=validation,
            validation_steps=validation_steps,
            initial_epoch=initial_epoch,
        )
    except BaseException:
        # tf_keras calls no on_train_end after an error: a backup callback (see `loop`) then
        # stops turning SIGTERM into a stop.
        backup = getattr(model, "_tfdist_backup", None)
        if backup is not None:
            backup.close()
        raise


def evaluate_tf_keras(
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
    """`evaluate_parameter_server` under tf_keras: the model's own evaluate."""
    keras = flavour.keras()
    prepare_model(model, strategy, dataset_fn, steps_per_execution, sample_batch)
    return model.evaluate(
        keras.utils.experimental.DatasetCreator(repeating("dataset_fn", dataset_fn)),
        steps=steps,
        callbacks=callbacks,
        verbose=_tf_keras_verbose(verbose),
        return_dict=return_dict,
    )
