"""Child side of `tfdist.testing.run_cluster`: run one function in this task, save its result.

python -m tfdist.launcher.run_function MODULE QUALNAME SOURCE_FILE CALL_FILE RESULT_DIR
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import traceback

from tfdist import settings


def load_function(module_name: str, qualname: str, source: str):
    """The object `qualname` of `module_name`, loaded from `source` when it is not importable."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if not source:
            raise
        spec = importlib.util.spec_from_file_location(module_name, source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    target = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def main(argv) -> int:
    module_name, qualname, source, call_file, result_dir = argv
    task = (settings.TASK.get() or "task").replace(":", "-")
    result_path = os.path.join(result_dir, task + ".pkl")
    with open(call_file, "rb") as f:
        args, kwargs = pickle.load(f)
    try:
        value = load_function(module_name, qualname, source)(*args, **kwargs)
        from tfdist.strategy import exit_barrier

        try:
            exit_barrier()
        except Exception as err:  # the collectives already failed: the value still stands
            print(f"tfdist: the exit barrier did not complete: {err}", file=sys.stderr)
        payload = ("ok", value)
        code = 0
    except BaseException as err:  # report everything, including SystemExit, to the parent
        traceback.print_exc()
        sys.stdout.flush()
        payload = ("error", f"{type(err).__name__}: {err}")
        code = err.code if isinstance(err, SystemExit) and isinstance(err.code, int) else 1
    with open(result_path + ".tmp", "wb") as f:
        pickle.dump(payload, f)
    os.replace(result_path + ".tmp", result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    # os._exit: skip interpreter teardown, where TensorFlow's gRPC threads can hang or crash
    # after the result is safely written.
    os._exit(main(sys.argv[1:]))
