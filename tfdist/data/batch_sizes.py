"""Global batches: the batch of each replica, the steps of one pass, splitting batched data.

tfdist batch sizes are *global*: the examples of one step summed over every replica of every
worker. Each replica gets `global_batch_size / num_replicas_in_sync` of them, so a global batch
the replica count does not divide is refused, with the nearest sizes that work.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import math
from typing import Optional

from tfdist.data.inputs import ARRAYS, as_input
from tfdist.errors import is_int

__all__ = [
    "per_replica_batch_size",
    "require_global_batch_size",
    "split_batches",
    "static_batch_size",
    "steps_per_pass",
]


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


def require_global_batch_size(global_batch_size: Optional[int]) -> None:
    """Arrays have no batches of their own: they need a global batch size."""
    if global_batch_size is None:
        raise ValueError(
            "global_batch_size is required with arrays. HINT: pass global_batch_size="
            "(the batch over all replicas), e.g. 32 x the number of replicas."
        )


def steps_per_pass(data, global_batch_size: Optional[int] = None) -> Optional[int]:
    """Global steps (batches of `global_batch_size` over all replicas) in one pass over `data`.

    Arrays: ceil(examples / global_batch_size). A finite tf.data.Dataset: its batches, or
    ceil(examples / global_batch_size) for unbatched examples. None when that is not known (a
    dataset function, an infinite or unknown-length dataset, arrays without a batch size).

    Args:
        data: the data (see `classify`), or an `Input` it was classified into.
        global_batch_size: int. Defaults to None: the data are batched already.

    Returns:
        int or None.
    """
    source = as_input(data)
    if source.length is None or (source.kind == ARRAYS and not global_batch_size):
        return None
    if not global_batch_size:
        return source.length
    return max(1, math.ceil(source.length / global_batch_size))


def static_batch_size(dataset) -> Optional[int]:
    """The batch size of every element of a batched dataset, when its spec fixes one."""
    import tensorflow as tf

    sizes = {
        spec.shape[0] if spec.shape.rank else None for spec in tf.nest.flatten(dataset.element_spec)
    }
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def split_batches(dataset, num_replicas: int):
    """Splits each (global) batch into `num_replicas` per-replica batches, in order."""
    size = static_batch_size(dataset)
    if size is not None:
        return dataset.rebatch(per_replica_batch_size(size, num_replicas))
    # Batch size unknown until run time (the last batch may be partial): tf.data's own
    # splitter, which experimental_distribute_dataset uses for the same job.
    from tensorflow.python.data.experimental.ops import distribute as tf_distribute_ops

    rebatch = tf_distribute_ops._LegacyRebatchDataset  # pylint: disable=protected-access
    return rebatch(dataset, num_replicas)
