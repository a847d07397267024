"""Child side of `tfdist.testing.run_cluster` and `tfdist.notebook_launch`: run one function in
this task, save its result.

python -m tfdist.launcher.run_function MODULE QUALNAME SOURCE_FILE CALL_FILE RESULT_DIR
python -m tfdist.launcher.run_function --pickled CALL_FILE RESULT_DIR

The first form imports the function by its module and name and reads its (args, kwargs) from
CALL_FILE; the second reads (function, args, kwargs) from CALL_FILE, written by cloudpickle (a
function defined in a notebook cell has no module to import it from), and writes the result with
cloudpickle too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import traceback

from tfdist import settings


def child_pythonpath(*first: str) -> str:
    """A PYTHONPATH with which a child process imports what this one does: `first`, then this
    process's sys.path (existing directories, each once)."""
    paths = [*first, *(p for p in sys.path if p and os.path.isdir(p))]
    return os.pathsep.join(dict.fromkeys(paths))


def result_path(result_dir: str, task: str) -> str:
    """Where task `task` ("worker:0") writes its ("ok", value) or ("error", message)."""
    return os.path.join(result_dir, task.replace(":", "-") + ".pkl")


def read_result(result_dir: str, task: str):
    """(status, payload) that task `task` wrote, or None when it wrote nothing."""
    path = result_path(result_dir, task)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


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


def _call(argv):
    """(function, args, kwargs) of the call that argv names."""
    if argv[0] == "--pickled":
        with open(argv[1], "rb") as f:
            return pickle.load(f)  # cloudpickle's output; it is imported as it loads
    module_name, qualname, source, call_file, _ = argv
    with open(call_file, "rb") as f:
        args, kwargs = pickle.load(f)
    return load_function(module_name, qualname, source), args, kwargs


def main(argv) -> int:
    path = result_path(argv[-1], settings.TASK.get() or "task")
    pickler = pickle
    if argv[0] == "--pickled":
        import cloudpickle as pickler  # a value of a class defined in the notebook, too
    try:
        fn, args, kwargs = _call(argv)
        value = fn(*args, **kwargs)
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
    with open(path + ".tmp", "wb") as f:
        try:
            pickler.dump(payload, f)
        except Exception as err:  # the value cannot be pickled: say so instead
            f.seek(0)
            f.truncate()
            message = f"the function's return value cannot be pickled: {err}"
            pickle.dump(("error", message), f)
            print(f"tfdist: {message}", file=sys.stderr)
            code = code or 1
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    # os._exit: skip interpreter teardown, where TensorFlow's gRPC threads can hang or crash
    # after the result is safely written.
    os._exit(main(sys.argv[1:]))
