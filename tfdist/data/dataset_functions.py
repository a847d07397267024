"""Dataset functions: `dataset_fn(input_context)` that read one input pipeline's shard.

    dataset_fn = tfdist.data.dataset_fn_for((x, y), global_batch_size=256, shuffle=True)
    dist = strategy.distribute_datasets_from_function(dataset_fn)

For `strategy.distribute_datasets_from_function` and `ClusterCoordinator.create_per_worker_dataset`
(parameter_server). Each function shards per input pipeline (`input_context.num_input_pipelines`
/ `input_pipeline_id`), then batches per replica (global batch / replicas).

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Tuple

from tfdist.data.batch_sizes import per_replica_batch_size, require_global_batch_size, split_batches
from tfdist.data.features import (
    check_features,
    check_features_container,
    check_record_arrays,
    check_records,
)
from tfdist.data.inputs import ARRAYS, FUNCTION, Input, as_input, refuse_empty
from tfdist.data.pipeline import Settings, refuse_on_batched
from tfdist.data.sharding import shard

__all__ = ["ArraysFn", "DatasetFn", "dataset_fn_for"]


def dataset_fn_for(
    data,
    global_batch_size: Optional[int] = None,
    *,
    shuffle: bool = False,
    seed: Optional[int] = None,
    repeat: bool = False,
    map_fn: Optional[Callable] = None,
    batch_map_fn: Optional[Callable] = None,
    shuffle_buffer: Optional[int] = None,
    features: Optional[Mapping] = None,
) -> Callable:
    """A `dataset_fn(input_context)` that reads this pipeline's shard, batched per replica.

    For `strategy.distribute_datasets_from_function` and
    `ClusterCoordinator.create_per_worker_dataset` (parameter_server). The function shards
    per input pipeline (`input_context.num_input_pipelines` / `input_pipeline_id`), then
    batches per replica (global batch / replicas); maps run in parallel, order kept.

    Args:
        data: one of
            - tf.data.Dataset: unbatched examples when `global_batch_size` is given; else
              already batched with the global batch (Keras convention), and split per replica.
            - callable(tf.distribute.InputContext) -> Dataset: returned as is.
            - numpy arrays: x, (x, y), (x, y, sample_weight), or dicts of arrays. Each
              pipeline slices its own examples out of the arrays.
            - a `tfdist.data.Input` that one of those was classified into.
        global_batch_size: int. Examples per step over all replicas. Required for arrays.
        shuffle: bool. Shuffle examples (after sharding), reshuffled every epoch. Defaults to
            False.
        seed: int. Shuffle seed. Defaults to None (random).
        repeat: bool. Repeat forever (parameter_server training needs it). Defaults to False.
        map_fn: callable(example) -> example, e.g. parsing a serialized record. Applied to
            unbatched examples *after* sharding (each pipeline parses only its own share),
            in parallel, order kept. Defaults to None.
        batch_map_fn: callable(batch) -> batch, applied to each per-replica batch, in
            parallel, order kept: a vectorized map, e.g. `tf.io.parse_example` on a batch of
            serialized records, several times faster than parsing record by record.
            Defaults to None.
        shuffle_buffer: int. Defaults to the dataset size when known (up to 100000), else
            10000.
        features: dict of feature name -> `tf.io.FixedLenFeature`, `VarLenFeature`,
            `FixedLenSequenceFeature`, `SparseFeature` or `RaggedFeature`, for data of
            serialized `tf.train.Example` records (e.g. a `TFRecordDataset`). Each
            per-replica batch of records is parsed at once with `tf.io.parse_example`, into a
            dict of feature name -> batched tensor; `batch_map_fn`, if given, receives that
            dict (e.g. to split off the label). Several times faster than parsing record by
            record in `map_fn`, which cannot be combined with it. Defaults to None.

    Returns:
        Callable[[tf.distribute.InputContext], tf.data.Dataset]

    Raises:
        TypeError / ValueError: data of another kind, arrays of different lengths, a missing
            or indivisible global batch size, a bad `features` spec or data that are not
            serialized records.
    """
    check_features_container(features, map_fn)
    source = as_input(data)
    if source.kind == FUNCTION:
        if features is not None:
            raise ValueError(
                "features= parses the records of a dataset tfdist builds, but data is a "
                f"dataset_fn ({source.value!r}), which is returned as is. HINT: pass the "
                "unbatched dataset of records (e.g. tf.data.TFRecordDataset(files)) as data, "
                "or parse inside your function with tf.io.parse_example after its batch()."
            )
        return source.value
    if global_batch_size is not None:
        per_replica_batch_size(global_batch_size, 1)  # type and range, before any graph work
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
    if source.kind == ARRAYS:
        require_global_batch_size(global_batch_size)
        if features is not None:
            check_record_arrays(source.value)
        return ArraysFn(source.value, settings)
    return _dataset_fn(source, settings)


def _dataset_fn(source: Input, settings: Settings) -> "DatasetFn":
    refuse_empty(source)
    if settings.global_batch_size is None:
        refuse_on_batched(
            settings.shuffle, settings.map_fn, settings.batch_map_fn, settings.features
        )
    if settings.features is not None:
        check_records(source.value.element_spec, "data")
    return DatasetFn(source.value, settings)


class ArraysFn:
    """dataset_fn for in-memory arrays: slices the arrays per input pipeline first."""

    def __init__(self, structure, settings: Settings):
        self.structure, self.settings = structure, settings

    def __call__(self, input_context=None):
        import tensorflow as tf

        pipelines, index, replicas = _context(input_context)
        batch = per_replica_batch_size(self.settings.global_batch_size, replicas)
        part = tf.nest.map_structure(lambda a: a[index::pipelines], self.structure)
        size = len(tf.nest.flatten(part)[0])
        return self.settings.finish(tf.data.Dataset.from_tensor_slices(part), batch, size)

    def __repr__(self):
        return f"<tfdist dataset_fn arrays global_batch_size={self.settings.global_batch_size}>"


class DatasetFn:
    """dataset_fn for a tf.data.Dataset: shards (FILE or DATA), then batches per replica."""

    def __init__(self, dataset, settings: Settings, rebuild: Optional[Callable] = None):
        self.dataset, self.settings, self._rebuild = dataset, settings, rebuild

    def for_workers(self) -> "DatasetFn":
        """This function for the workers of a parameter-server job (call it on the
        coordinator). A dataset made there holds tensors of the coordinator's process, which
        a worker cannot read ("Unable to parse tensor proto"); the copy serializes the
        dataset's graph now and rebuilds the dataset inside the function each worker traces,
        as ClusterCoordinator.create_per_worker_dataset does for a dataset."""
        from tensorflow.python.distribute.coordinator import values

        serialized = values.serialize_dataset_to_graph(self.dataset)
        spec = self.dataset.element_spec
        return DatasetFn(
            self.dataset,
            self.settings,
            lambda: values.deserialize_dataset_from_graph(serialized, spec),
        )

    def __call__(self, input_context=None):
        import tensorflow as tf

        pipelines, index, replicas = _context(input_context)
        dataset = self.dataset
        if self._rebuild is not None and not tf.executing_eagerly():
            dataset = self._rebuild()
        if self.settings.global_batch_size is None:  # batched with the global batch: split
            dataset = split_batches(dataset, replicas)
            if pipelines > 1:
                # `replicas` per-replica batches per global batch; pipeline i takes its own
                dataset = dataset.shard(pipelines, index)
            if self.settings.repeat:
                dataset = dataset.repeat()
            return dataset
        batch = per_replica_batch_size(self.settings.global_batch_size, replicas)
        if pipelines > 1:
            dataset = shard(dataset, pipelines, index)
        return self.settings.finish(dataset, batch)

    def __repr__(self):
        return f"<tfdist dataset_fn dataset global_batch_size={self.settings.global_batch_size}>"


def _context(input_context) -> Tuple[int, int, int]:
    if input_context is None:  # called by hand, or by a coordinator without a context
        return 1, 0, 1
    return (
        input_context.num_input_pipelines,
        input_context.input_pipeline_id,
        input_context.num_replicas_in_sync,
    )
