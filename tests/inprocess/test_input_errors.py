"""An exception raised by the user's input surfaces from fit; the data's real end ends the epoch.

Under a strategy, Keras 3.5 and later take a batch through an iterator of their own before the
epoch, to build the model, and drop that iterator: on a Python generator it read the first
batches, and an exception the generator raised there, away from the epoch, which then ended as
if the data ran out (tfdist/fixes/datasets.py, `python_generator_read_once`). Here, on mirrored
over the logical CPUs, for each kind of Python input: the generator's exception comes out of
fit, evaluate, tfdist.fit and a custom loop, naming its type and message; a generator that ends
(with an uneven last batch), a dataset of unknown cardinality with steps_per_epoch=None and an
iterator that raises StopIteration end the epoch normally, after every batch. Keras 3 and
tf_keras (TF_USE_LEGACY_KERAS=1: tfdist's tf_keras_steps_per_execution_chosen keeps one step a
call where tf_keras cannot count the steps).
"""

import numpy as np
import pytest

import tfdist

keras = tfdist.flavour.keras()
BATCHES, BAD, BATCH, LAST = 20, 4, 8, 5  # the 5th of 20 batches raises; the last has 5 examples
SHOWN = f"ValueError: bad record {BAD}"  # the generator's exception, as TensorFlow carries it


@pytest.fixture(scope="module")
def strategy(virtual_cpus):
    made = tfdist.make_strategy("mirrored", cluster=tfdist.ClusterSpec({}))
    assert made.num_replicas_in_sync == len(virtual_cpus) > 1
    return made


def batches(bad=None):
    """20 batches of (x, y): the last of LAST examples; batch `bad` raises ValueError."""
    for i in range(BATCHES):
        if i == bad:
            raise ValueError(f"bad record {i}")
        size = LAST if i == BATCHES - 1 else BATCH
        yield np.full((size, 4), i, "float32"), np.ones((size, 1), "float32")


class Batches:
    """An iterator (not a generator) of the same batches: its __next__ raises StopIteration."""

    def __init__(self):
        self._batches = batches()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._batches)


PyDataset = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence  # tf_keras: Sequence


class Indexed(PyDataset):
    """The same batches by index (a keras.utils.PyDataset; tf_keras: a Sequence)."""

    def __init__(self, bad=None):
        super().__init__()
        self._batches, self._bad = list(batches()), bad

    def __len__(self):
        return BATCHES

    def __getitem__(self, index):
        if index == self._bad:
            raise ValueError(f"bad record {index}")
        return self._batches[index]


def from_generator(make):
    import tensorflow as tf

    spec = (tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 1), tf.float32))
    return tf.data.Dataset.from_generator(make, output_signature=spec)


INPUTS = {
    "python generator": lambda bad=None: batches(bad),
    "from_generator": lambda bad=None: from_generator(lambda: batches(bad)),
    "PyDataset": lambda bad=None: Indexed(bad),
}


class CountBatches(keras.callbacks.Callback):
    """The batches fit and evaluate ran (a batch hook: one step per call)."""

    def __init__(self):
        super().__init__()
        self.train, self.test = 0, 0

    def on_train_batch_end(self, batch, logs=None):
        self.train += 1

    def on_test_batch_end(self, batch, logs=None):
        self.test += 1


def model_in(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def assert_names_the_generators_error(err):
    # through tf.data: InvalidArgumentError "... ValueError: bad record 4 ..."; a PyDataset's
    # worker threads re-raise the ValueError itself
    text = f"{type(err).__name__}: {err}"
    assert SHOWN in text, f"fit raised, but not the generator's error: {text[:2000]}"


@pytest.mark.parametrize("kind", list(INPUTS))
def test_an_exception_in_the_input_surfaces_from_fit(strategy, kind):
    import tensorflow as tf

    model = model_in(strategy)
    with pytest.raises((tf.errors.OpError, ValueError)) as raised:
        history = model.fit(INPUTS[kind](bad=BAD), epochs=1, verbose=0)
        pytest.fail(
            f"fit of a {kind} that raises at batch {BAD + 1} of {BATCHES} returned normally "
            f"after {model.optimizer.iterations.numpy()} steps: {history.history}"
        )
    assert_names_the_generators_error(raised.value)


def test_an_exception_in_a_generator_surfaces_from_evaluate(strategy):
    import tensorflow as tf

    model = model_in(strategy)  # not fit: evaluate builds the loss from a batch
    with pytest.raises(tf.errors.OpError) as raised:
        loss = model.evaluate(batches(bad=BAD), verbose=0)
        pytest.fail(f"evaluate of a generator that raises returned normally: {loss}")
    assert_names_the_generators_error(raised.value)


# tf_keras' fit takes a distributed dataset only with its steps: tfdist.fit needs
# steps_per_epoch there for data of unknown length (tfdist.fit's docstring)
LEGACY_STEPS = {"steps_per_epoch": BATCHES} if tfdist.flavour.uses_legacy_keras() else {}


def test_an_exception_in_the_input_surfaces_from_tfdist_fit(strategy):
    import tensorflow as tf

    with pytest.raises(tf.errors.OpError) as raised:
        tfdist.fit(
            lambda: model_in(tf.distribute.get_strategy()),
            from_generator(lambda: batches(bad=BAD)),
            strategy=strategy,
            verbose=0,
            **LEGACY_STEPS,
        )
    assert_names_the_generators_error(raised.value)


def test_an_exception_in_the_input_surfaces_from_a_custom_loop(strategy):
    import tensorflow as tf

    data = strategy.experimental_distribute_dataset(from_generator(lambda: batches(bad=BAD)))
    seen = 0
    with pytest.raises(tf.errors.OpError) as raised:
        for _ in data:
            seen += 1
    assert seen == BAD
    assert_names_the_generators_error(raised.value)


ENDING = {
    **INPUTS,
    "iterator raising StopIteration": lambda: from_generator(Batches),
    "dataset of unknown cardinality": lambda: examples().filter(lambda x, y: True).batch(BATCH),
}


def examples():
    """The examples of `batches()` (157: 19 batches of 8 and one of 5), one at a time."""
    import tensorflow as tf

    x, y = (np.concatenate(parts) for parts in zip(*batches()))
    return tf.data.Dataset.from_tensor_slices((x, y))


@pytest.mark.parametrize("kind", list(ENDING))
def test_the_end_of_the_data_ends_the_epoch_after_every_batch(strategy, kind):
    import tensorflow as tf

    data = ENDING[kind]()
    if isinstance(data, tf.data.Dataset):
        assert int(data.cardinality()) < 0  # unknown: only its end ends the epoch
    model, counted = model_in(strategy), CountBatches()
    history = model.fit(data, epochs=1, steps_per_epoch=None, verbose=0, callbacks=[counted])
    assert counted.train == BATCHES, f"fit of a {kind} trained {counted.train} of {BATCHES}"
    assert len(history.history["loss"]) == 1


def test_with_the_steps_per_call_tfdist_chooses_the_data_end_ends_the_epoch(strategy):
    model = model_in(strategy)  # no batch hook: tfdist picks the steps per call where it can
    history = model.fit(from_generator(batches), epochs=1, steps_per_epoch=None, verbose=0)
    assert len(history.history["loss"]) == 1
    assert int(model.optimizer.iterations.numpy()) >= BATCHES  # (Keras counts one more here)


def test_evaluate_of_a_generator_reads_every_batch(strategy):
    model, counted = model_in(strategy), CountBatches()  # not fit: evaluate builds the loss
    model.evaluate(batches(), verbose=0, callbacks=[counted])
    assert counted.test == BATCHES, f"evaluate of a generator ran {counted.test} of {BATCHES}"


@pytest.mark.skipif(
    tfdist.flavour.uses_legacy_keras(),
    reason="tf_keras' fit needs the steps of a distributed dataset: tfdist.fit asks for them",
)
def test_tfdist_fit_of_data_of_unknown_cardinality_ends_with_the_data(strategy):
    import tensorflow as tf

    counted = CountBatches()
    history = tfdist.fit(
        lambda: model_in(tf.distribute.get_strategy()),
        from_generator(batches),
        strategy=strategy,
        verbose=0,
        callbacks=[counted],
    )
    assert counted.train == BATCHES and len(history.history["loss"]) == 1
