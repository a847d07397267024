"""Fixes of Keras 3's data adapters for the datasets tf.distribute makes, and for a Python
generator read under a strategy.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.keras_trainer import TF_TRAINER, needs_a_batch
from tfdist.fixes.record import Fix, Target

DATASETS_FROM_FUNCTION = Fix(
    name="distributed_datasets_from_function_in_fit",
    summary=(
        "Keras 3 before 3.9 does not take the dataset `strategy.distribute_datasets_from_function` "
        "returns as a dataset: fit, evaluate and predict refuse it."
    ),
    upstream="keras-team/keras#20134",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "model.fit / evaluate / predict of a dataset from distribute_datasets_from_function, and "
        'tfdist.fit under multi_worker_mirrored, fail with "Unrecognized data type: '
        'x=<...DistributedDatasetsFromFunction ...>".'
    ),
    fixed_in="3.9",
)


@DATASETS_FROM_FUNCTION.variant(
    "3.3",
    targets=[
        Target("keras.src.trainers.data_adapters:is_tf_dataset", ("x",)),
        Target(
            "keras.src.trainers.data_adapters:get_data_adapter",
            ("x", "y", "sample_weight", "batch_size", "steps_per_epoch", "shuffle"),
        ),
    ],
)
def _fix_datasets_from_function():
    # keras/src/trainers/data_adapters/__init__.py: get_data_adapter picks TFDatasetAdapter when
    # is_tf_dataset(x), which looks for the class names DatasetV2 and DistributedDataset in x's
    # MRO; DistributedDatasetsFromFunction has neither, so it falls through to "Unrecognized
    # data type". TFDatasetAdapter and the TensorFlow trainer already iterate it (Keras 3.9 only
    # added the name, keras-team/keras#20829). get_data_adapter reads the module's global.
    from keras.src.trainers import data_adapters

    original = data_adapters.is_tf_dataset

    def is_tf_dataset(x):
        if original(x):
            return True
        return any(
            parent.__name__ == "DistributedDatasetsFromFunction"
            and "tensorflow.python." in str(parent.__module__)
            for parent in type(x).__mro__
        )

    data_adapters.is_tf_dataset = is_tf_dataset


_GENERATOR_ADAPTER = "keras.src.trainers.data_adapters.generator_data_adapter"

GENERATOR_READ_ONCE = Fix(
    name="python_generator_read_once",
    summary=(
        "Under a strategy, fit and evaluate first take a batch through a distributed iterator of "
        "their own, to build the model, and drop it: on a Python generator, which gives each "
        "batch once, that iterator's prefetch takes batches the epoch then misses, and an "
        "exception the generator raises among them is dropped with it."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        "model.fit / evaluate of a Python generator under a strategy train on fewer batches "
        "than it yields (16 of 20, no error), and an exception it raises in its first batches "
        "(the 5th of 20) ends the epoch as if the data ran out: fit returns normally."
    ),
    absent_before=(
        "Keras before 3.5 builds the model when the step is traced, without a batch of its own"
    ),
)


@GENERATOR_READ_ONCE.variant(
    "3.5",
    targets=[
        TF_TRAINER.target("_maybe_symbolic_build", ("self", "iterator", "data_batch")),
        Target(f"{_GENERATOR_ADAPTER}:GeneratorDataAdapter.__init__", ("self", "generator")),
        Target(f"{_GENERATOR_ADAPTER}:GeneratorDataAdapter.get_tf_dataset", ("self",)),
        Target("keras.src.layers.layer:Layer._flatten_layers", ("self",)),
    ],
)
def _fix_generator_read_once():
    # No upstream issue found (keras-team/keras up to 3.16.0.dev still has it). Under a
    # strategy, the TensorFlow trainer's fit and evaluate (keras/src/backend/tensorflow/
    # trainer.py) call _maybe_symbolic_build(iterator=epoch_iterator) before the epoch: it
    # makes a distributed iterator of the epoch's dataset, takes one batch to learn the shapes
    # and drops the iterator (tfdist's symbolic_build_from_a_local_batch takes a local batch
    # the same way). For a Python generator that dataset is GeneratorDataAdapter.get_tf_dataset
    # (keras/src/trainers/data_adapters/generator_data_adapter.py): from_generator over the
    # one generator, then prefetch(AUTOTUNE), then the MultiDeviceIterator's buffers, which
    # pull several batches ahead. Those batches are gone when the epoch's own iterator reads
    # the generator; an exception the generator raised there (InvalidArgumentError /
    # UnknownError "ValueError: ...") is held by the dropped iterator only, and a generator
    # that raised is finished, so the epoch sees end of data: OutOfRangeError, which the epoch
    # iterator's catch_stop_iteration takes for the data's end. (tf.distribute's input_lib
    # and MultiDeviceIterator pass the error on: a custom loop over
    # experimental_distribute_dataset raises it.) The fix builds from the batch
    # GeneratorDataAdapter has already read (its _first_batches, which it yields again first),
    # converted by a copy of the adapter's own get_tf_dataset: the generator is not read
    # before the epoch. Its batch dimension is the global batch's, not a replica's: the build
    # learns the layers' shapes and dtypes from it, which do not depend on the batch size.
    # Other inputs (datasets, arrays, a PyDataset, whose items are read again by index):
    # unchanged.
    from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter

    cls = TF_TRAINER.get()
    original = cls._maybe_symbolic_build  # upstream's, or symbolic_build_from_a_local_batch's

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        adapter = getattr(iterator, "data_adapter", None)
        if (
            data_batch is not None
            or self._distribute_strategy is None
            or not isinstance(adapter, GeneratorDataAdapter)
            or not getattr(adapter, "_first_batches", None)
        ):
            return original(self, iterator=iterator, data_batch=data_batch)
        batch = _first_batch(adapter) if needs_a_batch(self) else None
        return original(self, iterator=None, data_batch=batch)

    cls._maybe_symbolic_build = _maybe_symbolic_build


def _first_batch(adapter):
    """The generator's first batch as the epoch's dataset gives it (tensors; None where the
    generator yields None), from the batches the adapter has read already."""
    import copy

    import tensorflow as tf
    from keras.src import tree

    first = list(adapter._first_batches[:1])
    probe = copy.copy(adapter)
    # Keras 3.5-3.6 keep the generator as an iterator, later releases as a function that
    # returns one.
    probe.generator = (lambda: iter(first)) if callable(adapter.generator) else iter(first)
    batch = next(iter(probe.get_tf_dataset()))
    return tree.map_structure(
        lambda v: None if isinstance(v, tf.experimental.Optional) else v, batch
    )


FIXES = (DATASETS_FROM_FUNCTION, GENERATOR_READ_ONCE)
