"""The Keras 3 TensorFlow trainer module (keras/src/backend/tensorflow/trainer.py), which fixes
of several areas patch: its import path, for their targets, and the module itself.

Nothing here imports TensorFlow or Keras at import time.
"""

# The module path, as the fixes' targets name it ("<TRAINER>:TensorFlowTrainer.train_step").
TRAINER = "keras.src.backend.tensorflow.trainer"


def tf_trainer():
    """The module `TRAINER`, imported (with Keras and TensorFlow) when a fix is applied."""
    from keras.src.backend.tensorflow import trainer

    return trainer
