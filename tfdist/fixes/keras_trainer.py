"""The Keras 3 trainer classes that fixes of several areas patch, found by what they are.

Keras 3.16 renamed them: the TensorFlow backend's trainer (keras/src/backend/tensorflow/
trainer.py) was `TensorFlowTrainer` and is `Trainer`, the backend-independent one
(keras/src/trainers/trainer.py) was `Trainer` and is `BaseTrainer`. Fixes name neither: they
patch `TF_TRAINER` (the class the backend's trainer module defines that subclasses the base
trainer) and `BASE_TRAINER` (the class the base module defines that defines `compile` and
`fit`), so a rename of that kind needs no new variant.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.record import Place

# The TensorFlow backend's trainer module: its trainer class, epoch iterator and the helpers
# (reduce_per_replica, ...) that fixes patch as "<TRAINER>:name".
TRAINER = "keras.src.backend.tensorflow.trainer"

BASE_TRAINER = Place.class_in(
    "the base trainer class", "keras.src.trainers.trainer", defines=("compile", "fit")
)
TF_TRAINER = Place.class_in("the TensorFlow trainer class", TRAINER, base=BASE_TRAINER)


def tf_trainer():
    """The module `TRAINER`, imported (with Keras and TensorFlow) when a fix is applied."""
    from keras.src.backend.tensorflow import trainer

    return trainer


def needs_a_batch(model) -> bool:
    """What Keras' _symbolic_build (3.5 on) builds from a batch: layers, compiled metrics, loss."""
    metrics, loss = model._compile_metrics, model._compile_loss
    return (
        not all(layer.built for layer in model._flatten_layers())
        or (metrics is not None and not metrics.built)
        or (loss is not None and not loss.built)
    )
