"""The guide's DataParallel training (examples/keras_distribution/data_parallel.py) with
`auto_shard_dataset=False`: each process builds its own half of every global batch of 16.
Run through keras_guide.py, so its weights compare with the guide's one-device training."""

import keras
import numpy as np
from keras.src.backend import distribution_lib as backend_lib  # tfdist's
from tensorflow import data as tf_data

keras.distribution.initialize()  # first: joins the job before any TensorFlow op
inputs = np.random.normal(size=(128, 28, 28, 1))  # the guide's data, drawn in the same order
labels = np.random.normal(size=(128, 10))
process = backend_lib.process_id()
dataset = (
    tf_data.Dataset.from_tensor_slices((inputs, labels))
    .batch(16)
    .map(lambda x, y: (x[8 * process : 8 * process + 8], y[8 * process : 8 * process + 8]))
)
keras.distribution.set_distribution(
    keras.distribution.DataParallel(
        devices=keras.distribution.list_devices(), auto_shard_dataset=False
    )
)
inputs_ = keras.layers.Input(shape=(28, 28, 1))
y = keras.layers.Flatten()(inputs_)
y = keras.layers.Dense(units=200, use_bias=False, activation="relu")(y)
y = keras.layers.Dropout(0.4)(y)
y = keras.layers.Dense(units=10, activation="softmax")(y)
model = keras.Model(inputs=inputs_, outputs=y)
model.compile(loss="mse")
model.fit(dataset, epochs=3)
