"""The steps after sharding: map -> shuffle -> repeat -> batch -> parse -> batch map.

`Settings` holds the options of `dataset_fn_for` / `distribute_dataset` that shape a pipeline,
and `Settings.finish` applies them to unbatched examples. Shuffling and maps need unbatched
examples, so they are refused on a dataset taken as already batched (`refuse_on_batched`).

No prefetch of tfdist's own: TensorFlow's defaults already parallelize stateless maps, fuse map
and batch, and prefetch after a last synchronous step, and the strategy prefetches to its
devices. On a host of at most `SMALL_HOST_CORES` usable cores tf.data's autotuning is switched
off (unless the dataset's options say otherwise): there its model and background thread cost
more than its choices gain, and a map with num_parallel_calls=AUTOTUNE runs one call per core
instead (benchmarks/README.md, bench_input: measured on 2 cores).

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from tfdist.data.features import parse_batches

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "SMALL_HOST_CORES",
    "Settings",
    "refuse_on_batched",
]

# Shuffle buffer for datasets whose size is unknown or large (examples).
DEFAULT_SHUFFLE_BUFFER = 10_000
# Hosts with at most this many usable cores get tf.data's autotuning switched off.
SMALL_HOST_CORES = 2


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a pipeline maps, shuffles, repeats, batches and parses its examples."""

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

        Args:
            dataset: tf.data.Dataset of unbatched examples (this pipeline's shard).
            per_replica: int. The batch size of the result.
            size: int. Examples in `dataset`, when the caller knows them. Defaults to None.
        """
        import tensorflow as tf

        if self.map_fn is not None:
            dataset = dataset.map(
                self.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        if self.shuffle:
            dataset = dataset.shuffle(
                _shuffle_buffer_size(dataset, self.shuffle_buffer, size),
                seed=self.seed,
                reshuffle_each_iteration=True,
            )
        if self.repeat:
            dataset = dataset.repeat()
        dataset = dataset.batch(per_replica)
        if self.features is not None:
            dataset = parse_batches(dataset, self.features)
        if self.batch_map_fn is not None:
            dataset = dataset.map(
                self.batch_map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        return _for_small_hosts(dataset)


def _shuffle_buffer_size(dataset, shuffle_buffer: Optional[int], size: Optional[int] = None) -> int:
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


def refuse_on_batched(shuffle, map_fn, batch_map_fn, features=None) -> None:
    """Shuffling, maps and `features=` need unbatched examples: refused on a dataset taken
    as already batched (no global_batch_size given)."""
    for given, what in (
        (shuffle, "shuffle=True"),
        (map_fn is not None, "map_fn="),
        (batch_map_fn is not None, "batch_map_fn="),
        (features is not None, "features="),
    ):
        if given:
            raise ValueError(
                f"{what} needs unbatched examples: this dataset is taken as already batched "
                "(no global_batch_size given). HINT: pass the unbatched dataset with "
                "global_batch_size=..., or shuffle / map it yourself before .batch()."
            )


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
    if _usable_cores() > SMALL_HOST_CORES:
        return dataset
    import warnings

    with warnings.catch_warnings():
        # In a dataset function traced as a graph (parameter_server) TensorFlow warns that it
        # reads the options of the dataset's Python object; that is the user's choice we want.
        warnings.simplefilter("ignore", UserWarning)
        chosen = dataset.options().autotune.enabled
    if chosen is not None:
        return dataset
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
