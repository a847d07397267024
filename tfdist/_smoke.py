"""The 2-process smoke test of `tfdist doctor`: an all-reduce with a known result, then a
3-step multi-worker Keras fit. Prints `SMOKE key=value` lines for the doctor to read."""

import json


def main() -> None:
    import tfdist

    strategy = tfdist.make_strategy(startup_timeout=60)
    import numpy as np
    import tensorflow as tf

    from tfdist import _compat

    spec = tfdist.detect_cluster()
    value = float(spec.task_index + 1)
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(value)), axis=None)
    print(f"SMOKE allreduce={float(total):g}", flush=True)
    keras = _compat.keras()
    x = np.random.RandomState(0).rand(48, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = model.fit(data, epochs=1, verbose=0)
    print(f"SMOKE fit_steps={int(model.optimizer.iterations.numpy())}", flush=True)
    print("SMOKE loss=" + json.dumps(history.history["loss"]), flush=True)


if __name__ == "__main__":
    main()
