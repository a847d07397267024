"""Which Keras is in use (Keras 3 or tf_keras) and its version: every other module asks here.

tfdist supports Keras 3 (the default Keras since TensorFlow 2.16) and tf_keras (the legacy
Keras 2, selected by TensorFlow when TF_USE_LEGACY_KERAS=1). The releases tfdist supports are
in tfdist.releases; the fixes per Keras release in tfdist.fixes. Also here: progress bars on
the chief only (Keras' CallbackList, of either flavour).

Imports tfdist.settings and tfdist.releases; nothing here imports TensorFlow at import time.
"""

from __future__ import annotations

import functools
import os
from typing import Mapping, Optional

from tfdist import settings

MIN_TENSORFLOW = (2, 16)

_TRUE = ("1", "true", "yes", "on")


def uses_legacy_keras(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when TF_USE_LEGACY_KERAS selects tf_keras (how TensorFlow itself decides)."""
    env = os.environ if env is None else env
    return env.get("TF_USE_LEGACY_KERAS", "").strip().lower() in _TRUE


def keras_flavour() -> str:
    """ "tf_keras" (legacy Keras 2) or "keras3"."""
    return "tf_keras" if uses_legacy_keras() else "keras3"


@functools.lru_cache(maxsize=None)
def keras():
    """Returns the Keras module TensorFlow uses in this process (keras or tf_keras)."""
    if uses_legacy_keras():
        try:
            import tf_keras
        except ImportError:
            raise ImportError(
                "TF_USE_LEGACY_KERAS=1 selects tf_keras, which is not installed. HINT: "
                "pip install tf_keras (or tfdist with its `legacy` extra), or unset "
                "TF_USE_LEGACY_KERAS to use Keras 3."
            ) from None
        return tf_keras
    import keras as keras3

    return keras3


def keras_version() -> str:
    """The version of the Keras in use (Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1)."""
    return keras().__version__


def keras_version_tuple() -> tuple:
    from tfdist.releases import parse_version

    return parse_version(keras_version())


def keras_flavour_label() -> str:
    """ "tf_keras" or "Keras", for messages."""
    return "tf_keras" if uses_legacy_keras() else "Keras"


def versions() -> dict:
    """TensorFlow / Keras versions and the Keras flavour, for reports."""
    import tensorflow as tf

    return {
        "tensorflow": tf.__version__,
        "keras": keras().__version__,
        "keras_flavour": keras_flavour(),
    }


def check_tensorflow() -> None:
    """Raises ImportError when TensorFlow is older than tfdist supports."""
    import tensorflow as tf

    from tfdist.releases import parse_version

    if parse_version(tf.__version__)[:2] < MIN_TENSORFLOW:
        raise ImportError(
            f"tfdist needs TensorFlow >= {'.'.join(map(str, MIN_TENSORFLOW))}. Found: "
            f"{tf.__version__}. HINT: pip install -U 'tensorflow>=2.16'."
        )


_QUIET_PROGRESS = []  # the CallbackList class made quiet, once per process


def quiet_progress_off_the_chief(is_chief: bool, env: Optional[Mapping[str, str]] = None) -> bool:
    """Keras progress bars on the chief only, in a task of a multi-worker job.

    Every worker of a multi-worker job runs the same `fit`, and each would draw the same
    progress bar (`tfdist launch` shows them all). In a task that is not the chief, Keras'
    own `CallbackList` (Keras 3 or tf_keras) then adds no progress bar; a ProgbarLogger the
    script passes itself is kept. TFDIST_PROGRESS=all shows them on every task. Returns True
    when this process's bars are off.
    """
    if is_chief or settings.PROGRESS.get(env):  # TFDIST_PROGRESS=all
        return False
    callback_list = keras().callbacks.CallbackList
    if callback_list in _QUIET_PROGRESS:
        return True
    original = callback_list.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        kwargs["add_progbar"] = False  # Keras' fit, evaluate and predict pass it by keyword
        original(self, *args, **kwargs)

    callback_list.__init__ = __init__
    _QUIET_PROGRESS.append(callback_list)
    return True
