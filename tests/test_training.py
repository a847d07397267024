"""tfdist.fit / tfdist.evaluate on mirrored and multi_worker_mirrored: every epoch trains its
steps, on Keras 3 and tf_keras.

Tier 1: steps_per_pass. Tier 2: mirrored on the logical CPUs of the pytest process (Keras 3).
Tier 3: 2 workers, once with Keras 3 and once with tf_keras (TF_USE_LEGACY_KERAS=1).
"""

import numpy as np
import pytest

import tfdist
from tfdist.data import steps_per_pass

EXAMPLES, BATCH, EPOCHS = 200, 16, 3
ONE_PASS = -(-EXAMPLES // BATCH)  # 13 steps: the last batch of a pass holds 8 examples


def test_steps_per_pass_counts_the_global_batches_of_known_data():
    import tensorflow as tf

    x = np.zeros((EXAMPLES, 4), "float32")
    assert steps_per_pass((x, x[:, :1]), BATCH) == ONE_PASS
    assert steps_per_pass({"a": x}, 50) == 4
    assert steps_per_pass(x) is None  # arrays need the batch size
    unbatched = tf.data.Dataset.from_tensor_slices(x)
    assert steps_per_pass(unbatched, BATCH) == ONE_PASS
    assert steps_per_pass(unbatched.batch(BATCH)) == ONE_PASS
    assert steps_per_pass(unbatched.repeat(), BATCH) is None  # infinite
    assert steps_per_pass(unbatched.filter(lambda v: True), BATCH) is None  # unknown
    assert steps_per_pass(lambda context: unbatched) is None  # a dataset function


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


def test_each_epoch_trains_its_steps_on_mirrored():
    strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
    assert strategy.num_replicas_in_sync > 1
    _assert_every_epoch_trained_its_steps(epochs_of_each_fit(strategy))


FLAVOURS = {"keras3": {}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.fixture(scope="module")
def two_workers():
    """Both flavours' 2-worker jobs, at the same time."""
    import concurrent.futures

    from tfdist.testing import run_cluster

    with concurrent.futures.ThreadPoolExecutor(len(FLAVOURS)) as pool:
        futures = {
            flavour: pool.submit(run_cluster, epochs_of_each_fit, workers=2, env=env, timeout=300)
            for flavour, env in FLAVOURS.items()
        }
        return {flavour: future.result() for flavour, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_each_epoch_trains_its_steps_on_two_workers(two_workers, flavour):
    # tf_keras needs the steps of a distributed dataset ("When providing a distributed
    # dataset, you must specify the number of steps to run"): tfdist gives them
    first, second = (two_workers[flavour][f"worker:{i}"].value for i in range(2))
    assert first["keras"].startswith("tf_keras") == (flavour == "tf_keras")
    _assert_every_epoch_trained_its_steps(first)
    assert first == second
