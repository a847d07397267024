"""The distributed input pipeline: global batches, sharding per input pipeline, prefetching.

    dist_ds = tfdist.distribute_dataset(dataset, strategy, global_batch_size=256)
    dataset_fn = tfdist.dataset_fn_for((x, y), global_batch_size=256, shuffle=True)

Global batch semantics: the batch size you give is the *global* batch, summed over every
replica of every worker. Each replica gets `global_batch_size / num_replicas_in_sync`
examples a step, so a global batch that the replica count does not divide is refused. A
`tf.data.Dataset` passed without `global_batch_size` is taken as already batched with the
global batch (the Keras convention for `model.fit(dataset)`).

Sharding: each input pipeline (one per worker) reads a disjoint part of the data, so one
epoch sees every example exactly once across the job. A dataset that reads files is sharded
by FILE (each worker opens only its files) when every worker gets at least one file;
otherwise by DATA (every worker reads everything and keeps its share), with a one-time
warning that says why.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import logging
import math
import re
import threading
import warnings
from typing import Callable, Mapping, Optional, Tuple

from tfdist.errors import is_int

__all__ = [
    "dataset_fn_for",
    "distribute_dataset",
    "per_replica_batch_size",
    "shard_policy",
]

log = logging.getLogger("tfdist")

# Shuffle buffer for datasets whose size is unknown or large (examples).
DEFAULT_SHUFFLE_BUFFER = 10_000
# Hosts with at most this many usable cores get tf.data's autotuning switched off (unless the
# dataset's options say otherwise): there, its model and background thread cost more than its
# choices gain, and a map with num_parallel_calls=AUTOTUNE runs one call per core instead
# (benchmarks/README.md, bench_input: measured on 2 cores).
SMALL_HOST_CORES = 2
# Used when shuffle=True, seed=None and the shards are taken *after* the shuffle (DATA
# sharding of a dataset on several workers): every worker must shuffle in the same order, or
# the shards would overlap. Each epoch still reshuffles.
SHARED_SEED = 0x7FD15

# Source datasets that read files, as tf.data's own auto-shard rewrite recognises them.
_READER_PREFIXES = (
    "TFRecordDataset",
    "TextLineDataset",
    "FixedLengthRecordDataset",
    "ArrayRecordDataset",
    "RecordIODataset",
    "SSTableDataset",
    "CSVDataset",
    "ExperimentalCSVDataset",
    "LMDBDataset",
    "ExperimentalLMDBDataset",
)
# Datasets that pass the elements of their first input through (count and identity).
_PASS_THROUGH = (
    "ShuffleDataset",
    "ShuffleDatasetV2",
    "ShuffleDatasetV3",
    "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2",
    "PrefetchDataset",
    "CacheDataset",
    "CacheDatasetV2",
    "RepeatDataset",
    "OptionsDataset",
    "ModelDataset",
    "MaxIntraOpParallelismDataset",
    "PrivateThreadPoolDataset",
    "AssertCardinalityDataset",
    "AssertNextDataset",
    "FinalizeDataset",
)

_WARNED: set = set()
_WARNED_LOCK = threading.Lock()


# --------------------------------------------------------------------------- batch size


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """The batch each replica computes: `global_batch_size / num_replicas`, exactly.

    Args:
        global_batch_size: int. Examples per step over all replicas of all workers.
        num_replicas: int. `strategy.num_replicas_in_sync`.

    Returns:
        int: the per-replica batch size.

    Raises:
        TypeError: a non-integer value.
        ValueError: a value < 1, or a global batch the replica count does not divide.
    """
    for name, value in (("global_batch_size", global_batch_size), ("num_replicas", num_replicas)):
        if not is_int(value):
            raise TypeError(
                f"{name} must be an int. Received: {name}={value!r} (of type "
                f"{type(value).__name__}). HINT: e.g. {name}=64."
            )
        if value < 1:
            raise ValueError(
                f"{name} must be >= 1. Received: {name}={value}. HINT: the global batch is "
                "the per-replica batch times the number of replicas, e.g. 32 x replicas."
            )
    if global_batch_size % num_replicas:
        lower = global_batch_size // num_replicas * num_replicas
        upper = lower + num_replicas
        choices = [size for size in (lower, upper) if size]
        suggestion = " or ".join(
            f"{size} (per-replica batch {size // num_replicas})" for size in choices
        )
        raise ValueError(
            f"global_batch_size={global_batch_size} is not divisible by the {num_replicas} "
            "replicas in sync, so the replicas cannot get equal batches (tfdist batch sizes "
            f"are global: summed over every replica). HINT: use a multiple of {num_replicas}, "
            f"e.g. global_batch_size={suggestion}."
        )
    return global_batch_size // num_replicas


# ----------------------------------------------------------------------- data -> dataset


def _kind(data) -> str:
    import tensorflow as tf

    if isinstance(data, tf.distribute.DistributedDataset):
        raise TypeError(
            "data is already a distributed dataset. HINT: pass the tf.data.Dataset (or a "
            "dataset_fn) before distributing it."
        )
    if isinstance(data, tf.data.Dataset):
        return "dataset"
    if callable(data) and not hasattr(data, "shape"):
        return "function"
    return "arrays"


def _as_structure(data):
    """numpy arrays x / (x, y) / (x, y, sample_weight) / dicts -> a nest of numpy arrays."""
    import numpy as np
    import tensorflow as tf

    def convert(value, where):
        if isinstance(value, collections.abc.Mapping):
            return {k: convert(v, f"{where}[{k!r}]") for k, v in value.items()}
        if isinstance(value, tuple) or (
            isinstance(value, list)
            and value
            and all(
                isinstance(v, (np.ndarray, tf.Tensor, tuple, collections.abc.Mapping))
                for v in value
            )
        ):
            # a tuple, or a list of arrays (Keras: several inputs); a list of numbers or of
            # lists is one array
            return tuple(convert(v, f"{where}[{i}]") for i, v in enumerate(value))
        if isinstance(value, tf.Tensor):
            return value.numpy()
        if value is None or isinstance(value, (str, bytes)):
            raise TypeError(
                f"data{where} is {value!r}. HINT: data is a tf.data.Dataset, a "
                "dataset_fn(input_context), or numpy arrays x, (x, y) or (x, y, "
                "sample_weight) (dicts of arrays allowed)."
            )
        array = np.asarray(value)
        if array.ndim == 0:
            raise ValueError(
                f"data{where} is a scalar ({value!r}); arrays need a first (example) dimension."
            )
        return array

    structure = convert(data, "")
    if isinstance(structure, tuple) and not 1 <= len(structure) <= 3:
        raise ValueError(
            f"data as a tuple is (x,), (x, y) or (x, y, sample_weight). Received a "
            f"{type(data).__name__} of {len(structure)} items. HINT: group multiple inputs as "
            "a tuple or dict inside x: ((x1, x2), y)."
        )
    lengths = {len(a) for a in tf.nest.flatten(structure)}
    if len(lengths) != 1:
        shapes = tf.nest.map_structure(lambda a: len(a), structure)
        raise ValueError(
            f"The arrays in data have different numbers of examples: {shapes}. HINT: every "
            "array needs the same first dimension."
        )
    examples = lengths.pop()
    if examples == 0:
        shapes = tf.nest.map_structure(lambda a: a.shape, structure)
        raise ValueError(
            f"data is empty: its arrays have 0 examples (shapes {shapes}). HINT: check that "
            "the data was loaded (a filter or a split can leave nothing)."
        )
    return structure, examples


def _refuse_empty_dataset(dataset) -> None:
    """A dataset whose cardinality is known to be 0 would end training before its first step."""
    import tensorflow as tf

    if tf.get_static_value(dataset.cardinality()) == 0:
        raise ValueError(
            f"data is an empty tf.data.Dataset (cardinality 0): {dataset!r}. HINT: check "
            "its source, filter, take() or batch(drop_remainder=True) with fewer examples "
            "than one batch."
        )


def steps_per_pass(data, global_batch_size: Optional[int] = None) -> Optional[int]:
    """Global steps (batches of `global_batch_size` over all replicas) in one pass over `data`.

    Arrays: ceil(examples / global_batch_size). A finite tf.data.Dataset: its batches, or
    ceil(examples / global_batch_size) for unbatched examples. None when that is not known (a
    dataset function, an infinite or unknown-length dataset, arrays without a batch size).
    """
    import math

    kind = _kind(data)
    if kind == "function":
        return None
    if kind == "arrays":
        if not global_batch_size:
            return None
        _, examples = _as_structure(data)
        return max(1, math.ceil(examples / global_batch_size))
    cardinality = int(data.cardinality())
    if cardinality < 0:  # tf.data.INFINITE_CARDINALITY or UNKNOWN_CARDINALITY
        return None
    if not global_batch_size:
        return cardinality
    return max(1, math.ceil(cardinality / global_batch_size))


def _shuffle_buffer(dataset, shuffle_buffer: Optional[int], size: Optional[int] = None) -> int:
    """The explicit buffer, else the dataset size when known and small enough, else 10000.

    Plain Python: dataset_fns also run inside tf.function (parameter_server), where the
    cardinality may be a symbolic tensor.
    """
    import tensorflow as tf

    if shuffle_buffer is not None:
        return int(shuffle_buffer)
    if size is None:
        static = tf.get_static_value(dataset.cardinality())
        size = int(static) if static is not None else -1
    return size if 0 < size <= DEFAULT_SHUFFLE_BUFFER * 10 else DEFAULT_SHUFFLE_BUFFER


def _static_batch_size(dataset) -> Optional[int]:
    import tensorflow as tf

    sizes = {
        spec.shape[0] if spec.shape.rank else None for spec in tf.nest.flatten(dataset.element_spec)
    }
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def _split_batches(dataset, num_replicas: int):
    """Splits each (global) batch into `num_replicas` per-replica batches, in order."""
    size = _static_batch_size(dataset)
    if size is not None:
        return dataset.rebatch(per_replica_batch_size(size, num_replicas))
    # Batch size unknown until run time (the last batch may be partial): tf.data's own
    # splitter, which experimental_distribute_dataset uses for the same job.
    from tensorflow.python.data.experimental.ops import distribute as tf_distribute_ops

    rebatch = tf_distribute_ops._LegacyRebatchDataset  # pylint: disable=protected-access
    return rebatch(dataset, num_replicas)


def _no_batched_shuffle(what: str = "shuffle=True"):
    return ValueError(
        f"{what} needs unbatched examples: this dataset is taken as already batched "
        "(no global_batch_size given). HINT: pass the unbatched dataset with "
        "global_batch_size=..., or shuffle / map it yourself before .batch()."
    )


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
    _check_features_container(features, map_fn)
    kind = _kind(data)
    if kind == "function":
        if features is not None:
            raise ValueError(
                "features= parses the records of a dataset tfdist builds, but data is a "
                f"dataset_fn ({data!r}), which is returned as is. HINT: pass the unbatched "
                "dataset of records (e.g. tf.data.TFRecordDataset(files)) as data, or parse "
                "inside your function with tf.io.parse_example after its batch()."
            )
        return data
    if global_batch_size is not None:
        per_replica_batch_size(global_batch_size, 1)  # type and range, before any graph work
    settings = _Settings(
        global_batch_size,
        shuffle,
        seed,
        repeat,
        map_fn,
        batch_map_fn,
        shuffle_buffer,
        _check_features(features),
    )
    if kind == "arrays":
        if global_batch_size is None:
            raise ValueError(
                "global_batch_size is required with arrays. HINT: pass global_batch_size="
                "(the batch over all replicas), e.g. 32 x the number of replicas."
            )
        structure, _ = _as_structure(data)
        if features is not None:
            _check_record_arrays(structure)
        return _ArraysFn(structure, settings)
    _refuse_empty_dataset(data)
    if global_batch_size is None:
        _refuse_on_batched(shuffle, map_fn, batch_map_fn, features)
    if features is not None:
        _check_records(data.element_spec, "data")
    return _DatasetFn(data, settings)


def _refuse_on_batched(shuffle, map_fn, batch_map_fn, features=None) -> None:
    for given, what in (
        (shuffle, "shuffle=True"),
        (map_fn is not None, "map_fn="),
        (batch_map_fn is not None, "batch_map_fn="),
        (features is not None, "features="),
    ):
        if given:
            raise _no_batched_shuffle(what)


# ------------------------------------------------------------- features: per-batch parsing

_FEATURE_TYPES = (
    "FixedLenFeature",
    "VarLenFeature",
    "FixedLenSequenceFeature",
    "SparseFeature",
    "RaggedFeature",
)


def _check_features_container(features, map_fn) -> None:
    """The checks of `features` that need no TensorFlow: a non-empty dict with str keys."""
    if features is None:
        return
    if not isinstance(features, Mapping):
        raise TypeError(
            "features must be a dict of feature name -> tf.io.FixedLenFeature / "
            f"VarLenFeature / ... . Received: features={features!r} (of type "
            f"{type(features).__name__}). HINT: e.g. features={{'x': "
            "tf.io.FixedLenFeature([64], tf.float32), 'y': tf.io.FixedLenFeature([], "
            "tf.int64)}."
        )
    if not features:
        raise ValueError(
            "features is an empty dict, so no feature would be parsed. HINT: name every "
            "feature of the tf.train.Example records to read, e.g. {'x': "
            "tf.io.FixedLenFeature([64], tf.float32)}; or leave features=None."
        )
    for name in features:
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"features keys are the feature names of the tf.train.Example records (non-"
                f"empty str). Received the key {name!r} (of type {type(name).__name__}). "
                "HINT: use the name under which the feature was written, e.g. 'x'."
            )
    if map_fn is not None:
        raise ValueError(
            f"features= and map_fn= cannot be combined: map_fn ({map_fn!r}) maps single "
            "records before batching, features= parses whole batches of records after "
            "batching, so map_fn would see serialized records. HINT: transform the parsed "
            "batch with batch_map_fn= (it receives the dict of parsed features, e.g. "
            "batch_map_fn=lambda f: (f['x'], f['y'])), or parse per record in map_fn and "
            "drop features=."
        )


def _check_features(features):
    """`features` as a plain dict, each value checked: a tf.io feature TensorFlow can parse.

    Parses an empty batch with each feature once, so that a feature tf.io.parse_example
    refuses fails here with its name, not later inside a dataset's trace.
    """
    if features is None:
        return None
    import tensorflow as tf

    spec = dict(features)
    allowed = tuple(getattr(tf.io, name) for name in _FEATURE_TYPES)
    for name, feature in spec.items():
        if not isinstance(feature, allowed):
            raise TypeError(
                f"features[{name!r}] is {feature!r} (of type {type(feature).__name__}), not a "
                "tf.io feature. HINT: describe each feature with one of tf.io."
                f"{', tf.io.'.join(_FEATURE_TYPES)}, e.g. features[{name!r}] = "
                "tf.io.FixedLenFeature([], tf.int64)."
            )
        dtype = getattr(feature, "dtype", None)
        if dtype is not None and tf.as_dtype(dtype) not in (tf.float32, tf.int64, tf.string):
            raise ValueError(
                f"features[{name!r}] has dtype {tf.as_dtype(dtype).name}, but tf.train.Example "
                "stores only float32 (FloatList), int64 (Int64List) and string (BytesList). "
                f"HINT: parse it as one of those (e.g. tf.io.FixedLenFeature(shape, "
                "tf.float32)) and cast it in batch_map_fn=."
            )
    for name, feature in spec.items():
        try:
            tf.io.parse_example(tf.constant([], tf.string), {name: feature})
        except (ValueError, TypeError, tf.errors.OpError) as err:
            reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]", "", str(err)).strip()
            reason = reason.splitlines()[-1].rstrip(".") if reason else type(err).__name__
            raise ValueError(
                f"features[{name!r}] = {feature!r} is not a feature tf.io.parse_example "
                f"accepts: {reason}. HINT: a FixedLenFeature needs a fully known shape (e.g. "
                "[64], or [] for a scalar) and a default_value of that shape if any; a "
                "FixedLenSequenceFeature needs allow_missing=True; for a feature of varying "
                "length use tf.io.VarLenFeature or tf.io.RaggedFeature."
            ) from None
    return spec


def _arrays_spec(structure):
    import tensorflow as tf

    def spec(array):
        kind = array.dtype.kind
        dtype = tf.string if kind in "SOU" else tf.as_dtype(array.dtype)
        return tf.TensorSpec(array.shape[1:], dtype)

    return tf.nest.map_structure(spec, structure)


def _check_record_arrays(structure) -> None:
    """features= on arrays: one array of serialized records, not numpy fixed-width bytes."""
    _check_records(_arrays_spec(structure), "data (arrays)")
    if structure.dtype.kind == "S":
        raise ValueError(
            f"features= with a numpy array of dtype {structure.dtype}: numpy's fixed-width "
            "bytes drop the trailing zero bytes of every value, which cuts serialized records "
            "that end in one. HINT: keep the records as np.array(records, dtype=object), or "
            "pass tf.data.TFRecordDataset(files)."
        )


def _check_records(element_spec, what: str) -> None:
    """features= parses serialized records: the examples must be scalar tf.string."""
    import tensorflow as tf

    if not (
        isinstance(element_spec, tf.TensorSpec)
        and element_spec.dtype == tf.string
        and element_spec.shape.rank in (0, None)
    ):
        raise ValueError(
            f"features= parses serialized tf.train.Example records, so {what} must yield "
            f"one scalar tf.string per example. Received examples of {element_spec!r}. "
            "HINT: pass the records themselves (e.g. tf.data.TFRecordDataset(files)), or, "
            "for examples already parsed, drop features= (and use map_fn= / batch_map_fn=)."
        )


@dataclasses.dataclass(frozen=True)
class _Settings:
    global_batch_size: Optional[int]
    shuffle: bool
    seed: Optional[int]
    repeat: bool
    map_fn: Optional[Callable]
    batch_map_fn: Optional[Callable]
    shuffle_buffer: Optional[int]
    features: Optional[dict] = None

    def finish(self, dataset, per_replica: int, size: Optional[int] = None):
        """map -> shuffle -> repeat -> batch -> parse -> batch map, on unbatched examples.

        No prefetch of tfdist's own: TensorFlow's defaults already parallelize stateless
        maps, fuse map and batch, and prefetch after a last synchronous step, and the
        strategy prefetches to its devices. On a small host, autotuning is off
        (`_for_small_hosts`).
        """
        import tensorflow as tf

        if self.map_fn is not None:
            dataset = dataset.map(
                self.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        if self.shuffle:
            dataset = dataset.shuffle(
                _shuffle_buffer(dataset, self.shuffle_buffer, size),
                seed=self.seed,
                reshuffle_each_iteration=True,
            )
        if self.repeat:
            dataset = dataset.repeat()
        dataset = dataset.batch(per_replica)
        if self.features is not None:
            features = self.features
            dataset = dataset.map(
                lambda records: tf.io.parse_example(records, features),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        if self.batch_map_fn is not None:
            dataset = dataset.map(
                self.batch_map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        return _for_small_hosts(dataset)


def _usable_cores() -> int:
    """The CPU cores this process may run on (its affinity), else the machine's count."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _for_small_hosts(dataset):
    """Autotuning off on hosts with at most SMALL_HOST_CORES usable cores, unless the
    dataset's options already decide it (the user's choice stays)."""
    if _usable_cores() > SMALL_HOST_CORES or dataset.options().autotune.enabled is not None:
        return dataset
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


class _ArraysFn:
    """dataset_fn for in-memory arrays: slices the arrays per input pipeline first."""

    def __init__(self, structure, settings: _Settings):
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


class _DatasetFn:
    """dataset_fn for a tf.data.Dataset: shards (FILE or DATA), then batches per replica."""

    def __init__(self, dataset, settings: _Settings, rebuild: Optional[Callable] = None):
        self.dataset, self.settings, self._rebuild = dataset, settings, rebuild

    def for_workers(self) -> "_DatasetFn":
        """This function for the workers of a parameter-server job (call it on the
        coordinator). A dataset made there holds tensors of the coordinator's process, which
        a worker cannot read ("Unable to parse tensor proto"); the copy serializes the
        dataset's graph now and rebuilds the dataset inside the function each worker traces,
        as ClusterCoordinator.create_per_worker_dataset does for a dataset."""
        from tensorflow.python.distribute.coordinator import values

        serialized = values.serialize_dataset_to_graph(self.dataset)
        spec = self.dataset.element_spec
        return _DatasetFn(
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
            dataset = _split_batches(dataset, replicas)
            if pipelines > 1:
                # `replicas` per-replica batches per global batch; pipeline i takes its own
                dataset = dataset.shard(pipelines, index)
            if self.settings.repeat:
                dataset = dataset.repeat()
            return dataset
        batch = per_replica_batch_size(self.settings.global_batch_size, replicas)
        if pipelines > 1:
            policy, reason = shard_policy(dataset, pipelines)
            _warn_data_sharding(policy, reason, pipelines)
            dataset = (
                _shard_files(dataset, pipelines, index)
                if policy == "FILE"
                else dataset.shard(pipelines, index)
            )
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


def _shard_files(dataset, num_workers: int, index: int):
    """FILE sharding inside a dataset_fn: tf.data's own rewrite, by FILE only."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import distribute as tf_distribute_ops

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return tf_distribute_ops._AutoShardDataset(  # pylint: disable=protected-access
        dataset.with_options(options), num_workers, index
    )


# ------------------------------------------------------------------ the shard decision


def _graph(dataset):
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    graph.ParseFromString(
        dataset._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN
        ).numpy()
    )
    return graph


def _functions_with_readers(graph) -> set:
    """Names of library functions that (directly or through nested functions) read files."""
    calls, direct = {}, set()
    for function in graph.library.function:
        name = function.signature.name
        calls[name] = set()
        for node in function.node_def:
            if node.op.startswith(_READER_PREFIXES):
                direct.add(name)
            for value in node.attr.values():
                if value.func.name:
                    calls[name].add(value.func.name)
                calls[name].update(f.name for f in value.list.func)
    found, changed = set(direct), True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in found and callees & found:
                found.add(name)
                changed = True
    return found


def _shape(const) -> list:
    """The dimensions of a Const node's value (without decoding it)."""
    return [int(d.size) for d in const.attr["value"].tensor.tensor_shape.dim]


def _source(graph):
    """What the dataset reads: ("files", count), ("files", None) or ("memory", source op)."""
    nodes = {n.name: n for n in graph.node}
    readers = _functions_with_readers(graph)

    def node_of(name):
        return nodes.get(name.lstrip("^").split(":")[0])

    def count_elements(node):
        """How many elements (file names) a small file-name dataset has, or None."""
        while node is not None and node.op in _PASS_THROUGH:
            node = node_of(node.input[0])
        if node is None:
            return None
        if node.op in ("TensorSliceDataset", "TensorDataset"):
            const = node_of(node.input[0])
            while const is not None and const.op == "Identity":
                const = node_of(const.input[0])
            if const is None or const.op != "Const":
                return None
            dims = _shape(const)
            if node.op == "TensorDataset":
                return math.prod(dims)
            return dims[0] if dims else None
        return None

    def walk(node, seen):
        if node is None or node.name in seen:
            return ("memory", "unknown")
        seen.add(node.name)
        if node.op.startswith(_READER_PREFIXES):
            files = node_of(node.input[0])
            while files is not None and files.op == "Identity":
                files = node_of(files.input[0])
            if files is not None and files.op == "Const":
                return ("files", math.prod(_shape(files)))
            return ("files", None)
        functions = {v.func.name for v in node.attr.values() if v.func.name}
        if functions & readers:
            return ("files", count_elements(node_of(node.input[0])))
        inputs = [node_of(i) for i in node.input if not i.startswith("^")]
        datasets = [n for n in inputs if n is not None and "Dataset" in n.op]
        if not datasets:
            return ("memory", node.op)
        results = [walk(d, seen) for d in datasets]
        files = [r for r in results if r[0] == "files"]
        if not files:
            return results[0]
        if len(files) != len(results) or any(r[1] is None for r in files):
            return ("files", None)
        return ("files", min(r[1] for r in files))

    output = next((n for n in graph.node if n.op == "_Retval"), None)
    if output is None:
        return ("memory", "unknown")
    return walk(node_of(output.input[0]), set())


def _unseeded_shuffle(graph) -> bool:
    from tensorflow.python.framework import tensor_util

    nodes = {n.name: n for n in graph.node}
    for node in graph.node:
        if node.op.startswith("Shuffle") and len(node.input) >= 4:
            seeds = [nodes.get(i.split(":")[0]) for i in node.input[2:4]]
            if all(s is not None and s.op == "Const" for s in seeds) and not any(
                int(tensor_util.MakeNdarray(s.attr["value"].tensor)) for s in seeds
            ):
                return True
    return False


def shard_policy(dataset, num_workers: int) -> Tuple[str, str]:
    """How `dataset` should be sharded over `num_workers` input pipelines, and why.

    "FILE" when the dataset reads files and every worker gets at least one file; else "DATA"
    (every worker reads all the data and keeps 1/num_workers of it); "OFF" for one worker.

    Returns:
        (policy, reason): "FILE" / "DATA" / "OFF", and a sentence for logs and warnings.
    """
    if num_workers <= 1:
        return "OFF", "one input pipeline: nothing to shard"
    try:
        graph = _graph(dataset)
    except Exception as err:  # pylint: disable=broad-except  (a dataset TF cannot serialise)
        return "DATA", (
            f"the dataset's graph could not be inspected ({type(err).__name__}), "
            "so tfdist cannot tell whether it reads files"
        )
    kind, detail = _source(graph)
    if kind == "memory":
        reason = (
            f"the dataset reads no files (its source is {detail}), so every worker "
            "builds all of it and keeps 1/{n} of the examples"
        )
    elif detail is None:
        reason = (
            "the dataset reads files, but tfdist could not count them (file names "
            "computed at run time, or several sources), so FILE sharding might leave "
            "a worker without data"
        )
    elif detail < num_workers:
        reason = (
            f"the dataset reads {detail} file(s) but there are {num_workers} workers, so "
            "FILE sharding would leave a worker without data; every worker reads all "
            "files and keeps 1/{n} of the examples"
        )
    else:
        return "FILE", f"{detail} files over {num_workers} workers, each reads only its files"
    reason = reason.replace("{n}", str(num_workers))
    if _unseeded_shuffle(graph):
        reason += (
            ". The dataset also shuffles without a seed before the shard is taken, so "
            "workers would keep overlapping examples: give that shuffle a seed= (the "
            "same on every worker)"
        )
    return "DATA", reason


def _warn_data_sharding(policy: str, reason: str, num_workers: int) -> None:
    if policy != "DATA":
        return
    with _WARNED_LOCK:
        if reason in _WARNED:
            return
        _WARNED.add(reason)
    from tfdist import task

    if task.is_chief():
        warnings.warn(
            f"tfdist shards this dataset by DATA over {num_workers} workers: {reason}. HINT: "
            f"write the data as at least {num_workers} files (e.g. TFRecord shards) for "
            "FILE sharding, where each worker reads only its own files.",
            UserWarning,
            stacklevel=3,
        )


# ---------------------------------------------------------------------- distributing it


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
            batched with the global batch), a dataset_fn(input_context), or numpy arrays
            x / (x, y) / (x, y, sample_weight) / dicts of arrays.
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
    replicas = strategy.num_replicas_in_sync
    if global_batch_size is not None:
        per_replica_batch_size(global_batch_size, replicas)
    kind = _kind(data)
    workers = _num_workers(strategy)
    if kind == "function" or (kind == "arrays" and workers > 1):
        # Arrays on several workers: each worker slices its own examples out of memory.
        fn = dataset_fn_for(
            data,
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
    if kind == "arrays":  # one worker: one global pipeline, whose size Keras can see
        if global_batch_size is None:
            dataset_fn_for(data)  # raises the error that names the fix
        structure, _ = _as_structure(data)
        if features is not None:
            _check_record_arrays(structure)
        data = tf.data.Dataset.from_tensor_slices(structure)
    _refuse_empty_dataset(data)
    _check_features_container(features, map_fn)
    if global_batch_size is None:
        _refuse_on_batched(shuffle, map_fn, batch_map_fn, features)
    if features is not None:
        _check_records(data.element_spec, "data")
    spec = _check_features(features)
    policy, reason = shard_policy(data, workers)
    _warn_data_sharding(policy, reason, workers)
    if global_batch_size is None:
        dataset = data.repeat() if repeat else data
    else:
        if shuffle and seed is None and policy == "DATA":
            seed = SHARED_SEED
        settings = _Settings(
            global_batch_size,
            shuffle,
            seed,
            repeat,
            map_fn,
            batch_map_fn,
            shuffle_buffer,
            spec,
        )
        dataset = settings.finish(data, global_batch_size)
    shard_options = tf.data.Options()
    shard_options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy
    )
    dataset = dataset.with_options(shard_options)
    log.debug("tfdist: %s sharding over %d worker(s): %s", policy, workers, reason)
    return strategy.experimental_distribute_dataset(dataset, options=options)
