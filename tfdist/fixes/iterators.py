"""The iterators of a dataset distributed over several local devices (mirrored), dropped at once.

Under mirrored, an iterator of `strategy.experimental_distribute_dataset` reads the dataset on
the host and feeds each device through a pipeline of its own: a generator taking that device's
share, then a prefetch of a fixed size. tf.data autotunes each such pipeline in a thread that
sleeps for doubling intervals (10 ms, 20 ms, ... up to a minute). Dropping the iterator cancels
that thread and waits for it to end, and the wake-up races the cancellation: TensorFlow's
CancellationManager::StartCancel runs its callbacks (here: wake the thread) before it marks
itself cancelled, so a thread that wakes at once finds itself not cancelled and sleeps out its
interval (Model::OptimizeLoop). Dropping an iterator before its end (as `fit` does at the end
of every call with `steps_per_epoch`) then waits about as long again as the iterator had lived
(0.15-0.5 s after a fit of 240 steps, seconds for an iterator a few seconds old), in the thread
that drops it.

Those per-device pipelines have nothing to tune (their prefetch has a fixed size, their
generator no parallelism), so tfdist turns autotuning off for them alone: no thread, no wait.
The dataset the user wrote keeps its options, autotuning included, and its own thread
(the host's side of the iterator) can still lose that race, less often.

Nothing here imports TensorFlow at import time.
"""

from tfdist.fixes.record import Fix, Target

DEVICE_ITERATORS_DROPPED = Fix(
    name="device_iterators_dropped_at_once",
    summary=(
        "Dropping the iterator of a dataset distributed over several local devices before its "
        "end waits for the autotuning thread of each device's pipeline (a generator and a "
        "fixed-size prefetch, nothing to tune), whose wake-up races its cancellation and which "
        "then sleeps out its interval: about as long again as the iterator had lived."
    ),
    upstream="none found",
    strategies=("mirrored",),
    consequence=(
        "each fit call with steps_per_epoch ends 0.15-0.5 s late under mirrored (fit of 240 "
        "steps of a small model at 0.89x a hand-written loop, tfdist.fit at 0.6x; "
        "benchmarks/bench_fit_step.py), and dropping an iterator 6 s old takes 4 s or more; "
        "results are the same."
    ),
    library="tensorflow",
)

_TARGET = "tensorflow.python.data.ops.multi_device_iterator_ops:_create_device_dataset"


@DEVICE_ITERATORS_DROPPED.variant(
    "2.16",
    targets=[
        Target(
            _TARGET,
            ("prototype_ds", "incarnation_id", "prefetch_buffer_size", "experimental_slack"),
        )
    ],
)
def _fix_device_iterators_dropped():
    # tensorflow/python/data/ops/multi_device_iterator_ops.py: _create_device_dataset builds
    # each device's dataset (a _ReincarnatedPerDeviceGenerator, then a prefetch of
    # prefetch_buffer_size), for MultiDeviceIterator, OwnedMultiDeviceIterator and their
    # resets alike; each is iterated with iter(), so each gets a RootDataset with autotuning on
    # and its model thread (Model::OptimizeLoop). The fix returns the same dataset with
    # `autotune.enabled = False` among its options; the host's dataset is untouched.
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops

    original = multi_device_iterator_ops._create_device_dataset
    without_autotune = tf.data.Options()
    without_autotune.autotune.enabled = False

    def _create_device_dataset(
        prototype_ds, incarnation_id, prefetch_buffer_size, experimental_slack
    ):
        dataset = original(prototype_ds, incarnation_id, prefetch_buffer_size, experimental_slack)
        return dataset.with_options(without_autotune)

    multi_device_iterator_ops._create_device_dataset = _create_device_dataset


FIXES = (DEVICE_ITERATORS_DROPPED,)
