"""The plain Keras idiom under a strategy, scenario by scenario.

Each scenario takes a strategy and returns plain data (numbers, lists), so the same code runs
in the test process (mirrored on virtual CPUs), in local multi-process clusters, on tf_keras
(TF_USE_LEGACY_KERAS=1) and with tfdist's Keras fixes turned off (TFDIST_KERAS_FIXES=0).
`run_all` runs a list of scenarios and records each one's result or error, so one process
(whose start costs seconds) serves many checks.
"""

import hashlib
import traceback

import numpy as np

from tfdist import flavour


def keras():
    return flavour.keras()


def fix_state(name: str) -> str:
    """The state of tfdist's fix `name` on the Keras of this process (applied, not needed...)."""
    from tfdist import fixes

    return {status.name: status.state for status in fixes.report()}[name]


def fails_upstream(result: dict, fix: str, *texts: str) -> None:
    """Asserts how a scenario behaves without tfdist's fixes (`result`: one run_all entry).

    Where this Keras release needs `fix`, the scenario fails with one of `texts` (the upstream
    error; its wording differs between releases). Where the fix is "not needed" (the release
    has no such bug), the scenario passes upstream too: that is the proof it is not needed.
    """
    from tfdist.fixes.record import NOT_NEEDED

    where = f"Keras {flavour.keras_version()}"
    if fix_state(fix) == NOT_NEEDED:
        assert "ok" in result, (
            f"{fix} is 'not needed' on {where}, but the scenario fails without it: "
            f"{result.get('error')}"
        )
        return
    assert "error" in result, f"passed on {where} without tfdist's fix {fix}: {result}"
    assert any(text in result["error"] for text in texts), result["error"]


def tf():
    import tensorflow

    return tensorflow


def digest(model) -> str:
    return hashlib.md5(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()


def regression_data(n=101, features=4, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, features).astype("float32")
    y = (x @ np.arange(1, features + 1, dtype="float32")[:, None] / features + 0.1).astype(
        "float32"
    )
    return x, y


def mlp(strategy, features=4, optimizer=None, seed=1, **compile_kwargs):
    """A small regression MLP built and compiled in `strategy`'s scope.

    Its initial weights come from numpy (seeded), not from Keras' initialisers, so they are the
    same on every Keras release and on tf_keras: results compare across flavours and versions.
    optimizer: a callable() -> optimizer, called inside the scope. Defaults to SGD(0.05).
    """
    k = keras()
    k.utils.set_random_seed(seed)
    with strategy.scope():
        model = k.Sequential(
            [k.Input((features,)), k.layers.Dense(8, activation="relu"), k.layers.Dense(1)]
        )
        model.compile(
            optimizer=optimizer() if optimizer else k.optimizers.SGD(0.05),
            loss="mse",
            metrics=["mae"],
            **compile_kwargs,
        )
        rng = np.random.RandomState(seed)
        model.set_weights(
            [rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()]
        )
    return model


def steps_per_call(model) -> int:
    """The model's steps_per_execution (tf_keras keeps it in a variable)."""
    if flavour.uses_legacy_keras():
        return int(model._steps_per_execution.numpy())
    return int(model.steps_per_execution)


def weights(model):
    return [np.asarray(w).tolist() for w in model.get_weights()]


def max_difference(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


# ------------------------------------------------------------------------------ scenarios


def validation_split_uneven(strategy):
    """fit(x, y, validation_split=0.1): 101 examples, batch 10, last batches uneven."""
    x, y = regression_data(101)
    model = mlp(strategy)
    history = model.fit(
        x, y, batch_size=10, epochs=3, validation_split=0.1, shuffle=False, verbose=0
    )
    return {"loss": history.history["loss"], "val_loss": history.history["val_loss"]}


def uneven_batches(strategy):
    """Batches of 7 do not split evenly over the replicas; fit and evaluate still work, and
    train as on one device."""
    tf_ = tf()
    x, y = regression_data(70)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(7)
    model = mlp(strategy)
    history = model.fit(data, epochs=3, verbose=0)
    one_device = mlp(tf_.distribute.get_strategy()).fit(data, epochs=3, verbose=0)
    return {
        "loss": history.history["loss"],
        "one_device_loss": one_device.history["loss"],
        "evaluate": model.evaluate(data, verbose=0),
        "predict_shape": list(np.asarray(model.predict(data, verbose=0)).shape),
    }


def uneven_split_matches_one_device(strategy):
    """Batches of 7 on the replicas (2, 2, 2, 1 on 4; the last batch of 1): the weights and
    every step's logged loss and mae equal one-device training's."""
    k, tf_ = keras(), tf()
    x, y = regression_data(64)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(7)
    results = {}
    for name, s in (("strategy", strategy), ("one_device", tf_.distribute.get_strategy())):
        logged = []
        callback = k.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs, logged=logged: logged.append(
                [float(logs["loss"]), float(logs["mae"])]
            )
        )
        model = mlp(s)
        model.fit(data, epochs=2, verbose=0, callbacks=[callback])
        results[name] = {"weights": weights(model), "logs": np.array(logged)}
    logs_a, logs_b = results["strategy"]["logs"], results["one_device"]["logs"]
    return {
        "max_weight_difference": max_difference(
            results["strategy"]["weights"], results["one_device"]["weights"]
        ),
        "max_log_difference": float(
            np.max(np.abs(logs_a - logs_b) / np.maximum(np.abs(logs_b), 1e-8))
        )
        if logs_a.shape == logs_b.shape
        else float("inf"),
        "moved": max_difference(
            results["strategy"]["weights"], weights(mlp(tf_.distribute.get_strategy()))
        ),
    }


def matches_one_device(strategy, batch_size=8, epochs=2):
    """With even batches and a fixed input order, training equals one-device training."""
    tf_ = tf()
    x, y = regression_data(64)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)
    results = {}
    for name, s in (("strategy", strategy), ("one_device", tf_.distribute.get_strategy())):
        model = mlp(s)
        history = model.fit(data, epochs=epochs, verbose=0)
        results[name] = {"weights": weights(model), "loss": history.history["loss"]}
    return {
        "loss": results["strategy"]["loss"],
        "max_weight_difference": max_difference(
            results["strategy"]["weights"], results["one_device"]["weights"]
        ),
        "moved": max_difference(
            results["strategy"]["weights"], weights(mlp(tf_.distribute.get_strategy()))
        ),
    }


def string_inputs(strategy):
    """String features through a StringLookup layer inside the model."""
    k, tf_ = keras(), tf()
    words = np.array(["red", "green", "blue", "red", "blue", "green"] * 6)
    labels = np.array([(w == "red") * 1.0 for w in words], dtype="float32")[:, None]
    data = tf_.data.Dataset.from_tensor_slices((tf_.constant(words), labels)).batch(6)
    k.utils.set_random_seed(0)
    with strategy.scope():
        inputs = k.Input(shape=(), dtype="string")
        lookup = k.layers.StringLookup(vocabulary=["red", "green", "blue"])
        hidden = k.layers.Embedding(4, 4)(lookup(inputs))
        model = k.Model(inputs, k.layers.Dense(1, activation="sigmoid")(hidden))
        model.compile(k.optimizers.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    history = model.fit(data, epochs=8, verbose=0)
    predictions = model.predict(tf_.constant(["red", "blue"]), verbose=0)
    return {
        "loss": history.history["loss"],
        "accuracy": history.history["accuracy"][-1],
        "predictions": np.asarray(predictions).ravel().tolist(),
    }


def steps_per_execution(strategy):
    """compile(steps_per_execution=3) reaches the same weights as one step per call."""
    x, y = regression_data(100)
    results = {}
    for spe in (1, 3):
        model = mlp(strategy, steps_per_execution=spe)
        history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
        results[spe] = {
            "weights": weights(model),
            "loss": history.history["loss"],
            "iterations": int(model.optimizer.iterations.numpy()),
            "evaluate": model.evaluate(x, y, batch_size=10, verbose=0),
        }
    one_device = mlp(tf().distribute.get_strategy(), steps_per_execution=3)
    one_device.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    return {
        "iterations": results[3]["iterations"],
        "one_device_iterations": int(one_device.optimizer.iterations.numpy()),
        "loss": results[3]["loss"],
        "max_weight_difference": max_difference(results[1]["weights"], results[3]["weights"]),
        "max_log_difference": max_difference(
            [results[1]["loss"], results[1]["evaluate"]],
            [results[3]["loss"], results[3]["evaluate"]],
        ),
    }


def chosen_steps_per_execution(strategy):
    """fit of 2 epochs of 30 steps with validation, then evaluate: the steps per call seen at
    each epoch, and the same with a callback that reads every step (on the chief only)."""
    k, tf_ = keras(), tf()
    from tfdist import task

    x, y = regression_data(480)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(16)

    class Seen(k.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps_per_execution = []

        def on_epoch_begin(self, epoch, logs=None):
            self.steps_per_execution.append(steps_per_call(self.model))

    class EveryStep(k.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    results = {}
    for name, every_step in (("chosen", False), ("every_step", True)):
        model, seen = mlp(strategy), Seen()
        callbacks = [seen] + ([EveryStep()] if every_step and task.is_chief() else [])
        history = model.fit(
            data.repeat(),
            epochs=2,
            steps_per_epoch=30,
            validation_data=data,
            verbose=0,
            callbacks=callbacks,
        )
        results[name] = {
            "seen": seen.steps_per_execution,
            "after": steps_per_call(model),
            "iterations": int(model.optimizer.iterations.numpy()),
            "history": history.history,
            "weights": weights(model),
            "evaluate": model.evaluate(data, verbose=0),
        }
    chosen, every_step = results["chosen"], results["every_step"]
    fix = "tf_keras_steps_per_execution_chosen" if flavour.uses_legacy_keras() else None
    return {
        "state": fix_state(fix or "steps_per_execution_chosen"),
        "seen": chosen["seen"],
        "seen_with_a_step_callback": every_step["seen"],
        "after": chosen["after"],
        "iterations": [chosen["iterations"], every_step["iterations"]],
        "max_weight_difference": max_difference(chosen["weights"], every_step["weights"]),
        "max_log_difference": max_difference(
            [chosen["history"][key] for key in sorted(chosen["history"])] + [chosen["evaluate"]],
            [every_step["history"][key] for key in sorted(every_step["history"])]
            + [every_step["evaluate"]],
        ),
    }


def gradient_accumulation(strategy):
    """optimizer(gradient_accumulation_steps=2) matches the same on one device."""
    k, tf_ = keras(), tf()
    x, y = regression_data(64)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(8)
    results = {}
    for name, s in (("strategy", strategy), ("one_device", tf_.distribute.get_strategy())):
        model = mlp(s, optimizer=lambda: k.optimizers.Adam(0.01, gradient_accumulation_steps=2))
        model.fit(data, epochs=1, verbose=0)
        results[name] = {
            "weights": weights(model),
            "iterations": int(model.optimizer.iterations.numpy()),
        }
    return {
        "iterations": results["strategy"]["iterations"],
        "one_device_iterations": results["one_device"]["iterations"],
        "max_weight_difference": max_difference(
            results["strategy"]["weights"], results["one_device"]["weights"]
        ),
        "moved": max_difference(
            results["strategy"]["weights"], weights(mlp(tf_.distribute.get_strategy()))
        ),
    }


def dropout_masks(strategy):
    """Dropout draws a different mask on each replica, reproducibly."""
    k, tf_ = keras(), tf()

    def masks(seed):
        k.utils.set_random_seed(seed)
        with strategy.scope():
            layer = k.layers.Dropout(0.5)

        @tf_.function
        def step():
            return strategy.run(lambda: layer(tf_.ones([4, 64]), training=True))

        return [np.asarray(t).tolist() for t in strategy.experimental_local_results(step())]

    first, again = masks(7), masks(7)
    digests = [hashlib.md5(np.asarray(m).tobytes()).hexdigest() for m in first]
    return {
        "replicas": len(first),
        "distinct_masks": len(set(digests)),
        "reproducible": first == again,
        "digests": digests,
    }


def embedding_and_jit(strategy):
    """Sparse Embedding gradients train; jit_compile=True trains (without XLA across replicas)."""
    import warnings

    k, tf_ = keras(), tf()
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, 50, size=(64, 5))
    labels = (tokens.sum(1, keepdims=True) > 125).astype("float32")
    data = tf_.data.Dataset.from_tensor_slices((tokens, labels)).batch(16)
    results = {}
    for jit in (False, True):
        k.utils.set_random_seed(3)
        with strategy.scope():
            model = k.Sequential(
                [
                    k.Input((5,), dtype="int32"),
                    k.layers.Embedding(50, 8),
                    k.layers.GlobalAveragePooling1D(),
                    k.layers.Dense(1, activation="sigmoid"),
                ]
            )
            model.compile(k.optimizers.SGD(0.5), "binary_crossentropy", jit_compile=jit)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = model.fit(data, epochs=4, verbose=0)
        results[f"jit_{jit}"] = {
            "loss": history.history["loss"],
            "warnings": [str(w.message) for w in caught if "jit_compile" in str(w.message)],
        }
    return results


def fit_evaluate_predict(strategy):
    """A dataset of (x, y), of dict inputs, and with sample weights; evaluate; predict."""
    k, tf_ = keras(), tf()
    x, y = regression_data(64)
    sample_weight = np.linspace(0.5, 1.5, 64).astype("float32")
    results = {}
    model = mlp(strategy)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(16)
    results["xy_loss"] = model.fit(data, epochs=3, verbose=0).history["loss"]
    results["evaluate"] = model.evaluate(data, verbose=0)
    predictions = model.predict(tf_.data.Dataset.from_tensor_slices(x).batch(16), verbose=0)
    results["predict_shape"] = list(np.asarray(predictions).shape)
    results["predict_matches_call"] = float(
        np.max(np.abs(np.asarray(predictions) - np.asarray(model(x))))
    )
    results["xy_weights"] = digest(model)
    weighted = mlp(strategy)
    data_w = tf_.data.Dataset.from_tensor_slices((x, y, sample_weight)).batch(16)
    results["weighted_loss"] = weighted.fit(data_w, epochs=2, verbose=0).history["loss"]
    results["weighted_weights"] = digest(weighted)
    k.utils.set_random_seed(1)
    with strategy.scope():
        a, b = k.Input((2,), name="a"), k.Input((2,), name="b")
        out = k.layers.Dense(1)(k.layers.Concatenate()([a, b]))
        named = k.Model({"a": a, "b": b}, out)
        named.compile(k.optimizers.SGD(0.05), "mse")
    data_d = tf_.data.Dataset.from_tensor_slices(({"a": x[:, :2], "b": x[:, 2:]}, y)).batch(16)
    results["dict_loss"] = named.fit(data_d, epochs=3, verbose=0).history["loss"]
    results["dict_weights"] = digest(named)
    return results


def _functions_in(function) -> list:
    """The tf.functions a Keras train function closes over, however deep."""
    found = []
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if hasattr(value, "_list_all_concrete_functions"):
            found.append(value)
        elif callable(value) and getattr(value, "__closure__", None) and value is not function:
            found += _functions_in(value)
    return found


def _ops_in(concrete, op: str) -> int:
    graph = concrete.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return sum(node.op == op for node in nodes)


def all_reduces_per_step(strategy):
    """One step of fit with one log (the loss) and with three (loss, mae, mse): the
    all-reduces in the traced step of each, and the step's logs on this worker."""
    k, tf_ = keras(), tf()
    x, y = regression_data(64)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(16)
    results = {}
    for name, metrics in (("one_log", []), ("three_logs", ["mae", "mse"])):
        with strategy.scope():
            model = k.Sequential([k.Input((4,)), k.layers.Dense(8), k.layers.Dense(1)])
            model.compile(k.optimizers.SGD(0.01), "mse", metrics=metrics)
        model.fit(data, verbose=0)
        model.make_train_function()  # one step per call
        logs = model.train_function(iter(strategy.experimental_distribute_dataset(data)))
        results[name] = {
            "logs": {key: float(value) for key, value in logs.items()},
            "all_reduces": max(
                _ops_in(concrete, "CollectiveReduceV2")
                for function in _functions_in(model.train_function)
                for concrete in function._list_all_concrete_functions()
            ),
        }
    return results


def optimizer_made_outside_the_scope(strategy):
    """An optimizer created before strategy.scope() is refused with the fix."""
    k = keras()
    optimizer = k.optimizers.Adam(0.01)
    x, y = regression_data(16)
    with strategy.scope():
        model = k.Sequential([k.Input((4,)), k.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return {"trained": True}


def loss_scale_disagreement(strategy):
    """mixed_float16: replicas 1..3 overflow in the first step, replica 0 does not."""
    k, tf_ = keras(), tf()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    y[4:16] *= 1e7
    previous = k.mixed_precision.global_policy()
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        k.utils.set_random_seed(0)
        with strategy.scope():
            model = k.Sequential(
                [
                    k.Input((4,)),
                    k.layers.Dense(16, activation="relu"),
                    k.layers.Dense(1, dtype="float32"),
                ]
            )
            model.compile(k.optimizers.SGD(0.01), "mse")
        model.fit(tf_.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
    finally:
        k.mixed_precision.set_global_policy(previous)
    return {"finite": bool(all(np.isfinite(np.asarray(w)).all() for w in model.get_weights()))}


def run_all(strategy, names):
    """Runs scenarios by name; returns {name: {"ok": result} or {"error": text}}."""
    results = {}
    for name in names:
        try:
            results[name] = {"ok": globals()[name](strategy)}
        except Exception as err:  # recorded: the tests assert on the upstream error text
            results[name] = {
                "error": f"{type(err).__name__}: {err}",
                "where": traceback.format_exc(limit=-3),
            }
    return results


def progress_bar(strategy):
    """fit(verbose=1) between two markers: Keras' progress bar, where it is shown."""
    x, y = regression_data(48)
    model = mlp(strategy)
    print("PROGRESS-START", flush=True)
    model.fit(x, y, batch_size=16, epochs=1, verbose=1)
    print("PROGRESS-END", flush=True)
    return {}


MIRRORED = [
    "validation_split_uneven",
    "uneven_batches",
    "matches_one_device",
    "string_inputs",
    "steps_per_execution",
    "gradient_accumulation",
    "dropout_masks",
    "embedding_and_jit",
    "fit_evaluate_predict",
    "optimizer_made_outside_the_scope",
    "loss_scale_disagreement",
]
MULTI_WORKER = [
    "fit_evaluate_predict",
    "matches_one_device",
    "gradient_accumulation",
    "steps_per_execution",
    "dropout_masks",
    "progress_bar",
    "all_reduces_per_step",
]
NOT_IN_TF_KERAS = {
    "all_reduces_per_step",
    "gradient_accumulation",
    "optimizer_made_outside_the_scope",
    "loss_scale_disagreement",
}


def in_subprocess_mirrored(names, cpus=4):
    """For run_cluster(workers=1): the scenarios on `cpus` virtual CPUs, in a fresh process."""
    import tfdist

    tfdist.virtual_cpus(cpus)
    strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
    return run_all(strategy, names)


def in_multi_worker(names):
    """For run_cluster(workers=2): the scenarios under multi_worker_mirrored from TF_CONFIG."""
    import tfdist

    strategy = tfdist.make_strategy()
    return {
        "strategy": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "results": run_all(strategy, names),
    }


class _Interrupt(Exception):
    pass


def backup_and_restore(directory, interrupt_after_epoch=None, epochs=4):
    """For run_cluster(workers=2): fit with ModelCheckpoint + BackupAndRestore in `directory`.

    With `interrupt_after_epoch`, both workers stop with an exception at the end of that
    epoch (a crash after the backup was written). Returns the epochs each run trained, the
    final weights, and the weights of an uninterrupted run made in the same process.
    """
    import os

    import tfdist

    k, tf_ = keras(), tf()
    strategy = tfdist.make_strategy()
    x, y = regression_data(64)
    data = tf_.data.Dataset.from_tensor_slices((x, y)).batch(8)
    trained = []

    class Record(k.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            trained.append(epoch)

        def on_epoch_end(self, epoch, logs=None):
            if epoch == interrupt_after_epoch:
                raise _Interrupt(f"interrupted after epoch {epoch}")

    model = mlp(strategy)
    callbacks = [
        k.callbacks.BackupAndRestore(os.path.join(directory, "backup")),
        k.callbacks.ModelCheckpoint(
            os.path.join(directory, "epoch{epoch}.weights.h5"), save_weights_only=True
        ),
        Record(),
    ]
    history = model.fit(data, epochs=epochs, callbacks=callbacks, verbose=0)
    reference = mlp(strategy)
    reference.fit(data, epochs=epochs, verbose=0)
    return {
        "trained_epochs": trained,
        "history_epochs": history.epoch,
        "max_weight_difference": max_difference(weights(model), weights(reference)),
        "chief": strategy.extended.should_checkpoint,
    }
