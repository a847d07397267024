"""The one home of TensorFlow / Keras version gates and of the Keras flavour.

tfdist supports Keras 3 (the default Keras since TensorFlow 2.16) and tf_keras (the legacy
Keras 2, selected by TensorFlow when TF_USE_LEGACY_KERAS=1). Every other module asks this one
which Keras is in use, instead of testing versions itself.

Nothing here imports TensorFlow at import time.
"""

from __future__ import annotations

import functools
import os
from typing import Mapping, Optional

MIN_TENSORFLOW = (2, 16)

_TRUE = ("1", "true", "yes", "on")


def uses_legacy_keras(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when TF_USE_LEGACY_KERAS selects tf_keras (how TensorFlow itself decides)."""
    env = os.environ if env is None else env
    return env.get("TF_USE_LEGACY_KERAS", "").strip().lower() in _TRUE


def keras_flavour() -> str:
    """"tf_keras" (legacy Keras 2) or "keras3"."""
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
                "pip install 'tfdist[legacy]' (or pip install tf_keras), or unset "
                "TF_USE_LEGACY_KERAS to use Keras 3."
            ) from None
        return tf_keras
    import keras as keras3

    return keras3


def _version_tuple(text: str) -> tuple:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


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

    if _version_tuple(tf.__version__)[:2] < MIN_TENSORFLOW:
        raise ImportError(
            f"tfdist needs TensorFlow >= {'.'.join(map(str, MIN_TENSORFLOW))}. Found: "
            f"{tf.__version__}. HINT: pip install -U 'tensorflow>=2.16'."
        )


# =============================================================================================
# Fixes of Keras 3 internals under tf.distribute.
#
# Each fix is a function registered with @keras_fix: it patches one Keras 3 internal at the
# right depth, is a no-op outside the strategies it concerns (single-device Keras behaviour is
# never changed), names its upstream issue in a comment, and has a test that fails without it
# (tests run with TFDIST_KERAS_FIXES=0 to show the upstream failure).
# `apply_keras_fixes()` is called by `tfdist.make_strategy`; users call nothing else.
# Opt out: TFDIST_KERAS_FIXES=0.
# =============================================================================================

_FIXES: dict = {}
_APPLIED: set = set()
# Keras 3 releases whose internals the fixes were written against and tested with.
KERAS_FIXES_TESTED = ((3, 10), (3, 15))


def keras_fix(name: str):
    """Registers a fix of Keras 3 internals, applied once by `apply_keras_fixes`."""

    def register(function):
        _FIXES[name] = function
        return function

    return register


def keras_fixes_enabled(env: Optional[Mapping[str, str]] = None) -> bool:
    env = os.environ if env is None else env
    return env.get("TFDIST_KERAS_FIXES", "1").strip().lower() not in ("0", "false", "no", "off")


def apply_keras_fixes() -> list:
    """Applies every registered fix once (Keras 3 only). Returns the names applied so far.

    A no-op under tf_keras, or with TFDIST_KERAS_FIXES=0.
    """
    if uses_legacy_keras() or not keras_fixes_enabled():
        return sorted(_APPLIED)
    version = _version_tuple(keras().__version__)[:2]
    if not KERAS_FIXES_TESTED[0] <= version <= KERAS_FIXES_TESTED[1]:
        import warnings

        warnings.warn(
            f"tfdist's Keras fixes were tested with Keras {KERAS_FIXES_TESTED[0]} to "
            f"{KERAS_FIXES_TESTED[1]}; this is Keras {keras().__version__}. They are applied, "
            "but report problems (TFDIST_KERAS_FIXES=0 turns them off).", stacklevel=2)
    for name, function in _FIXES.items():
        if name not in _APPLIED:
            function()
            _APPLIED.add(name)
    return sorted(_APPLIED)


# --------------------------------------------------- mirrored and multi_worker_mirrored fixes


# ------------------------------------------------------------------ parameter_server fixes
