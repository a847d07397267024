"""The iterators of a distributed dataset, dropped at once: their per-device parts, and their
host's part where the dataset has nothing to tune.

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

The host's side of the iterator (the dataset the user wrote, as the strategy shards and
rebatches it) has a thread of its own, under mirrored and multi_worker_mirrored alike, and
loses the same race less often. Where that dataset provably has nothing to tune (every
dataset in it is of a kind listed in UNTUNED, a prefetch only of a fixed size, a map only the
strategy's own re-encoding of dense tensors, and the user set no autotune option), tfdist
turns autotuning off for it too. A dataset with `tf.data.AUTOTUNE` anywhere, a map or
interleave of the user's (tf.data parallelizes those under autotuning), or a kind not listed
keeps its options and its thread.

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
    # `autotune.enabled = False` among its options (the host's dataset is the next fix's).
    from tensorflow.python.data.ops import multi_device_iterator_ops

    original = multi_device_iterator_ops._create_device_dataset
    without_autotune = _autotune_off()

    def _create_device_dataset(
        prototype_ds, incarnation_id, prefetch_buffer_size, experimental_slack
    ):
        dataset = original(prototype_ds, incarnation_id, prefetch_buffer_size, experimental_slack)
        return dataset.with_options(without_autotune)

    multi_device_iterator_ops._create_device_dataset = _create_device_dataset


HOST_ITERATORS_DROPPED = Fix(
    name="host_iterators_dropped_at_once",
    summary=(
        "Dropping the iterator of a distributed dataset before its end waits for the "
        "autotuning thread of the host's pipeline, whose wake-up races its cancellation and "
        "which then sleeps out its interval, also where the dataset has nothing to tune "
        "(tensor slices, batch, cache, repeat, shuffle, a fixed-size prefetch)."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "a fit call with steps_per_epoch ends late now and then, by up to as long again as it "
        "ran (fit and tfdist.fit of a 1,024-wide MLP under multi_worker_mirrored at 0.62x a "
        "hand-written loop, 1.09x and 1.10x with the fix; benchmarks/bench_fit_step.py); "
        "results are the same."
    ),
    library="tensorflow",
)

# Datasets (tf.data's Python classes, by name) that have no parameter tf.data's autotuning
# tunes and that no autotuning-only rewrite (map_parallelization, inject_prefetch) changes.
# The same names on TensorFlow 2.16-2.21.
UNTUNED = frozenset(
    {
        "_TensorSliceDataset",
        "_TensorDataset",
        "_RangeDataset",
        "_BatchDataset",
        "_PaddedBatchDataset",
        "_UnbatchDataset",
        "CacheDataset",
        "_RepeatDataset",
        "_ShuffleDataset",
        "_TakeDataset",
        "_SkipDataset",
        "_ShardDataset",
        "_OptionsDataset",
        "_ZipDataset",
        "_ConcatenateDataset",
        # the strategy's own: auto-sharding, rebatching, and normalize_to_dense's wrapper
        "_AutoShardDataset",
        "_RebatchDataset",
        "_LegacyRebatchDataset",
        "_RestructuredDataset",
    }
)
_PREFETCH = "_PrefetchDataset"  # untuned with a buffer of a fixed size only
_RESTRUCTURED = "_RestructuredDataset"  # its input is normalize_to_dense's map
_MAP = "_MapDataset"


def nothing_to_tune(dataset) -> bool:
    """Whether tf.data's autotuning has nothing to tune in `dataset` and every input under it.

    True only when each dataset is of a kind in UNTUNED, or a prefetch of a fixed size, or the
    map that normalize_to_dense puts under a rebatch (an identity on dense tensors), and the
    dataset's options leave autotuning to its default.
    """
    if dataset.options().autotune.enabled is not None:
        return False  # the user chose
    seen, pending = set(), [(dataset, None)]
    while pending:
        current, consumer = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kind, inputs = type(current).__name__, current._inputs()  # pylint: disable=protected-access
        if kind == _PREFETCH:
            if not _fixed_size(current):
                return False
        elif kind == _MAP:
            if consumer != _RESTRUCTURED or not all(_dense(i.element_spec) for i in inputs):
                return False
        elif kind not in UNTUNED:
            return False
        pending.extend((each, kind) for each in inputs)
    return True


def _autotune_off():
    """tf.data options that turn autotuning (and its model thread) off."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _fixed_size(prefetch) -> bool:
    import tensorflow as tf

    size = tf.get_static_value(getattr(prefetch, "_buffer_size", None))
    return size is not None and int(size) >= 0


def _dense(spec) -> bool:
    import tensorflow as tf

    return all(isinstance(each, tf.TensorSpec) for each in tf.nest.flatten(spec))


@HOST_ITERATORS_DROPPED.variant(
    "2.16",
    targets=[
        Target(
            "tensorflow.python.data.ops.multi_device_iterator_ops:OwnedMultiDeviceIterator"
            ".__init__",
            ("self", "dataset", "devices"),
        )
    ],
)
def _fix_host_iterators_dropped():
    # tensorflow/python/data/ops/multi_device_iterator_ops.py: every distributed iterator in
    # eager mode (mirrored, multi_worker_mirrored; one worker's devices each) reads the
    # dataset on the host through an OwnedMultiDeviceIterator, whose MultiDeviceIteratorInit
    # makes a RootDataset iterator with autotuning on and its model thread. Where the dataset
    # has nothing to tune, the fix hands it over with `autotune.enabled = False`.
    from tensorflow.python.data.ops import multi_device_iterator_ops

    original = multi_device_iterator_ops.OwnedMultiDeviceIterator.__init__
    without_autotune = _autotune_off()

    def __init__(self, dataset=None, *args, **kwargs):
        try:
            untuned = dataset is not None and nothing_to_tune(dataset)
        except Exception:  # a dataset this reading does not know keeps its options
            untuned = False
        if untuned:
            dataset = dataset.with_options(without_autotune)
        original(self, dataset, *args, **kwargs)

    multi_device_iterator_ops.OwnedMultiDeviceIterator.__init__ = __init__


FIXES = (DEVICE_ITERATORS_DROPPED, HOST_ITERATORS_DROPPED)
