"""The 2-process job of `tfdist doctor`: an all-reduce with a known result, then the scenarios
that matter on this release (each exercises the Keras fixes of its area) under
multi_worker_mirrored. Prints `SMOKE key=value` lines for the doctor to read: one
`SMOKE scenario:<name>=ok` or `=FAILED <error>` line per scenario."""

import json
import os
import tempfile
import traceback


def _mlp(keras, strategy, **compile_kwargs):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", **compile_kwargs)
    return model


def scenarios(strategy, keras, tf, np, directory):
    """name -> callable() for the checks that matter; each raises when the scenario fails.

    directory: a directory every task sees (the chief writes checkpoints there).
    """
    rng = np.random.RandomState(0)
    x = rng.rand(60, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def fit_on_a_dataset():  # the symbolic build and the mean of the step logs
        model = _mlp(keras, strategy)
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(12)
        history = model.fit(data, epochs=2, verbose=0)
        model.evaluate(data, verbose=0)
        if not history.history["loss"][-1] < history.history["loss"][0]:
            raise AssertionError(f"the loss did not fall: {history.history['loss']}")

    def steps_per_execution():
        model = _mlp(keras, strategy, steps_per_execution=2)
        model.fit(x, y, batch_size=12, epochs=1, verbose=0)
        if int(model.optimizer.iterations.numpy()) != 5:
            raise AssertionError(f"{int(model.optimizer.iterations.numpy())} steps, not 5")

    def checkpoints_and_backup():
        shared = os.path.join(directory, "run")
        model = _mlp(keras, strategy)
        callbacks = [
            keras.callbacks.BackupAndRestore(os.path.join(shared, "backup")),
            keras.callbacks.ModelCheckpoint(
                os.path.join(shared, "e{epoch}.weights.h5"), save_weights_only=True
            ),
        ]
        model.fit(x, y, batch_size=12, epochs=2, callbacks=callbacks, verbose=0)

    def dropout_masks_per_worker():
        with strategy.scope():
            layer = keras.layers.Dropout(0.5)

        @tf.function
        def step():
            return strategy.run(lambda: layer(tf.ones([4, 32]), training=True))

        mask = tf.cast(strategy.experimental_local_results(step())[0] > 0, tf.float32)
        gathered = strategy.gather(strategy.experimental_distribute_values_from_function(
            lambda _: tf.reshape(mask, [1, -1])), axis=0)  # fmt: skip
        if bool(tf.reduce_all(tf.equal(gathered[0], gathered[1]))):
            raise AssertionError("both workers drew the same Dropout mask")

    checks = {
        "fit_on_a_dataset": fit_on_a_dataset,
        "steps_per_execution": steps_per_execution,
        "checkpoints_and_backup": checkpoints_and_backup,
    }
    if hasattr(keras.layers.Dropout(0.5), "seed_generator"):  # Keras 3 (tf_keras: per device)
        checks["dropout_masks_per_worker"] = dropout_masks_per_worker
    return checks


def main(argv=None) -> None:
    import sys

    import tfdist

    argv = sys.argv[1:] if argv is None else argv
    directory = argv[0] if argv else tempfile.mkdtemp(prefix="tfdist-doctor-")
    strategy = tfdist.make_strategy(startup_timeout=60)
    import numpy as np
    import tensorflow as tf

    from tfdist import flavour

    spec = tfdist.detect_cluster()
    value = float(spec.task_index + 1)
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(value)), axis=None)
    print(f"SMOKE allreduce={float(total):g}", flush=True)
    keras = flavour.keras()
    x = np.random.RandomState(0).rand(48, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = model.fit(data, epochs=1, verbose=0)
    print(f"SMOKE fit_steps={int(model.optimizer.iterations.numpy())}", flush=True)
    print("SMOKE loss=" + json.dumps(history.history["loss"]), flush=True)
    for name, check in scenarios(strategy, keras, tf, np, directory).items():
        try:
            check()
            print(f"SMOKE scenario:{name}=ok", flush=True)
        except Exception as err:  # reported by the doctor, with the fix that covers it
            last = traceback.format_exception_only(type(err), err)[-1].strip().splitlines()[0]
            print(f"SMOKE scenario:{name}=FAILED {last[:300]}", flush=True)


if __name__ == "__main__":
    main()
