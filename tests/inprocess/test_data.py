"""tfdist.data, tier 2: dataset_fn_for, the shard decision and learning-rate scaling on real
datasets, and distribute_dataset on the in-process mirrored strategy. Tier 1 (batch sizes):
tests/unit/test_data_batch_sizes.py."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import data as tfdata
from tfdist.data import dataset_fn_for, distribute_dataset, scale_learning_rate, shard_policy

SINGLE = tfdist.ClusterSpec({})


def context(pipelines=1, index=0, replicas=1):
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=index, num_replicas_in_sync=replicas
    )


def batches(dataset, key=None):
    out = []
    for element in dataset:
        value = element if key is None else key(element)
        out.append(value.numpy().tolist())
    return out


@pytest.fixture(autouse=True)
def _fresh_warnings():
    tfdata._WARNED.clear()
    yield
    tfdata._WARNED.clear()


@pytest.fixture
def tfrecords(tmp_path):
    """make(n_files, examples=20) -> paths; file j holds the ids i with i % n_files == j."""

    def make(n_files, examples=20):
        paths = []
        for j in range(n_files):
            path = str(tmp_path / f"part-{n_files}-{j}.tfrecord")
            with tf.io.TFRecordWriter(path) as writer:
                for i in range(j, examples, n_files):
                    writer.write(tf.io.serialize_tensor(tf.constant(i, tf.int64)).numpy())
            paths.append(path)
        return paths

    return make


def parse(record):
    return tf.ensure_shape(tf.io.parse_tensor(record, tf.int64), [])


# --------------------------------------------------------------- dataset_fn_for: arrays


def test_arrays_are_sliced_per_pipeline_and_batched_per_replica():
    x = np.arange(20, dtype="float32").reshape(10, 2)
    y = np.arange(10)
    fn = dataset_fn_for((x, y), global_batch_size=4)
    # pipeline 1 of 2, 2 replicas in sync: examples 1, 3, 5, 7, 9 in batches of 2
    assert batches(fn(context(2, 1, 2)), key=lambda e: e[1]) == [[1, 3], [5, 7], [9]]
    assert batches(fn(context(2, 0, 2)), key=lambda e: e[1]) == [[0, 2], [4, 6], [8]]
    assert batches(fn(context(1, 0, 4)), key=lambda e: e[1]) == [
        [0],
        [1],
        [2],
        [3],
        [4],
        [5],
        [6],
        [7],
        [8],
        [9],
    ]
    first = next(iter(fn(context(2, 1, 2))))
    assert first[0].numpy().tolist() == [[2.0, 3.0], [6.0, 7.0]]


@pytest.mark.parametrize(
    "data, check",
    [
        (np.arange(6), lambda e: e.shape == (2,)),
        ((np.arange(6), np.arange(6) * 2, np.ones(6)), lambda e: len(e) == 3),
        ({"a": np.arange(6), "b": np.zeros((6, 3))}, lambda e: e["b"].shape == (2, 3)),
        (((np.arange(6), np.arange(6)), np.arange(6)), lambda e: len(e[0]) == 2),
        ([np.arange(6), np.arange(6)], lambda e: isinstance(e, tuple) and len(e) == 2),
        (({"x": [[1.0]] * 6}, [0] * 6), lambda e: e[0]["x"].shape == (2, 1)),
    ],
)
def test_array_structures(data, check):
    element = next(iter(dataset_fn_for(data, 2)(context())))
    assert check(element)


@pytest.mark.parametrize(
    "data, global_batch, error, match",
    [
        (
            (np.arange(6), np.arange(5)),
            2,
            ValueError,
            r"different numbers of examples: \(6, 5\)\. HINT: every array needs the same first",
        ),
        (
            (np.arange(2),) * 4,
            2,
            ValueError,
            r"\(x,\), \(x, y\) or \(x, y, sample_weight\)\. "
            r"Received a tuple of 4 items",
        ),
        (np.arange(6), None, ValueError, r"global_batch_size is required with arrays"),
        ("train.csv", 2, TypeError, r"data is 'train.csv'\. HINT: data is a tf\.data\.Dataset"),
        (np.float32(3.0), 2, ValueError, r"is a scalar"),
        (np.arange(6), 0, ValueError, r"global_batch_size must be >= 1"),
    ],
)
def test_bad_data_is_refused_with_the_fix(data, global_batch, error, match):
    with pytest.raises(error, match=match):
        dataset_fn_for(data, global_batch)


def test_shuffle_and_repeat_of_arrays():
    fn = dataset_fn_for(np.arange(40), 8, shuffle=True, seed=3, repeat=True)
    dataset = fn(context(2, 0, 2))
    assert dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    first = [v for batch in batches(dataset.take(5)) for v in batch]  # one epoch of 20
    assert sorted(first) == list(range(0, 40, 2)) and first != sorted(first)
    options = dataset.options()
    assert options.experimental_optimization.map_parallelization
    assert options.experimental_optimization.parallel_batch


def test_a_dataset_fn_is_returned_as_is_and_distributed_datasets_are_refused(virtual_cpus):
    def my_fn(input_context):
        return tf.data.Dataset.range(4)

    assert dataset_fn_for(my_fn) is my_fn
    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    dist = strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))
    with pytest.raises(TypeError, match=r"already a distributed dataset"):
        dataset_fn_for(dist, 4)


# -------------------------------------------------------------- dataset_fn_for: datasets


def test_unbatched_dataset_is_sharded_by_data_when_it_reads_no_files():
    fn = dataset_fn_for(tf.data.Dataset.range(10), global_batch_size=4)
    with pytest.warns(
        UserWarning,
        match=r"shards this dataset by DATA over 2 workers: the "
        r"dataset reads no files \(its source is RangeDataset\)",
    ):
        assert batches(fn(context(2, 1, 2))) == [[1, 3], [5, 7], [9]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert batches(fn(context(2, 0, 2))) == [[0, 2], [4, 6], [8]]
    assert not caught  # the warning is given once


def test_file_dataset_is_sharded_by_file_inside_the_dataset_fn(tfrecords):
    paths = tfrecords(3)
    # map_fn parses after the shard: each pipeline parses only its own files' records
    fn = dataset_fn_for(tf.data.TFRecordDataset(paths), global_batch_size=4, map_fn=parse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker0 = [v for b in batches(fn(context(2, 0, 2))) for v in b]
        worker1 = [v for b in batches(fn(context(2, 1, 2))) for v in b]
    assert not caught
    assert {i % 3 for i in worker0} == {0, 2} and {i % 3 for i in worker1} == {1}
    assert sorted(worker0 + worker1) == list(range(20))


def test_batched_dataset_is_split_per_replica_in_order():
    dataset = tf.data.Dataset.range(10).batch(4)  # batches 4, 4, 2 (size unknown statically)
    assert batches(dataset_fn_for(dataset)(context(1, 0, 2))) == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
        [8],
        [9],
    ]
    # two pipelines, 1 replica each: pipeline i gets the i-th half of every global batch
    assert batches(dataset_fn_for(dataset)(context(2, 1, 2))) == [[2, 3], [6, 7], [9]]
    static = tf.data.Dataset.range(12).batch(4, drop_remainder=True)
    assert batches(dataset_fn_for(static)(context(1, 0, 4))) == [[i] for i in range(12)]
    with pytest.raises(ValueError, match=r"global_batch_size=4 is not divisible by the 3"):
        dataset_fn_for(static)(context(1, 0, 3))
    with pytest.raises(ValueError, match=r"shuffle=True needs unbatched examples"):
        dataset_fn_for(dataset, shuffle=True)
    with pytest.raises(ValueError, match=r"map_fn= needs unbatched examples"):
        dataset_fn_for(dataset, map_fn=lambda e: e)


def test_batch_map_fn_maps_whole_per_replica_batches():
    shapes = []

    def times_ten(batch):
        shapes.append(batch.shape.as_list())
        return batch * 10

    fn = dataset_fn_for(tf.data.Dataset.range(10), 4, batch_map_fn=times_ten)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DATA sharding of a range: tested above
        assert batches(fn(context(2, 1, 2))) == [[10, 30], [50, 70], [90]]
    assert shapes == [[None]]  # traced once, on batches
    with pytest.raises(ValueError, match=r"batch_map_fn= needs unbatched examples"):
        dataset_fn_for(tf.data.Dataset.range(10).batch(2), batch_map_fn=times_ten)


def test_dataset_shuffle_and_repeat():
    fn = dataset_fn_for(tf.data.Dataset.range(8), 4, shuffle=True, seed=1, repeat=True)
    dataset = fn(context(1, 0, 1))
    assert dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    values = [v for b in batches(dataset.take(4)) for v in b]
    assert sorted(values[:8]) == list(range(8)) and sorted(values[8:]) == list(range(8))
    assert values[:8] != values[8:]  # reshuffled each epoch


# --------------------------------------------------------------------- the shard decision


def test_shard_policy_by_files_and_workers(tfrecords):
    three, one = tfrecords(3), tfrecords(1)
    policy, reason = shard_policy(tf.data.TFRecordDataset(three).map(parse).batch(2), 2)
    assert (policy, reason) == ("FILE", "3 files over 2 workers, each reads only its files")
    assert shard_policy(tf.data.TFRecordDataset(three), 3)[0] == "FILE"
    policy, reason = shard_policy(tf.data.TFRecordDataset(three), 4)
    assert policy == "DATA" and "reads 3 file(s) but there are 4 workers" in reason
    policy, reason = shard_policy(tf.data.TFRecordDataset(one).map(parse), 2)
    assert policy == "DATA" and "reads 1 file(s) but there are 2 workers" in reason
    assert shard_policy(tf.data.TFRecordDataset(one), 1) == (
        "OFF",
        "one input pipeline: nothing to shard",
    )


def test_shard_policy_follows_file_lists_interleave_and_zip(tfrecords):
    three, two = tfrecords(3), tfrecords(2)
    pattern = os.path.join(os.path.dirname(three[0]), "part-3-*.tfrecord")
    listed = tf.data.Dataset.list_files(pattern, shuffle=True, seed=1).interleave(
        tf.data.TFRecordDataset, num_parallel_calls=2, cycle_length=2
    )
    assert shard_policy(listed.map(parse).shuffle(4).batch(2), 3)[0] == "FILE"
    assert shard_policy(listed, 4)[0] == "DATA"
    zipped = tf.data.Dataset.zip((tf.data.TFRecordDataset(three), tf.data.TFRecordDataset(two)))
    assert shard_policy(zipped, 2)[0] == "FILE"
    assert shard_policy(zipped, 3)[0] == "DATA"  # the 2-file source cannot feed 3 workers
    generated = tf.data.Dataset.range(2).flat_map(lambda i: tf.data.TFRecordDataset(three[0]))
    policy, reason = shard_policy(generated, 2)
    assert policy == "DATA" and "could not count them" in reason


def test_shard_policy_for_data_that_reads_no_files():
    policy, reason = shard_policy(tf.data.Dataset.from_tensor_slices(np.arange(8)), 2)
    assert policy == "DATA"
    assert "reads no files (its source is TensorSliceDataset)" in reason
    assert "keeps 1/2 of the examples" in reason
    tf.random.set_seed(None)  # no global seed (other tests set one): op seeds stay 0
    _, reason = shard_policy(tf.data.Dataset.range(8).shuffle(8), 2)
    assert "shuffles without a seed" in reason and "give that shuffle a seed=" in reason
    _, reason = shard_policy(tf.data.Dataset.range(8).shuffle(8, seed=1), 2)
    assert "seed" not in reason


# ---------------------------------------------------- tier 2: distribute_dataset, mirrored


def seen(strategy, dist_ds, key=lambda e: e):
    ids, sizes = [], []
    for element in dist_ds:
        for part in strategy.experimental_local_results(key(element)):
            values = part.numpy().tolist()
            ids.extend(values)
            sizes.append(len(values))
    return ids, sizes


def test_distribute_dataset_on_four_replicas(virtual_cpus, tfrecords):
    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    assert strategy.num_replicas_in_sync == 4
    x, y = np.arange(40, dtype="float32")[:, None], np.arange(40)
    ids, sizes = seen(
        strategy, distribute_dataset((x, y), strategy, 16, shuffle=True), key=lambda e: e[1]
    )
    assert sorted(ids) == list(range(40)) and ids != sorted(ids)
    assert sizes[:4] == [4, 4, 4, 4]
    examples = tf.data.TFRecordDataset(tfrecords(3, examples=40)).map(parse)
    ids, sizes = seen(strategy, distribute_dataset(examples, strategy, 16))
    assert sorted(ids) == list(range(40)) and sizes[:4] == [4, 4, 4, 4]
    records = tf.data.TFRecordDataset(tfrecords(2, examples=40))
    ids, _ = seen(strategy, distribute_dataset(records, strategy, 16, map_fn=parse))
    assert sorted(ids) == list(range(40))
    ids, _ = seen(strategy, distribute_dataset(examples.batch(16), strategy))
    assert sorted(ids) == list(range(40))
    ids, _ = seen(strategy, distribute_dataset(dataset_fn_for(examples, 16), strategy))
    assert sorted(ids) == list(range(40))
    with pytest.raises(ValueError, match=r"global_batch_size=10 is not divisible by the 4"):
        distribute_dataset((x, y), strategy, 10)
    with pytest.raises(ValueError, match=r"shuffle=True needs unbatched examples"):
        distribute_dataset(examples.batch(16), strategy, shuffle=True)


# ------------------------------------------------------------------ learning-rate scaling


def test_linear_scaling_with_warmup_values():
    import keras

    schedule = scale_learning_rate(0.1, 8, warmup_steps=100)
    assert isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
    values = [float(schedule(step)) for step in (0, 50, 100, 1000)]
    # step 0: the single-replica rate; halfway: 0.1 x (1 + 7 x 0.5); then 0.1 x 8
    assert values == pytest.approx([0.1, 0.45, 0.8, 0.8])
    assert float(scale_learning_rate(0.1, 8)(0)) == pytest.approx(0.8)  # no warmup
    assert float(scale_learning_rate(0.1, 1, warmup_steps=10)(5)) == pytest.approx(0.1)


def test_scaling_follows_a_base_schedule_and_takes_a_strategy(virtual_cpus):
    import keras

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    schedule = scale_learning_rate(decay, strategy, warmup_steps=10)
    assert float(schedule(0)) == pytest.approx(0.1)
    assert float(schedule(10)) == pytest.approx(0.05 * 4)
    assert float(schedule(20)) == pytest.approx(0.025 * 4)
    assert float(schedule(5)) == pytest.approx(0.1 * 0.5**0.5 * (1 + 3 * 0.5))


def test_schedule_works_in_a_keras_optimizer_and_round_trips():
    import keras

    schedule = scale_learning_rate(0.01, 4, warmup_steps=4, name="scaled")
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    variable = keras.Variable(1.0)
    rates = []
    for _ in range(6):
        rates.append(float(optimizer.learning_rate))
        optimizer.apply([tf.constant(1.0)], [variable])
    assert rates == pytest.approx([0.01, 0.0175, 0.025, 0.0325, 0.04, 0.04])
    config = keras.optimizers.schedules.serialize(schedule)
    again = keras.optimizers.schedules.deserialize(config)
    assert type(again) is type(schedule) and float(again(2)) == pytest.approx(0.025)
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    nested = scale_learning_rate(decay, 2, warmup_steps=3)
    restored = type(nested).from_config(nested.get_config())
    assert float(restored(7)) == pytest.approx(float(nested(7)))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(base_lr=0.1, num_replicas=0),
            ValueError,
            r"num_replicas must be a positive int or a "
            r"strategy\. Received: num_replicas=0",
        ),
        (dict(base_lr=0.1, num_replicas=2, warmup_steps=-1), ValueError, r"warmup_steps=-1"),
        (dict(base_lr=-0.1, num_replicas=2), ValueError, r"base_lr must be a positive number"),
        (
            dict(base_lr="0.1", num_replicas=2),
            TypeError,
            r"base_lr must be a float or a "
            r"LearningRateSchedule",
        ),
    ],
)
def test_scale_learning_rate_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        scale_learning_rate(**kwargs)
