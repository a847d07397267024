"""`horovod.tensorflow.keras.callbacks`, for this process's Keras (Keras 3 or tf_keras).

See `tfdist.horovod.callbacks`. Imports TensorFlow and Keras.
"""

from tfdist import flavour
from tfdist.horovod.callbacks import callback_classes

_CLASSES = callback_classes(flavour.keras())

BroadcastGlobalVariablesCallback = _CLASSES["BroadcastGlobalVariablesCallback"]
MetricAverageCallback = _CLASSES["MetricAverageCallback"]
LearningRateScheduleCallback = _CLASSES["LearningRateScheduleCallback"]
LearningRateWarmupCallback = _CLASSES["LearningRateWarmupCallback"]

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
]
