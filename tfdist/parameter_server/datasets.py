"""The dataset functions of parameter-server training: one dataset made on every worker.

A dataset function (callable(InputContext) -> tf.data.Dataset of batches) is checked and
repeated, so that a fixed number of steps never runs out; the coordinator makes one dataset
per worker from it, and makes one batch locally to learn the data's shapes and dtypes.

TensorFlow is imported inside functions only. Holds no state.
"""

from __future__ import annotations

from typing import Callable


def repeating(name: str, dataset_fn: Callable) -> Callable:
    """`dataset_fn`, checked, and repeated so that a fixed number of steps never runs out."""
    import tensorflow as tf

    def make(input_context):
        dataset = dataset_fn(input_context)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"`{name}` must return a tf.data.Dataset of batches. Received: "
                f"{dataset!r} (of type {type(dataset).__name__})."
            )
        return dataset.repeat()  # a no-op in effect on an infinite dataset

    return make


def per_worker_dataset(coordinator, strategy, name: str, dataset_fn: Callable):
    """The coordinator's per-worker dataset of `dataset_fn`, repeated, made on every worker."""
    # tfdist's function of a dataset made here: rebuilt from its graph on each worker
    dataset_fn = getattr(dataset_fn, "for_workers", lambda: dataset_fn)()
    make = repeating(name, dataset_fn)
    return coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(make)
    )


def local_batch(name: str, dataset_fn: Callable):
    """One batch of `dataset_fn`, made on the coordinator (to learn shapes and dtypes)."""
    import tensorflow as tf

    dataset = repeating(name, dataset_fn)(tf.distribute.InputContext())
    try:
        return next(iter(dataset.take(1)))
    except StopIteration:
        raise ValueError(
            f"`{name}` returned an empty dataset (no batch at all, even on one input pipeline)."
            " HINT: check the data source, and that batch(..., drop_remainder=True) leaves a "
            "batch."
        ) from None
