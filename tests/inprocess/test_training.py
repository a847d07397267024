"""tfdist.fit / tfdist.evaluate: every epoch trains its steps.

Tier 1: steps_per_pass (on real datasets). Tier 2: mirrored on the logical CPUs of the pytest
process (Keras 3). Tier 3, 2 workers with Keras 3 and with tf_keras:
tests/cluster/test_training_workers.py.
"""

import numpy as np

import tfdist
from tfdist.data import steps_per_pass

from helpers.training import (
    BATCH,
    EXAMPLES,
    ONE_PASS,
    _assert_every_epoch_trained_its_steps,
    epochs_of_each_fit,
)


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


def test_each_epoch_trains_its_steps_on_mirrored():
    strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
    assert strategy.num_replicas_in_sync > 1
    _assert_every_epoch_trained_its_steps(epochs_of_each_fit(strategy))


def test_fit_and_evaluate_classify_each_input_once(monkeypatch):
    """Each input of tfdist.fit / tfdist.evaluate is classified once (tfdist.data.classify), and
    every later step (steps of a pass, the distributed dataset, the checks) takes that Input:
    arrays are converted once, however many steps read them."""
    import tensorflow as tf

    from tfdist import data as data_lib
    from tfdist.data import inputs

    classified = []
    original = inputs.classify

    def counting(data):
        classified.append(data)
        return original(data)

    monkeypatch.setattr(inputs, "classify", counting)
    monkeypatch.setattr(data_lib, "classify", counting)
    keras = tf.keras
    x = np.zeros((EXAMPLES, 4), "float32")
    train, validation = (x, x[:, :1]), tf.data.Dataset.from_tensor_slices((x[:50], x[:50, :1]))

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    strategy = tfdist.make_strategy("one_device", cluster=tfdist.ClusterSpec({}))
    history = tfdist.fit(
        build,
        train,
        strategy=strategy,
        global_batch_size=BATCH,
        epochs=2,
        steps_per_epoch=3,  # a repeated pass: the steps of one pass are read too
        validation_data=validation,
        verbose=0,
    )
    assert [id(data) for data in classified] == [id(train), id(validation)]
    classified.clear()
    tfdist.evaluate(history.model, train, strategy=strategy, global_batch_size=BATCH, verbose=0)
    assert [id(data) for data in classified] == [id(train)]


def test_data_of_unknown_length_under_tf_keras_is_refused_with_the_steps_to_give(monkeypatch):
    """tf_keras' fit needs the steps of a distributed dataset (its own error: "When providing a
    distributed dataset, you must specify the number of steps to run"): tfdist names the
    argument that gives them, before fit. Only the check is tf_keras' here."""
    import tensorflow as tf

    from tfdist import flavour

    strategy = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
    x = np.zeros((EXAMPLES, 4), "float32")
    unknown = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).filter(lambda a, b: True)
    keras = flavour.keras()

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    monkeypatch.setattr(flavour, "uses_legacy_keras", lambda: True)
    for call, argument in (
        (
            lambda: tfdist.fit(build, unknown, strategy=strategy, global_batch_size=BATCH),
            "steps_per_epoch",
        ),
        (
            lambda: tfdist.fit(
                build, (x, x[:, :1]), strategy=strategy, global_batch_size=BATCH,
                validation_data=unknown,
            ),
            "validation_steps",
        ),
    ):  # fmt: skip
        try:
            call()
        except ValueError as err:
            assert f"HINT: pass {argument}=N" in str(err) and "unknown length" in str(err), err
        else:
            raise AssertionError(f"no ValueError naming {argument}")
