"""Sharding: which part of the data each input pipeline (one per worker) reads.

One epoch must see every example exactly once across the job. A dataset that reads files is
sharded by FILE (each worker opens only its files) when every worker gets at least one file;
otherwise by DATA (every worker reads everything and keeps its share), with a one-time warning,
on the chief, that says why and how to get FILE sharding.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import threading
import warnings
from typing import Tuple

from tfdist.data.dataset_graph import reads, serialized_graph, unseeded_shuffle

__all__ = ["SHARED_SEED", "shard", "shard_policy", "warn_data_sharding"]

# Used when shuffle=True, seed=None and the shards are taken *after* the shuffle (DATA
# sharding of a dataset on several workers): every worker must shuffle in the same order, or
# the shards would overlap. Each epoch still reshuffles.
SHARED_SEED = 0x7FD15

_WARNED: set = set()
_WARNED_LOCK = threading.Lock()


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
        graph = serialized_graph(dataset)
    except Exception as err:  # pylint: disable=broad-except  (a dataset TF cannot serialise)
        return "DATA", (
            f"the dataset's graph could not be inspected ({type(err).__name__}), "
            "so tfdist cannot tell whether it reads files"
        )
    kind, detail = reads(graph)
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
    if unseeded_shuffle(graph):
        reason += (
            ". The dataset also shuffles without a seed before the shard is taken, so "
            "workers would keep overlapping examples: give that shuffle a seed= (the "
            "same on every worker)"
        )
    return "DATA", reason


def warn_data_sharding(policy: str, reason: str, num_workers: int, stacklevel: int = 2) -> None:
    """Warns once per reason, on the chief only, that a dataset is sharded by DATA.

    Args:
        stacklevel: int. The frame the warning names, counted from the caller (1): 2 names
            the caller's caller. Defaults to 2.
    """
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
            stacklevel=stacklevel + 1,
        )


def shard(dataset, num_workers: int, index: int):
    """Input pipeline `index`'s part of `dataset` (inside a dataset_fn): by FILE when
    `shard_policy` says so, else every `num_workers`-th element; warns on DATA sharding."""
    policy, reason = shard_policy(dataset, num_workers)
    warn_data_sharding(policy, reason, num_workers, stacklevel=3)  # who called the dataset_fn
    if policy == "FILE":
        return _shard_files(dataset, num_workers, index)
    return dataset.shard(num_workers, index)


def _shard_files(dataset, num_workers: int, index: int):
    """FILE sharding inside a dataset_fn: tf.data's own rewrite, by FILE only."""
    import tensorflow as tf
    from tensorflow.python.data.experimental.ops import distribute as tf_distribute_ops

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return tf_distribute_ops._AutoShardDataset(  # pylint: disable=protected-access
        dataset.with_options(options), num_workers, index
    )
