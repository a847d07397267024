"""The Keras 3 TensorFlow backend's internals that fixes patch, found by what they are.

Keras 3.16 moved the backend's op modules into a subpackage (keras/src/backend/tensorflow/
core.py is ops/core.py, image.py ops/image.py, ...). Fixes reach them through these places:
the backend's `Variable` class as the backend package exports it (on every release), an op
module at its newest path or its older one, the optimizer class as the class the backend's
optimizer module defines that subclasses the base optimizer.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.record import Place

_BACKEND = "keras.src.backend.tensorflow"

VARIABLE = Place.first_of(
    "the TensorFlow Variable class",
    f"{_BACKEND}:Variable",
    f"{_BACKEND}.ops.core:Variable",
    f"{_BACKEND}.core:Variable",
)
OPTIMIZER = Place.class_in(
    "the TensorFlow optimizer class",
    f"{_BACKEND}.optimizer",
    base=Place.first_of(
        "the base optimizer class", "keras.src.optimizers.base_optimizer:BaseOptimizer"
    ),
)
# Op modules whose globals a fix replaces (draw_seed): the newest path first, so that an
# older path a release keeps as an alias never shadows the module its ops really use.
IMAGE_OPS = Place.first_of(
    "the TensorFlow image ops module", f"{_BACKEND}.ops.image", f"{_BACKEND}.image"
)
RANDOM_OPS = Place.first_of(
    "the TensorFlow random ops module", f"{_BACKEND}.ops.random", f"{_BACKEND}.random"
)
