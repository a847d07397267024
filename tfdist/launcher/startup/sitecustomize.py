"""Run by Python at start-up in each task of `tfdist launch` (see tfdist/launcher/startup)."""

import importlib.machinery
import importlib.util
import os
import sys


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import tfdist  # noqa: F401  (watches for Keras; imports no TensorFlow)
    except Exception as err:  # the user's program runs whatever happens here
        print(f"tfdist: start-up hook skipped: {type(err).__name__}: {err}", file=sys.stderr)
    try:
        from tfdist import settings

        if settings.HOROVOD_SHIM.get():  # tfdist horovodrun: `import horovod` where it is absent
            from tfdist.horovod import run, shim

            shim.install()
            run.set_horovod_environment()
    except Exception as err:
        print(f"tfdist: the Horovod modules are off: {type(err).__name__}: {err}", file=sys.stderr)
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:  # the environment's own sitecustomize
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_start()
