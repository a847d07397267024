"""Fixes of Keras 3's data adapters for the datasets tf.distribute makes.

Nothing here imports TensorFlow or Keras at import time.
"""

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


FIXES = (DATASETS_FROM_FUNCTION,)
