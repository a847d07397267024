"""tfdist.data, tier 2: dataset_fn_for, the shard decision and the classified input on real
datasets, and distribute_dataset on the in-process mirrored strategy. Tier 1 (batch sizes):
tests/unit/test_data_batch_sizes.py."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import data as tfdata
from tfdist.data import dataset_fn_for, distribute_dataset, pipeline, shard_policy, sharding

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
    sharding._WARNED.clear()
    yield
    sharding._WARNED.clear()


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


# Records of tf.train.Example: "id" (int64), "x" (2 floats), "tags" (0-2 strings).
SPEC = {
    "id": tf.io.FixedLenFeature([], tf.int64),
    "x": tf.io.FixedLenFeature([2], tf.float32),
    "tags": tf.io.VarLenFeature(tf.string),
}


@pytest.fixture
def examples(tmp_path):
    """make(n_files, examples=20) -> paths of tf.train.Example records; file j holds the ids
    i with i % n_files == j."""

    def make(n_files, examples=20):
        paths = []
        for j in range(n_files):
            path = str(tmp_path / f"examples-{n_files}-{j}.tfrecord")
            with tf.io.TFRecordWriter(path) as writer:
                for i in range(j, examples, n_files):
                    feature = {
                        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                        "x": tf.train.Feature(
                            float_list=tf.train.FloatList(value=[i / 2, -float(i)])
                        ),
                        "tags": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[b"t%d" % i] * (i % 3))
                        ),
                    }
                    example = tf.train.Example(features=tf.train.Features(feature=feature))
                    writer.write(example.SerializeToString())
            paths.append(path)
        return paths

    return make


def parse_example(record):
    """Per record, the dense features only (a batch of VarLen features needs per-batch parsing)."""
    parsed = tf.io.parse_single_example(record, {k: SPEC[k] for k in ("id", "x")})
    return parsed["id"], parsed["x"]


def id_and_x(features):
    return features["id"], features["x"]


# ------------------------------------------------------------------- the classified input


def test_the_input_is_classified_once_and_every_step_takes_it():
    x = np.arange(20)
    source = tfdata.classify((x, x))
    assert (source.kind, source.length) == ("arrays", 20)
    assert tfdata.classify(source.value).length == 20  # the arrays, converted to numpy
    assert tfdata.steps_per_pass(source, 8) == 3 and tfdata.steps_per_pass(source) is None
    ids = batches(dataset_fn_for(source, 4)(context(2, 1, 2)), key=lambda e: e[0])
    assert ids == [[1, 3], [5, 7], [9, 11], [13, 15], [17, 19]]
    dataset = tf.data.Dataset.range(10)
    assert (tfdata.classify(dataset).kind, tfdata.classify(dataset).length) == ("dataset", 10)
    assert tfdata.steps_per_pass(tfdata.classify(dataset.batch(4))) == 3
    assert tfdata.classify(dataset.repeat()).length is None  # infinite
    assert tfdata.classify(dataset.filter(lambda v: True)).length is None  # unknown

    def function(input_context):
        return dataset

    source = tfdata.classify(function)
    assert (source.kind, source.length) == ("function", None)
    assert dataset_fn_for(source) is function
    assert "arrays length=20" in repr(tfdata.classify(x))


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


def test_autotuning_is_off_on_small_hosts_unless_the_dataset_says_otherwise(tfrecords, monkeypatch):
    """On hosts of at most SMALL_HOST_CORES cores tfdist switches tf.data's autotuning off;
    it adds no other tf.data option (nor a prefetch), and the options a user set stay."""

    def options_of(dataset, cores, **kwargs):
        monkeypatch.setattr(pipeline, "_usable_cores", lambda: cores)
        out = dataset_fn_for(dataset, 4, **kwargs)(context())
        assert sorted(v for b in batches(out) for v in b) == list(range(20))
        return out.options()

    records = tf.data.TFRecordDataset(tfrecords(2))
    small = options_of(records, tfdata.SMALL_HOST_CORES, map_fn=parse)
    assert small.autotune.enabled is False
    assert small.experimental_optimization.parallel_batch is None  # TensorFlow's default
    assert small.experimental_optimization.map_parallelization is None
    assert options_of(records, 8, map_fn=parse).autotune.enabled is None  # TensorFlow's default
    assert options_of(np.arange(20), 1).autotune.enabled is False  # arrays too
    mine = tf.data.Options()
    mine.autotune.enabled = True
    mine.experimental_optimization.map_parallelization = False
    mine.experimental_optimization.inject_prefetch = False
    kept = options_of(records.with_options(mine), 2, map_fn=parse)
    assert kept.autotune.enabled is True
    assert kept.experimental_optimization.map_parallelization is False
    assert kept.experimental_optimization.inject_prefetch is False


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


def test_features_parse_whole_batches_into_the_same_batches_as_per_record_parsing(examples):
    paths = examples(3)
    per_record = dataset_fn_for(tf.data.TFRecordDataset(paths), 8, map_fn=parse_example)
    per_batch = dataset_fn_for(
        tf.data.TFRecordDataset(paths), 8, features=SPEC, batch_map_fn=id_and_x
    )
    for ctx in (context(), context(1, 0, 2)):
        expected = [(i.numpy().tolist(), x.numpy().tolist()) for i, x in per_record(ctx)]
        got = [(i.numpy().tolist(), x.numpy().tolist()) for i, x in per_batch(ctx)]
        assert got == expected and len(got) == (3 if ctx.num_replicas_in_sync == 1 else 5)
    # without batch_map_fn: the dict of parsed features, VarLen ones as sparse batches
    first = next(iter(dataset_fn_for(tf.data.TFRecordDataset(paths), 8, features=SPEC)()))
    assert sorted(first) == ["id", "tags", "x"]
    assert first["x"].shape == (8, 2) and isinstance(first["tags"], tf.SparseTensor)
    tags = tf.sparse.to_dense(first["tags"], default_value=b"").numpy()
    for row, i in zip(tags, first["id"].numpy()):
        assert [t for t in row if t] == [b"t%d" % i] * (i % 3)


def test_features_with_shuffle_repeat_and_arrays_of_records(examples):
    paths = examples(2, examples=12)
    fn = dataset_fn_for(
        tf.data.TFRecordDataset(paths),
        4,
        features=SPEC,
        batch_map_fn=id_and_x,
        shuffle=True,
        seed=2,
        repeat=True,
    )
    ids = [v for i, _ in fn(context()).take(6) for v in i.numpy().tolist()]
    assert sorted(ids[:12]) == list(range(12)) and sorted(ids[12:]) == list(range(12))
    assert ids[:12] != sorted(ids[:12]) and ids[:12] != ids[12:]
    # a numpy array of serialized records: each pipeline slices its own
    records = [r.numpy() for r in tf.data.TFRecordDataset(paths)]
    with pytest.raises(ValueError, match=r"numpy array of dtype \|S\d+: numpy's fixed-width"):
        dataset_fn_for(np.array(records), 4, features=SPEC)
    records = np.array(records, dtype=object)
    fn = dataset_fn_for(records, 4, features=SPEC, batch_map_fn=id_and_x)
    halves = [[v for i, _ in fn(context(2, k, 2)) for v in i.numpy().tolist()] for k in (0, 1)]
    assert sorted(halves[0] + halves[1]) == list(range(12)) and halves[0] and halves[1]


@pytest.mark.parametrize("files", [3, 1])  # FILE sharding, then DATA sharding (one file)
def test_features_shard_every_record_once_over_two_pipelines(examples, files):
    fn = dataset_fn_for(
        tf.data.TFRecordDataset(examples(files)), 4, features=SPEC, batch_map_fn=id_and_x
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DATA sharding of one file warns: tested above
        seen = [[v for i, _ in fn(context(2, k, 2)) for v in i.numpy().tolist()] for k in (0, 1)]
    assert sorted(seen[0] + seen[1]) == list(range(20))
    assert seen[0] and seen[1] and not set(seen[0]) & set(seen[1])
    if files == 3:  # each pipeline parsed only its own files' records
        assert {i % 3 for i in seen[0]} == {0, 2} and {i % 3 for i in seen[1]} == {1}


def test_distribute_dataset_parses_global_batches_with_features(virtual_cpus, examples):
    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    records = tf.data.TFRecordDataset(examples(2, examples=40))
    dist = distribute_dataset(records, strategy, 16, features=SPEC, batch_map_fn=id_and_x)
    ids, sizes = [], []
    for ids_batch, _ in dist:
        for part in strategy.experimental_local_results(ids_batch):
            ids.extend(part.numpy().tolist())
            sizes.append(len(part))
    assert sorted(ids) == list(range(40)) and sizes[:4] == [4, 4, 4, 4]
    with pytest.raises(ValueError, match=r"features= needs unbatched examples"):
        distribute_dataset(records.batch(16), strategy, features=SPEC)
    serialized = [r.numpy() for r in records]
    with pytest.raises(ValueError, match=r"numpy's fixed-width bytes drop the trailing zero"):
        distribute_dataset(np.array(serialized), strategy, 16, features=SPEC)
    dist = distribute_dataset(
        np.array(serialized, dtype=object), strategy, 16, features=SPEC, batch_map_fn=id_and_x
    )
    ids = [v for i, _ in dist for part in strategy.experimental_local_results(i) for v in part]
    assert sorted(int(i) for i in ids) == list(range(40))


@pytest.mark.parametrize(
    "data, kwargs, error, match",
    [
        (
            "records",
            dict(features={"id": tf.io.FixedLenFeature([], tf.int32)}),
            ValueError,
            r"features\['id'\] has dtype int32, but tf\.train\.Example stores only float32 "
            r"\(FloatList\), int64 \(Int64List\) and string \(BytesList\)\. HINT: parse it as "
            r"one of those .* and cast it in batch_map_fn=",
        ),
        (
            "records",
            dict(features={"x": tf.io.FixedLenFeature([None], tf.float32)}),
            ValueError,
            r"features\['x'\] = FixedLenFeature\(shape=\[None\].* is not a feature "
            r"tf\.io\.parse_example accepts: First dimension of shape for feature x unknown.*"
            r"HINT: a FixedLenFeature needs a fully known shape",
        ),
        (
            "records",
            dict(features={"x": tf.io.FixedLenFeature([2], tf.float32, default_value=[1.0] * 3)}),
            ValueError,
            r"features\['x'\] = .* is not a feature tf\.io\.parse_example accepts: Input to "
            r"reshape is a tensor with 3 values, but the requested shape has 2\. HINT",
        ),
        (
            "records",
            dict(features={"x": tf.io.FixedLenSequenceFeature([2], tf.float32)}),
            ValueError,
            r"features\['x'\] = .* requires allow_missing to be True\. HINT: .*"
            r"a FixedLenSequenceFeature needs allow_missing=True",
        ),
        (
            "records",
            dict(features={"id": tf.int64}),
            TypeError,
            r"features\['id'\] is tf\.int64 \(of type DType\), not a tf\.io feature\. HINT: "
            r"describe each feature with one of tf\.io\.FixedLenFeature, tf\.io\.VarLenFeature",
        ),
        (
            "parsed",
            dict(features=SPEC),
            ValueError,
            r"features= parses serialized tf\.train\.Example records, so data must yield one "
            r"scalar tf\.string per example\. Received examples of \(TensorSpec.*HINT: pass "
            r"the records themselves",
        ),
        (
            "function",
            dict(features=SPEC),
            ValueError,
            r"features= parses the records of a dataset tfdist builds, but data is a "
            r"dataset_fn .* HINT: pass the unbatched dataset of records",
        ),
        (
            "batched",
            dict(features=SPEC),
            ValueError,
            r"features= needs unbatched examples: this dataset is taken as already batched",
        ),
        (
            "arrays",
            dict(features=SPEC),
            ValueError,
            r"so data \(arrays\) must yield one scalar tf\.string per example",
        ),
    ],
)
def test_bad_features_and_data_are_refused_with_the_fix(examples, data, kwargs, error, match):
    records = tf.data.TFRecordDataset(examples(1))
    data, global_batch = {
        "records": (records, 4),
        "parsed": (records.map(parse_example), 4),
        "function": (lambda input_context: records, 4),
        "batched": (records.batch(4), None),
        "arrays": (np.arange(8.0), 4),
    }[data]
    with pytest.raises(error, match=match) as caught:
        dataset_fn_for(data, global_batch, **kwargs)
    assert caught.value.__cause__ is None  # the message says it all: no TensorFlow traceback


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
