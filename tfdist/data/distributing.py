"""`distribute_dataset`: data sharded and batched for mirrored and multi_worker_mirrored.

    dist_ds = tfdist.distribute_dataset(dataset, strategy, global_batch_size=256)

One worker, or a tf.data.Dataset: one global pipeline, sharded by tf.data's own auto-shard
rewrite with the policy `shard_policy` chooses, batched with the global batch and split per
replica by the strategy (Keras can see its size). A dataset function, or arrays on several
workers: `strategy.distribute_datasets_from_function` with `dataset_fn_for`.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping, Optional

from tfdist.data.batch_sizes import per_replica_batch_size, require_global_batch_size
from tfdist.data.dataset_functions import dataset_fn_for
from tfdist.data.features import (
    check_features,
    check_features_container,
    check_record_arrays,
    check_records,
)
from tfdist.data.inputs import ARRAYS, DATASET, FUNCTION, Input, as_input, refuse_empty
from tfdist.data.pipeline import Settings, refuse_on_batched
from tfdist.data.sharding import SHARED_SEED, shard_policy, warn_data_sharding

__all__ = ["distribute_dataset"]

log = logging.getLogger("tfdist")


def _num_workers(strategy) -> int:
    try:
        local = len(strategy.extended.worker_devices)
    except (RuntimeError, AttributeError, NotImplementedError):
        return 1
    return max(1, strategy.num_replicas_in_sync // max(1, local))


def distribute_dataset(
    data,
    strategy,
    global_batch_size: Optional[int] = None,
    *,
    shuffle: bool = False,
    seed: Optional[int] = None,
    map_fn: Optional[Callable] = None,
    batch_map_fn: Optional[Callable] = None,
    shuffle_buffer: Optional[int] = None,
    repeat: bool = False,
    options=None,
    features: Optional[Mapping] = None,
):
    """Shards and batches `data` for `strategy` (mirrored, multi_worker_mirrored).

    Every worker of a multi-worker job calls it, in the same order. One epoch over the
    result sees every example exactly once across the workers.

    Args:
        data: tf.data.Dataset (unbatched examples with `global_batch_size`; else already
            batched with the global batch), a dataset_fn(input_context), numpy arrays
            x / (x, y) / (x, y, sample_weight) / dicts of arrays, or a `tfdist.data.Input`
            that one of those was classified into.
        strategy: tf.distribute.Strategy (not parameter_server: see `dataset_fn_for`).
        global_batch_size: int. Examples per step over all replicas of all workers; must be a
            multiple of `strategy.num_replicas_in_sync`. Required for arrays.
        shuffle: bool. Shuffle examples every epoch. With DATA sharding on several workers
            and no `seed`, a seed shared by the workers is used. Defaults to False.
        seed: int. Shuffle seed. Defaults to None.
        map_fn: callable(example) -> example, applied to unbatched examples in parallel,
            order kept (see `dataset_fn_for`). Under FILE sharding each worker maps only its
            own files' records. Defaults to None.
        batch_map_fn: callable(batch) -> batch, a vectorized map applied to each global
            batch before it is split per replica (see `dataset_fn_for`). Defaults to None.
        shuffle_buffer: int. See `dataset_fn_for`.
        repeat: bool. Repeat forever (examples are batched across the end of a pass), for
            a fixed number of steps per epoch. Defaults to False.
        options: tf.distribute.InputOptions, passed to TensorFlow. Defaults to None.
        features: dict of feature name -> tf.io feature: parse each global batch of
            serialized tf.train.Example records with `tf.io.parse_example` before
            `batch_map_fn` (see `dataset_fn_for`). Defaults to None.

    Returns:
        tf.distribute.DistributedDataset

    Raises:
        ValueError: a parameter_server strategy, a bad global batch size (see
            `per_replica_batch_size`) or a bad `features` spec.

    Warns:
        UserWarning (once, chief only): DATA sharding on several workers, and why.
    """
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ValueError(
            "distribute_dataset does not serve parameter_server strategies: their workers read "
            "data through a ClusterCoordinator. HINT: coordinator.create_per_worker_dataset("
            "tfdist.dataset_fn_for(data, global_batch_size, repeat=True)), or tfdist.fit."
        )
    if global_batch_size is not None:
        per_replica_batch_size(global_batch_size, strategy.num_replicas_in_sync)
    source = as_input(data)
    workers = _num_workers(strategy)
    if source.kind == FUNCTION or (source.kind == ARRAYS and workers > 1):
        # Arrays on several workers: each worker slices its own examples out of memory.
        fn = dataset_fn_for(
            source,
            global_batch_size,
            shuffle=shuffle,
            seed=seed,
            repeat=repeat,
            map_fn=map_fn,
            batch_map_fn=batch_map_fn,
            shuffle_buffer=shuffle_buffer,
            features=features,
        )
        return strategy.distribute_datasets_from_function(fn, options=options)
    dataset = _one_dataset(source, global_batch_size, features)
    check_features_container(features, map_fn)
    if global_batch_size is None:
        refuse_on_batched(shuffle, map_fn, batch_map_fn, features)
    if features is not None:
        check_records(dataset.element_spec, "data")
    settings = Settings(
        global_batch_size,
        shuffle,
        seed,
        repeat,
        map_fn,
        batch_map_fn,
        shuffle_buffer,
        check_features(features),
    )
    dataset = _sharded_batches(dataset, settings, workers)
    return strategy.experimental_distribute_dataset(dataset, options=options)


def _one_dataset(source: Input, global_batch_size: Optional[int], features):
    """The data as one tf.data.Dataset: the dataset itself, or the arrays (of one worker)."""
    import tensorflow as tf

    if source.kind == DATASET:
        refuse_empty(source)
        return source.value
    require_global_batch_size(global_batch_size)
    if features is not None:
        check_record_arrays(source.value)
    return tf.data.Dataset.from_tensor_slices(source.value)


def _sharded_batches(dataset, settings: Settings, workers: int):
    """The global pipeline, marked with its shard policy for tf.data's auto-shard rewrite
    (done by the strategy), and batched with the global batch when `dataset` is unbatched."""
    import tensorflow as tf

    policy, reason = shard_policy(dataset, workers)
    warn_data_sharding(policy, reason, workers, stacklevel=3)  # who called distribute_dataset
    if settings.global_batch_size is None:
        dataset = dataset.repeat() if settings.repeat else dataset
    else:
        if settings.shuffle and settings.seed is None and policy == "DATA":
            settings = dataclasses.replace(settings, seed=SHARED_SEED)
        dataset = settings.finish(dataset, settings.global_batch_size)
    shard_options = tf.data.Options()
    shard_options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy
    )
    log.debug("tfdist: %s sharding over %d worker(s): %s", policy, workers, reason)
    return dataset.with_options(shard_options)
