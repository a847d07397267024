"""`tfdist verify SCRIPT`: `compare_training` on a user's script, printed as a table.

The script defines, at module level (its `if __name__ == "__main__":` part does not run):

    build_model()         builds and compiles the model (called inside each strategy's scope)
    data()  or  DATA      the examples: (x, y), (x, y, sample_weight) or a dict of arrays
    GLOBAL_BATCH_SIZE     examples per step (or --global-batch-size)

and optionally STEPS, EPOCHS, RTOL, ATOL (the command line's flags win). The table shows, quantity
by strategy, the largest difference from the reference run ("!" beyond the tolerance); the
report below it names the first step and variable that differ. Exit code 0: every strategy
trained the same; 1: one differed or failed; 2: the script or a flag is wrong.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import Optional, Sequence

from tfdist.testing.same_training import ATOL, RTOL, TrainingDiffers, compare_training

__all__ = ["load_script", "verify_script"]


class ScriptError(ValueError):
    """The script cannot be verified (missing file or definitions)."""


def load_script(path: str):
    """Imports `path` as a module named after its file (its directory first on sys.path)."""
    if not os.path.isfile(path):
        raise ScriptError(f"No such script: {path!r}. HINT: give the path of a .py file.")
    path = os.path.abspath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.isidentifier():
        raise ScriptError(
            f"The script's name {os.path.basename(path)!r} is not a Python module name, which "
            "the strategies' processes need to import it. HINT: rename it, e.g. my_model.py."
        )
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _definitions(module, global_batch_size: Optional[int]):
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise ScriptError(
            f"{module.__file__} defines no build_model(). HINT: add a module-level function "
            "that builds, compiles and returns the model."
        )
    data = getattr(module, "data", None)
    data = data() if callable(data) else getattr(module, "DATA", data)
    if data is None:
        raise ScriptError(
            f"{module.__file__} defines neither data() nor DATA. HINT: return the examples, "
            "e.g. `def data(): return x, y` with numpy arrays."
        )
    batch = global_batch_size or getattr(module, "GLOBAL_BATCH_SIZE", None)
    if batch is None:
        raise ScriptError(
            f"{module.__file__} sets no GLOBAL_BATCH_SIZE. HINT: set it in the script or pass "
            "--global-batch-size 32."
        )
    return build, data, batch


def verify_script(
    path: str,
    *,
    global_batch_size: Optional[int] = None,
    strategies: Optional[Sequence[str]] = None,
    steps: Optional[int] = None,
    epochs: Optional[int] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    replicas: int = 2,
    workers: int = 2,
    random_layers: str = "off",
    out=None,
) -> int:
    """Runs the comparison on the script; prints the table and the report. Returns the exit
    code (see the module)."""
    out = out or sys.stdout
    try:
        module = load_script(path)
        build, data, batch = _definitions(module, global_batch_size)
        options = {
            "steps": steps or getattr(module, "STEPS", 4),
            "epochs": epochs or getattr(module, "EPOCHS", 2),
            "rtol": getattr(module, "RTOL", RTOL) if rtol is None else rtol,
            "atol": getattr(module, "ATOL", ATOL) if atol is None else atol,
        }
        if strategies:
            options["strategies"] = tuple(strategies)
        started = time.monotonic()
        result = compare_training(
            build,
            data,
            global_batch_size=batch,
            replicas=replicas,
            workers=workers,
            random_layers=random_layers,
            **options,
        )
    except TrainingDiffers as err:  # the reference run itself failed
        print(f"tfdist verify: {err}", file=out)
        return 1
    except (ScriptError, TypeError, ValueError) as err:
        print(f"tfdist verify: error: {err}", file=out)
        return 2
    seconds = time.monotonic() - started
    print(
        f"{os.path.basename(path)}: {options['epochs']} epoch(s) of {options['steps']} step(s), "
        f"global batch {batch}, from {result.reference}'s initial weights. Largest "
        f"|difference| from {result.reference} ('!': beyond rtol={result.rtol:g}, "
        f"atol={result.atol:g}):\n",
        file=out,
    )
    print(result.table(), file=out)
    print("", file=out)
    print(result.report(), file=out)
    print(f"({seconds:.1f} s)", file=out)
    return 0 if result.same else 1
