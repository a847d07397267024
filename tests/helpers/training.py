"""tfdist.fit of arrays and of a dataset, epoch by epoch, and what every epoch must have
trained: run on mirrored in the pytest process and on 2 workers."""

import numpy as np

import tfdist

EXAMPLES, BATCH, EPOCHS = 200, 16, 3
ONE_PASS = -(-EXAMPLES // BATCH)  # 13 steps: the last batch of a pass holds 8 examples


def epochs_of_each_fit(strategy=None):
    """tfdist.fit of arrays and of a dataset, with and without steps_per_epoch: the steps
    each epoch trained, the logs, and tfdist.evaluate."""
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1
    strategy = strategy or tfdist.make_strategy()
    rng = np.random.RandomState(0)
    x = rng.rand(EXAMPLES, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    class StepsPerEpoch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps, self.logs = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = int(self.model.optimizer.iterations.numpy())

        def on_epoch_end(self, epoch, logs=None):
            self.steps.append(int(self.model.optimizer.iterations.numpy()) - self.start)
            self.logs.append(sorted(logs))

    results = {"keras": keras.__name__}
    for kind, data in (("arrays", (x, y)), ("dataset", tf.data.Dataset.from_tensor_slices((x, y)))):
        for steps_per_epoch in (None, 5):
            counter = StepsPerEpoch()
            history = tfdist.fit(
                build,
                data,
                strategy=strategy,
                global_batch_size=BATCH,
                epochs=EPOCHS,
                steps_per_epoch=steps_per_epoch,
                validation_data=(x[:50], y[:50]),
                callbacks=[counter],
                verbose=0,
            )
            results[kind, steps_per_epoch] = {
                "steps": counter.steps,
                "logs": counter.logs,
                "evaluate": tfdist.evaluate(
                    history.model, (x, y), strategy=strategy, global_batch_size=BATCH, verbose=0
                ),
            }
    return results


def _assert_every_epoch_trained_its_steps(results):
    for kind in ("arrays", "dataset"):
        # one pass per epoch; or exactly steps_per_epoch, the data repeated (a pass of 13
        # steps used to run out in the third epoch of 5: 5, 5, 3)
        assert results[kind, None]["steps"] == [ONE_PASS] * EPOCHS, kind
        assert results[kind, 5]["steps"] == [5] * EPOCHS, kind
        for steps_per_epoch in (None, 5):
            run = results[kind, steps_per_epoch]
            assert run["logs"] == [["loss", "val_loss"]] * EPOCHS
            assert set(run["evaluate"]) == {"loss"}
        assert results[kind, None]["evaluate"]["loss"] < 0.5  # it learned (sum of 4 uniforms)
