"""Tier 3 for tfdist.data: two real worker processes reading a finite TFRecord dataset."""

import os

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = 37  # not a multiple of anything below: the last batches are partial
GLOBAL_BATCH = 6  # 2 workers x 1 replica -> 3 examples per replica
FILE_COUNTS = (1, 2, 5)


def write_files(directory, count):
    """`count` TFRecord files holding the ids 0..EXAMPLES-1 (file j: ids with id % count == j)."""
    import tensorflow as tf

    paths = []
    for j in range(count):
        path = os.path.join(directory, f"ids-{count}-{j}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(j, EXAMPLES, count):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
                example = tf.train.Example(features=tf.train.Features(feature={"id": feature}))
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


def parse_id(record):
    import tensorflow as tf

    return tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})["id"]


def parse_ids(records):
    """Vectorized: a batch of serialized examples -> their ids."""
    import tensorflow as tf

    return tf.io.parse_example(records, {"id": tf.io.FixedLenFeature([], tf.int64)})["id"]


def ids_of(features):
    """batch_map_fn after features=: the parsed dict -> its ids."""
    return features["id"]


def read_ids(paths):
    import tensorflow as tf

    return tf.data.TFRecordDataset(paths).map(parse_id)


def collect_ids(directory):
    """Each worker: the ids it sees per epoch, per file count and per way of distributing."""
    import tensorflow as tf

    import tfdist
    from tfdist.data import dataset_fn_for, distribute_dataset, shard_policy

    strategy = tfdist.make_strategy()
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}

    def epochs(dist_ds, n=2):
        seen = []
        for _ in range(n):
            ids = []
            for batch in dist_ds:
                for part in strategy.experimental_local_results(batch):
                    ids.extend(int(i) for i in part.numpy())
            seen.append(ids)
        return seen

    result = {}
    for count in FILE_COUNTS:
        paths = sorted(tf.io.gfile.glob(os.path.join(directory, f"ids-{count}-*.tfrecord")))
        examples = read_ids(paths)
        result[count] = {
            "policy": shard_policy(examples, 2)[0],
            "unbatched+shuffle": epochs(
                distribute_dataset(examples, strategy, GLOBAL_BATCH, shuffle=True)
            ),
            "batched": epochs(distribute_dataset(examples.batch(GLOBAL_BATCH), strategy)),
            "dataset_fn": epochs(
                strategy.distribute_datasets_from_function(
                    dataset_fn_for(
                        tf.data.TFRecordDataset(paths), GLOBAL_BATCH, shuffle=True, map_fn=parse_id
                    )
                )
            ),
            "batch_map_fn": epochs(
                distribute_dataset(
                    tf.data.TFRecordDataset(paths), strategy, GLOBAL_BATCH, batch_map_fn=parse_ids
                )
            ),
            "features": epochs(
                distribute_dataset(
                    tf.data.TFRecordDataset(paths),
                    strategy,
                    GLOBAL_BATCH,
                    features=spec,
                    batch_map_fn=ids_of,
                )
            ),
            "dataset_fn features": epochs(
                strategy.distribute_datasets_from_function(
                    dataset_fn_for(
                        tf.data.TFRecordDataset(paths),
                        GLOBAL_BATCH,
                        shuffle=True,
                        features=spec,
                        batch_map_fn=ids_of,
                    )
                )
            ),
        }
    return result


def test_two_workers_see_every_example_exactly_once_per_epoch(run_cluster, tmp_path):
    for count in FILE_COUNTS:
        write_files(str(tmp_path), count)
    runs = run_cluster(collect_ids, workers=2, args=(str(tmp_path),), timeout=150)
    workers = [runs["worker:0"].value, runs["worker:1"].value]
    assert [workers[0][c]["policy"] for c in FILE_COUNTS] == ["DATA", "FILE", "FILE"]
    for count in FILE_COUNTS:
        for way in (
            "unbatched+shuffle",
            "batched",
            "dataset_fn",
            "batch_map_fn",
            "features",
            "dataset_fn features",
        ):
            for epoch in range(2):
                ids = [workers[w][count][way][epoch] for w in range(2)]
                merged = sorted(ids[0] + ids[1])
                assert merged == list(range(EXAMPLES)), (count, way, epoch, ids)
                assert ids[0] and ids[1], f"a worker got no data: {count} {way} {ids}"
    # FILE sharding: each worker reads only its own files (file j holds ids with id % count == j)
    five = workers[0][5]["batched"][0], workers[1][5]["batched"][0]
    assert {i % 5 for i in five[0]} == {0, 2, 4} and {i % 5 for i in five[1]} == {1, 3}
    # shuffled epochs differ from each other (each epoch reshuffles)
    assert workers[0][2]["unbatched+shuffle"][0] != workers[0][2]["unbatched+shuffle"][1]
