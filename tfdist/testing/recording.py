"""What one strategy's process does for `assert_same_training`: train the user's model with
`model.fit` under the strategy and record, step by step, everything that should not depend on it.

`record(strategy, build_model, data, options, initial_weights)` runs in a strategy pool's
process (`tfdist.testing.pools`). It builds and compiles the model inside `strategy.scope()`
(the user's `build_model`), switches random layers off, loads `initial_weights` (the reference
run's), and fits on the data in order, `global_batch_size` examples a step, with a callback
that records after every step:

    logs        the loss and metrics Keras reports for the step (the epoch's running values)
    iterations  the optimizer's step counter
    values      every variable: the model's weights, the optimizer's state, the metrics'
                totals and counts (not under parameter_server, whose steps are asynchronous:
                its variables are recorded at the end of each epoch, when fit has joined them)

and, once, each variable's name, group, distributed type, aggregation and synchronization.
The result is plain Python and numpy (picklable): a `Recording` as a dict. Imports TensorFlow
inside `record` only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

import numpy as np

RANDOM_LAYERS = {  # layer class name -> the attribute that makes it draw nothing
    "Dropout": "rate",
    "SpatialDropout1D": "rate",
    "SpatialDropout2D": "rate",
    "SpatialDropout3D": "rate",
    "AlphaDropout": "rate",
    "GaussianDropout": "rate",
    "GaussianNoise": "stddev",
}


def switch_off_random_layers(model) -> List[str]:
    """Sets every random layer's rate (or stddev) to 0, so it passes its input through.

    Returns:
        list of str: "name (Class rate=0.5)" of each layer switched off.
    """
    switched = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        attribute = next(
            (RANDOM_LAYERS[c.__name__] for c in type(layer).__mro__ if c.__name__ in RANDOM_LAYERS),
            None,
        )
        if attribute and getattr(layer, attribute, 0):
            switched.append(
                f"{layer.name} ({type(layer).__name__} {attribute}={getattr(layer, attribute)})"
            )
            setattr(layer, attribute, 0.0)
    return switched


def error_text(err: BaseException, limit: int = 700) -> str:
    """The error in one line: its type and message, without the traceback TensorFlow puts in
    front of a message from inside a tf.function ("in user code: File ...")."""
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # Keras' bold and colours
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    causes = [i for i, line in enumerate(lines) if re.match(r"^[A-Z]\w*(Error|Exception): ", line)]
    if "in user code:" in message and causes:
        lines = lines[causes[-1] :]
        head = ""
    else:
        head = f"{type(err).__name__}: "
    text = head + " ".join(" ".join(lines).split())
    return text if len(text) <= limit else f"{text[: limit - 205]} ... {text[-200:]}"


def _name(variable) -> str:
    return str(getattr(variable, "path", None) or variable.name).replace(":0", "")


def _kind(value) -> str:
    return str(value).rsplit(".", 1)[-1].lower()


def _describe(group: str, variable, prefix: str = "") -> Dict[str, str]:
    inner = getattr(variable, "value", variable)  # Keras 3: the tf.Variable under a KerasVariable
    inner = inner if hasattr(inner, "aggregation") else variable
    return {
        "name": prefix + _name(variable),
        "group": group,
        "type": type(inner).__name__,
        "aggregation": _kind(getattr(inner, "aggregation", getattr(variable, "aggregation", "?"))),
        "synchronization": _kind(getattr(inner, "synchronization", "?")),
    }


def _variables(model) -> list:
    """[(group, variable, prefix)]: the model's weights, the optimizer's, the metrics'."""
    found = [("weight", v, "") for v in model.weights]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables = optimizer.variables
        found += [("optimizer", v, "") for v in (variables() if callable(variables) else variables)]
    for metric in model.metrics:
        found += [("metric", v, metric.name + "/") for v in metric.variables]
    return found


def _read(variable) -> np.ndarray:
    try:
        return np.array(variable.numpy())
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        import tensorflow as tf

        return np.array(tf.convert_to_tensor(getattr(variable, "value", variable)))


def _numbers(logs) -> Dict[str, float]:
    """The scalar logs as floats (a nested dict, as a custom train_step may return, flattened)."""
    result = {}
    for key, value in (logs or {}).items():
        if isinstance(value, dict):
            result.update(_numbers(value))
            continue
        try:
            array = np.asarray(value, dtype="float64")
        except (TypeError, ValueError):
            continue
        if array.size == 1:
            result[key] = float(array.reshape(()))
    return result


def _dataset(tf, data, global_batch_size: int):
    if isinstance(data, dict):
        tensors: Any = dict(data)
    elif isinstance(data, (tuple, list)):
        tensors = tuple(data)
    else:
        tensors = data
    return tf.data.Dataset.from_tensor_slices(tensors).batch(global_batch_size).repeat()


def record(strategy, build_model, data, options: dict, initial_weights=None) -> dict:
    """Trains `build_model()` under `strategy`; returns the recording (see the module)."""
    import tensorflow as tf

    from tfdist import flavour
    from tfdist.launcher.run_function import load_function

    keras = flavour.keras()
    keras.utils.set_random_seed(options["seed"])
    build = load_function(*build_model)
    dataset = _dataset(tf, data, options["global_batch_size"])
    with strategy.scope():
        model = build()
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"build_model() must return a keras.Model (compiled inside it); it returned "
                f"{type(model).__name__}. HINT: end build_model with `model.compile(...); "
                "return model`."
            )
        if getattr(model, "optimizer", None) is None:
            raise ValueError(
                f"build_model() returned the model {model.name!r} without compiling it. HINT: "
                "call model.compile(optimizer=..., loss=...) inside build_model."
            )
        if not model.built:  # a subclassed model: build it on the first batch
            features = next(iter(dataset))
            model(features[0] if isinstance(features, tuple) else features, training=False)
    switched = switch_off_random_layers(model) if options["random_layers"] == "off" else []
    if initial_weights is not None:
        current = model.get_weights()
        shapes = [np.shape(w) for w in current]
        if shapes != [np.shape(w) for w in initial_weights]:
            raise ValueError(
                "build_model() made a model with other weights here than in the reference run "
                f"({len(current)} vs {len(initial_weights)} arrays). HINT: build_model must make "
                "the same model every time it is called."
            )
        model.set_weights(initial_weights)
    recording = {
        "replicas": int(strategy.num_replicas_in_sync),
        "switched_off": switched,
        "initial_weights": model.get_weights(),
        "steps": [],
        "epochs": [],
        "variables": None,
        "error": None,
    }
    per_step = "ParameterServer" not in type(strategy).__name__

    def snapshot() -> List[np.ndarray]:
        variables = _variables(model)
        if recording["variables"] is None or len(recording["variables"]) != len(variables):
            recording["variables"] = [_describe(g, v, p) for g, v, p in variables]
        return [_read(v) for _, v, _ in variables]

    class Recorder(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            entry = {"epoch": self.epoch, "batch": batch, "logs": _numbers(logs)}
            if per_step:
                entry["iterations"] = int(_read(model.optimizer.iterations))
                entry["values"] = snapshot()
            recording["steps"].append(entry)

        def on_epoch_end(self, epoch, logs=None):
            entry = {"epoch": epoch, "step": len(recording["steps"]), "logs": _numbers(logs)}
            entry["iterations"] = int(_read(model.optimizer.iterations))
            entry["values"] = snapshot()
            recording["epochs"].append(entry)

    try:
        model.fit(
            dataset,
            epochs=options["epochs"],
            steps_per_epoch=options["steps"],
            verbose=0,
            callbacks=[Recorder()],
        )
    except Exception as err:  # the comparison reports it, with the step it happened at
        recording["error"] = {"step": len(recording["steps"]) + 1, "text": error_text(err)}
    return recording
