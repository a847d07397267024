"""The DataParallel part of the keras.io guide "Distributed training with Keras", as written
for Keras 3's `keras.distribution` API, run on the TensorFlow backend. Nothing here names
TensorFlow's strategies or tfdist: tfdist carries the Keras API on tf.distribute.

    # 2 processes on this machine (tfdist launch gives each task tfdist at start-up)
    tfdist launch --workers 2 examples/keras_distribution/data_parallel.py

    # one process over every local GPU (or logical CPU): add `import tfdist` before Keras, or
    python -c "import tfdist, runpy; runpy.run_path('examples/keras_distribution/data_parallel.py')"

Under SLURM or a Kubernetes TFJob, each process runs the same file with `import tfdist` added
at the top; `keras.distribution.initialize()` reads the job from the environment.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from tensorflow import data as tf_data  # noqa: E402


def get_model():
    # Make a simple convnet with batch normalization and dropout.
    inputs = layers.Input(shape=(28, 28, 1))
    y = layers.Flatten()(inputs)
    y = layers.Dense(units=200, use_bias=False, activation="relu")(y)
    y = layers.Dropout(0.4)(y)
    y = layers.Dense(units=10, activation="softmax")(y)
    model = keras.Model(inputs=inputs, outputs=y)
    return model


# Every device of the job: each process's GPUs, or one CPU per process.
devices = keras.distribution.list_devices()
print(f"Global devices: {devices}")

# A 1D mesh over them, named "data"; DataParallel(devices=devices) is the same.
mesh_1d = keras.distribution.DeviceMesh(shape=(len(devices),), axis_names=["data"], devices=devices)
data_parallel = keras.distribution.DataParallel(device_mesh=mesh_1d)

# Fake data: 128 examples in global batches of 16.
inputs = np.random.normal(size=(128, 28, 28, 1))
labels = np.random.normal(size=(128, 10))
dataset = tf_data.Dataset.from_tensor_slices((inputs, labels)).batch(16)

# Set the global distribution; the model's variables are replicated over the mesh.
keras.distribution.set_distribution(data_parallel)

model = get_model()
model.compile(loss="mse")
model.fit(dataset, epochs=3)
model.evaluate(dataset)
