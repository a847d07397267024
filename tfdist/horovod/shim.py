"""`import horovod...` gives tfdist's modules, where Horovod itself is not installed.

`install()` appends a finder to the end of `sys.meta_path`: Python asks it only after every
other finder failed, so a real Horovod installation always wins and is never shadowed. The
launcher's start-up module runs `install()` in each process of `tfdist horovodrun` (which sets
TFDIST_HOROVOD_SHIM=1), so an unmodified Horovod script runs there; any program can call it too.

| import | gives |
| --- | --- |
| `horovod` | a package with only the submodules below |
| `horovod.tensorflow` | `tfdist.horovod.tensorflow` |
| `horovod.tensorflow.keras` | `tfdist.horovod.tensorflow.keras` |
| `horovod.tensorflow.keras.callbacks` | `tfdist.horovod.tensorflow.keras.callbacks` |
| `horovod.keras` (and `.callbacks`) | the same as `horovod.tensorflow.keras` |

Imports nothing of TensorFlow until one of those modules is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

__all__ = ["ALIASES", "install", "installed", "real_horovod"]

ALIASES = {
    "horovod": None,
    "horovod.tensorflow": "tfdist.horovod.tensorflow",
    "horovod.tensorflow.keras": "tfdist.horovod.tensorflow.keras",
    "horovod.tensorflow.keras.callbacks": "tfdist.horovod.tensorflow.keras.callbacks",
    "horovod.keras": "tfdist.horovod.tensorflow.keras",
    "horovod.keras.callbacks": "tfdist.horovod.tensorflow.keras.callbacks",
}


class _Loader(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        module.__path__ = []  # a package: its submodules come through the finder too
        if self.target is None:
            module.__doc__ = (
                "Horovod's API as tfdist carries it (tfdist.horovod); Horovod itself is not "
                "installed."
            )
            module.__version__ = "tfdist"
            return
        target = importlib.import_module(self.target)
        for name, value in vars(target).items():
            if not (name.startswith("__") and name.endswith("__")) or name in ("__all__",):
                setattr(module, name, value)
        module.__doc__ = target.__doc__
        module.__getattr__ = lambda name: getattr(target, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the names of `ALIASES`; asked last (see the module's doc)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(ALIASES[fullname]), is_package=True)


def installed() -> bool:
    return any(isinstance(finder, _Finder) for finder in sys.meta_path)


def real_horovod():
    """The spec of an installed Horovod (found by the finders before tfdist's), or None."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find("horovod", None)
        except Exception:  # a finder of the environment that fails: not Horovod
            continue
        if spec is not None:
            return spec
    return None


def install() -> None:
    """Appends the finder (once)."""
    if not installed():
        sys.meta_path.append(_Finder())
