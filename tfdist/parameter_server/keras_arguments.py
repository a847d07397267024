"""Keras' own fit / evaluate arguments, on a model's parameter-server strategy.

`model.fit(x, y, batch_size, ...)` and `model.evaluate(...)` arguments (numpy arrays, dicts of
them, or a batched tf.data.Dataset) turned into tfdist's dataset-function form, then trained by
`loop`. tfdist's Keras fixes (tfdist.fixes.parameter_server) install `keras_fit` /
`keras_evaluate` as `model.fit` / `model.evaluate` for models built in a parameter_server
scope. Arrays are sharded over the workers (each repeats its shard); an epoch is one pass over
the data unless steps are given. Holds no state.
"""

from __future__ import annotations

from tfdist.parameter_server.checks import check_count
from tfdist.parameter_server.loop import evaluate_parameter_server, fit_parameter_server

__all__ = ["keras_evaluate", "keras_fit"]


def _keras_data(x, y, sample_weight, batch_size, shuffle: bool, what: str):
    """(dataset_fn, steps of one pass or None) for model.fit / evaluate arguments."""
    import tensorflow as tf

    from tfdist import data as data_lib

    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError(
                f"`{what}` got a tf.data.Dataset as x and also y or sample_weight. HINT: put "
                "them in the dataset's elements: (x, y) or (x, y, sample_weight)."
            )
        source = data_lib.classify(x)  # once: both steps take the Input
        # an empty dataset gives no default step count either
        return data_lib.dataset_fn_for(source, repeat=True), data_lib.steps_per_pass(source) or None
    if x is None or callable(x):
        raise TypeError(
            f"`{what}` on parameter_server takes numpy arrays (or dicts of them) or a batched "
            f"tf.data.Dataset. Received: x={x!r} (of type {type(x).__name__}). HINT: for a "
            "dataset function of an InputContext use tfdist.fit(build_model, dataset_fn, ...)."
        )
    data = (
        x
        if y is None and sample_weight is None
        else ((x, y) if sample_weight is None else (x, y, sample_weight))
    )
    batch_size = 32 if batch_size is None else batch_size  # Keras' default
    source = data_lib.classify(data)  # once: both steps take the Input
    return (
        data_lib.dataset_fn_for(source, batch_size, shuffle=shuffle, repeat=True),
        data_lib.steps_per_pass(source, batch_size),
    )


def _keras_steps(name: str, given, one_pass, what: str) -> int:
    if given is not None:
        return check_count(name, given)
    if one_pass is None:
        raise ValueError(
            f"`{what}` on parameter_server needs `{name}` for a dataset of unknown or infinite "
            f"length: every worker reads its own repeated input. Received: {name}=None. HINT: "
            f"{name}=<batches per epoch>, e.g. examples // global batch size."
        )
    return one_pass


def keras_fit(
    model,
    *,
    x=None,
    y=None,
    batch_size=None,
    epochs=1,
    verbose="auto",
    callbacks=None,
    validation_split=0.0,
    validation_data=None,
    shuffle=True,
    class_weight=None,
    sample_weight=None,
    initial_epoch=0,
    steps_per_epoch=None,
    validation_steps=None,
    validation_batch_size=None,
    validation_freq=1,
):
    """Keras 3's `model.fit` arguments, on the model's parameter-server strategy.

    Installed by tfdist's Keras fixes as `model.fit` for models built in a parameter_server
    scope. Arrays are sharded over the workers (each repeats its shard); an epoch is
    `steps_per_epoch` steps over all workers, by default one pass over the data
    (ceil(examples / batch_size), or the batches of a finite dataset).
    """
    if class_weight is not None:
        raise ValueError(
            "`fit` on parameter_server does not take class_weight. Received: class_weight="
            f"{class_weight!r}. HINT: weight the examples instead: "
            "sample_weight=np.take(weights, y)."
        )
    if validation_freq != 1:
        raise ValueError(
            "`fit` on parameter_server validates after every epoch. Received: "
            f"validation_freq={validation_freq!r}. HINT: leave validation_freq=1."
        )
    import tensorflow as tf

    if validation_split and validation_data is None:
        from keras.src.trainers.data_adapters import array_slicing

        if isinstance(x, tf.data.Dataset):
            raise ValueError(
                "validation_split needs arrays, not a tf.data.Dataset (as in Keras). HINT: "
                "pass validation_data= instead."
            )
        (x, y, sample_weight), validation_data = array_slicing.train_validation_split(
            (x, y, sample_weight), validation_split=validation_split
        )
    dataset_fn, one_pass = _keras_data(x, y, sample_weight, batch_size, shuffle, "fit")
    steps_per_epoch = _keras_steps("steps_per_epoch", steps_per_epoch, one_pass, "fit")
    validation_fn = None
    if validation_data is not None:
        from keras.src.trainers.data_adapters import data_adapter_utils

        if isinstance(validation_data, tf.data.Dataset):
            val = (validation_data, None, None)
        else:
            val = data_adapter_utils.unpack_x_y_sample_weight(validation_data)
        validation_fn, val_pass = _keras_data(
            *val, validation_batch_size or batch_size, False, "fit"
        )
        validation_steps = _keras_steps("validation_steps", validation_steps, val_pass, "fit")
    return fit_parameter_server(
        model,
        model._distribute_strategy,
        dataset_fn,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=verbose,
        validation_dataset_fn=validation_fn,
        validation_steps=validation_steps,
        initial_epoch=initial_epoch,
    )


def keras_evaluate(
    model,
    *,
    x=None,
    y=None,
    batch_size=None,
    verbose="auto",
    sample_weight=None,
    steps=None,
    callbacks=None,
    return_dict=False,
):
    """Keras 3's `model.evaluate` arguments, on the model's parameter-server strategy: the
    aggregate over `steps` batches (by default one pass over the data) read by all workers."""
    dataset_fn, one_pass = _keras_data(x, y, sample_weight, batch_size, False, "evaluate")
    return evaluate_parameter_server(
        model,
        model._distribute_strategy,
        dataset_fn,
        steps=_keras_steps("steps", steps, one_pass, "evaluate"),
        callbacks=callbacks,
        verbose=verbose,
        return_dict=return_dict,
    )
