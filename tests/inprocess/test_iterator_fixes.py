"""Which datasets the host_iterators_dropped_at_once fix reads without autotuning (imports
TensorFlow): only those with nothing tf.data's autotuning would tune."""

import pytest

from tfdist.fixes.iterators import UNTUNED, nothing_to_tune


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf

    return tf


def _made_by_this_release(tf) -> set:
    from tensorflow.python.data.experimental.ops import distribute
    from tensorflow.python.data.ops import rebatch_op

    numbers, x = tf.data.Dataset.range(8), tf.zeros((8, 2))
    made = [
        tf.data.Dataset.from_tensor_slices(x),
        tf.data.Dataset.from_tensors(x),
        numbers,
        numbers.batch(2),
        numbers.padded_batch(2),
        numbers.batch(2).unbatch(),
        numbers.cache(),
        numbers.repeat(),
        numbers.shuffle(2),
        numbers.take(2),
        numbers.skip(2),
        numbers.shard(2, 0),
        numbers.with_options(tf.data.Options()),
        tf.data.Dataset.zip((numbers, numbers)),
        numbers.concatenate(numbers),
        distribute._AutoShardDataset(numbers.batch(2), 2, 0, 2),
        distribute._LegacyRebatchDataset(numbers.batch(4), 2),
    ]
    rebatched = rebatch_op._RebatchDataset(numbers.batch(4), [2, 2])
    return {type(each).__name__ for each in made + [rebatched, rebatched._inputs()[0]]}


def test_every_listed_kind_is_a_class_of_this_release(tf):
    # a class renamed by a release would only make the fix apply less; this says so at once
    assert UNTUNED == _made_by_this_release(tf)


def _options(tf, enabled):
    options = tf.data.Options()
    options.autotune.enabled = enabled
    return options


@pytest.mark.parametrize(
    "name, build, untuned",
    [
        ("slices, batch, cache, repeat", lambda tf, d, x: x.batch(2).cache().repeat(), True),
        ("fixed-size prefetch", lambda tf, d, x: d.batch(2).prefetch(2), True),
        (
            "zip, shuffle, take",
            lambda tf, d, x: tf.data.Dataset.zip((d, d.shuffle(4))).take(3),
            True,
        ),
        ("prefetch(AUTOTUNE)", lambda tf, d, x: d.batch(2).prefetch(tf.data.AUTOTUNE), False),
        ("a map of the user's", lambda tf, d, x: d.map(lambda i: i + 1), False),
        ("map(AUTOTUNE)", lambda tf, d, x: d.map(lambda i: i, num_parallel_calls=-1), False),
        ("interleave", lambda tf, d, x: d.interleave(lambda i: tf.data.Dataset.range(i)), False),
        ("batch in parallel", lambda tf, d, x: d.batch(2, num_parallel_calls=2), False),
        ("deep under untuned ones", lambda tf, d, x: d.map(lambda i: i).batch(2).repeat(), False),
        ("autotuning on, by the user", lambda tf, d, x: d.with_options(_options(tf, True)), False),
        (
            "autotuning off, by the user",
            lambda tf, d, x: d.with_options(_options(tf, False)),
            False,
        ),
    ],
)
def test_nothing_to_tune(tf, name, build, untuned):
    dataset = build(
        tf, tf.data.Dataset.range(16), tf.data.Dataset.from_tensor_slices(tf.zeros((8, 2)))
    )
    assert nothing_to_tune(dataset) is untuned, name


def test_the_strategys_own_rebatch_keeps_a_dataset_untuned(tf):
    # mirrored rebatches (normalize_to_dense's map under a restructuring), shards and prefetches
    from tensorflow.python.data.experimental.ops import distribute
    from tensorflow.python.data.ops import rebatch_op

    dense = tf.data.Dataset.from_tensor_slices(tf.zeros((16, 2))).batch(4)
    rebatched = rebatch_op._RebatchDataset(dense, [2, 2]).prefetch(2)
    assert nothing_to_tune(distribute._AutoShardDataset(rebatched, 2, 0, 2))
    ragged = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]] * 4)).batch(4)
    assert not nothing_to_tune(rebatch_op._RebatchDataset(ragged, [2, 2]))
