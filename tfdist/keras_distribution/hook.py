"""Installing tfdist's `keras.distribution` support when Keras is imported, not before.

`import tfdist` must not import TensorFlow (virtual devices and collectives are configured
after it), yet Keras's distribution API must be carried by tf.distribute from the first model
on. So `import tfdist` calls `watch()`: when Keras is already imported it installs at once;
otherwise a meta-path finder waits for the top-level `keras` package and installs right after
Keras finished importing (Keras then chose its backend; nothing of TensorFlow has run yet).

A leaf: imports nothing of tfdist at import time, nor TensorFlow.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import warnings

__all__ = ["watch"]

_LOCK = threading.Lock()


def watch() -> None:
    """Installs now if Keras is imported, else once it is. Idempotent; never raises."""
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "distribution"):
        _install()
        return
    with _LOCK:
        if not any(isinstance(f, _KerasFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _KerasFinder())


def _install() -> None:
    try:
        from tfdist.keras_distribution import install

        install()
    except Exception as err:  # an import must never fail because of tfdist
        warnings.warn(
            f"tfdist could not install its keras.distribution support: {type(err).__name__}: "
            f"{err}. keras.distribution behaves as upstream (a no-op on TensorFlow).",
            stacklevel=2,
        )


class _KerasFinder(importlib.abc.MetaPathFinder):
    """Finds `keras` with the other finders and runs `_install` after it executed."""

    def __init__(self):
        self._busy = threading.local()

    def find_spec(self, name, path=None, target=None):
        if name != "keras" or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenInstall(spec.loader)
        return spec


class _ThenInstall(importlib.abc.Loader):
    """Delegates to Keras's own loader; installs once the package executed."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _KerasFinder)]
        _install()

    def __getattr__(self, name):
        return getattr(self._loader, name)
