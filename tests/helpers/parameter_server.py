"""Parameter-server test helpers: datasets and models shared by the cluster tests and the
proofs of the fixes (tests/helpers/fix_proofs.py), and a dataset function the argument checks
of tfdist.parameter_server refuse to reach."""

import numpy as np

SHARD_BYTES = 16 << 10  # tables above this are split over the ps tasks, dense layers are not
VOCAB, DIM, SEQ = 1000, 16, 4  # a 64 KiB table: two shards of 500 rows


def _dataset_fn(input_context):
    raise AssertionError("never called: arguments are checked first")


def _regression_dataset_fn(input_context):
    import tensorflow as tf

    x = np.random.RandomState(0).randn(256, 4).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8, drop_remainder=True)


def _embedding_dataset_fn(input_context):
    import tensorflow as tf

    ids = np.random.RandomState(1).randint(0, VOCAB, size=(1024, SEQ)).astype("int32")
    labels = (ids[:, 0] % 2).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((ids, labels))
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(32, drop_remainder=True)


def _embedding_model(keras):
    inputs = keras.Input((SEQ,), dtype="int32")
    table = keras.layers.Embedding(VOCAB, DIM, name="table")(inputs)
    outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(table))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def _op_types(function) -> list:
    return sorted({op.type for op in function.get_concrete_function().graph.get_operations()})


def _add_one(variable) -> None:
    variable.assign_add(1)  # the result unused, as in optimizer.apply
