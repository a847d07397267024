"""Fixes of Keras 3 and TensorFlow internals under tf.distribute, as checked records.

One module per area: `replicas` (mirrored and every strategy; a package of the sums over the
replicas, the optimizer, the trainer and random seeds), `uneven_batches`, `datasets`
(Keras' data adapters and tf.distribute's datasets), `multi_worker`, `callbacks`,
`parameter_server` (Keras 3's), `tf_keras_parameter_server` (tf_keras' own parameter-server
fit), `tensorflow` (TensorFlow internals tfdist reads), `iterators` (a distributed dataset's
iterators, dropped at once) and `collectives` (MultiWorkerMirroredStrategy's
all-reduce: compression and pieces).
`record` says what a fix is; `registry` holds them all and applies them; `keras_trainer` is
the Keras trainer module that fixes of several areas patch.
`tfdist.make_strategy` calls `apply_fixes()`; users call nothing else.
"""

from tfdist.fixes.record import CompatibilityWarning, Fix, FixStatus, Internal, Target
from tfdist.fixes.registry import (
    FIXES,
    applied,
    apply_fixes,
    fixes_enabled,
    register,
    report,
    turned_off,
)

__all__ = [
    "FIXES",
    "CompatibilityWarning",
    "Fix",
    "FixStatus",
    "Internal",
    "Target",
    "applied",
    "apply_fixes",
    "fixes_enabled",
    "register",
    "report",
    "turned_off",
]
