"""`notebook_launch`: a function defined in a notebook cell, run as a real local job.

`tfdist.launch` needs a script file and `tfdist.testing.run_cluster` a function that the tasks
can import; a function defined in a Jupyter or Colab cell is neither. `notebook_launch` pickles
the function by value (cloudpickle, the extra `tfdist[notebook]`), with its arguments and the
globals it reads, and runs it in every training task of a local job (`launch_job`, restarts
included). Each task's output streams into the cell with its prefix; the chief's return value is
returned. A kernel interrupt (the notebook's stop button: SIGINT to the kernel) stops every task
and raises KeyboardInterrupt in the cell; a kernel that dies takes its tasks with it (every task
that tfdist starts dies with its launcher).

Nothing here imports TensorFlow: the kernel can go on using its own.
"""

from __future__ import annotations

import os
import signal
import tempfile
from typing import Any, Callable, Mapping, Optional, Sequence

from tfdist import gpus as gpu_lib
from tfdist.launcher.outcome import GRACE_SECONDS, JobFailed
from tfdist.launcher.restarts import launch_job
from tfdist.launcher.run_function import child_pythonpath, read_result

__all__ = ["notebook_launch"]

CHILD = "tfdist.launcher.run_function"


def notebook_launch(
    fn: Callable,
    args: Sequence = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    *,
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    max_restarts: int = 0,
    timeout: Optional[float] = None,
    grace: float = GRACE_SECONDS,
    env: Optional[Mapping[str, str]] = None,
    log_dir: Optional[str] = None,
    verbose: Optional[bool] = None,
    gpus_per_worker=gpu_lib.AUTO,
):
    """Runs `fn(*args, **kwargs)` as a local multi-process job and returns the chief's value.

    For a notebook (Jupyter, Colab, VS Code): `fn` may be defined in a cell. It is pickled by
    value with the globals it reads (cloudpickle: `pip install 'tfdist[notebook]'`) and runs in
    each training task, each a fresh Python process with its own TF_CONFIG, exactly as a script
    under `tfdist launch` would: `fn` makes its strategy (`tfdist.make_strategy()`), builds and
    compiles its model in the scope, and fits. In a parameter-server job (ps > 0) `fn` runs on
    the chief, and the worker and ps tasks serve. Each task's output appears in the cell with
    its prefix ("[worker:1] ..."), TensorFlow's start-up noise left out.

    The tasks read the kernel's environment (set `TF_USE_LEGACY_KERAS=1` there, or in `env`, for
    tf_keras). Interrupting the kernel stops every task and raises KeyboardInterrupt.

    Args:
        fn: a callable, e.g. a function defined in a notebook cell. Its return value (e.g.
            `history.history`) must be picklable.
        args / kwargs: its arguments, picklable (cloudpickle).
        workers / ps / chief: the job, as `tfdist.launch`. Defaults to 2 workers.
        max_restarts / timeout / grace / log_dir / verbose / gpus_per_worker: as `tfdist.launch`.
        env: mapping. Extra environment variables of every task.

    Returns:
        The value `fn` returned in the chief: worker 0, or the chief task where there is one.

    Raises:
        ImportError: cloudpickle is not installed.
        TypeError: `fn` is not callable, or it or its arguments cannot be pickled.
        JobFailed: a task failed (its traceback is in the cell's output above), or the job
            timed out.
        KeyboardInterrupt: the kernel was interrupted; every task was stopped.
    """
    if not callable(fn):
        raise TypeError(
            f"notebook_launch runs a function. Received: fn={fn!r}. HINT: pass the function "
            "itself, e.g. notebook_launch(train, workers=2), not train()."
        )
    call = _pickled_call(fn, tuple(args), dict(kwargs or {}))
    with tempfile.TemporaryDirectory(prefix="tfdist-notebook-") as tmp:
        call_file = os.path.join(tmp, "call.pkl")
        with open(call_file, "wb") as f:
            f.write(call)
        extra = {"PYTHONPATH": child_pythonpath(os.getcwd())}  # what the kernel imports
        extra.update(env or {})
        try:
            result = launch_job(
                CHILD,
                ["--pickled", call_file, tmp],
                workers=workers,
                ps=ps,
                chief=chief,
                module=True,
                max_restarts=max_restarts,
                timeout=timeout,
                grace=grace,
                log_dir=log_dir,
                extra_env=extra,
                verbose=verbose,
                check=True,
                gpus_per_worker=gpus_per_worker,
            )
        except JobFailed as err:
            if err.result.launcher_signal == signal.SIGINT:
                raise KeyboardInterrupt(
                    "notebook_launch: the kernel was interrupted; every task was stopped."
                ) from None
            raise
        return _chief_value(result, tmp)


def _pickled_call(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    try:
        import cloudpickle
    except ImportError:
        raise ImportError(
            "notebook_launch pickles the function by value with cloudpickle, which is not "
            "installed. HINT: pip install 'tfdist[notebook]' (or pip install cloudpickle), then "
            "restart the kernel."
        ) from None
    for what, value in (("fn", fn), ("args", args), ("kwargs", kwargs)):
        try:
            cloudpickle.dumps(value)
        except Exception as err:
            raise TypeError(
                f"notebook_launch cannot pickle {what} (each task gets its own copy): "
                f"{type(err).__name__}: {err}. HINT: make the object inside the function "
                "(a model, a dataset, a strategy, an open file or a lock cannot go to another "
                "process); pass plain values (numbers, strings, numpy arrays) as arguments."
            ) from None
    return cloudpickle.dumps((fn, args, kwargs))


def _chief_value(result, tmp: str):
    """The value the chief's (else worker 0's) function returned."""
    for name in ("chief:0", "worker:0"):
        task = result.tasks.get(name)
        if task is None or task.serves:
            continue
        status, payload = read_result(tmp, name) or ("error", "it wrote no result")
        if status != "ok":  # the task exited 0 all the same (e.g. sys.exit(0))
            raise JobFailed(f"notebook_launch: {name} ended without a value: {payload}", result)
        return payload
    raise JobFailed("notebook_launch: the job has no chief or worker 0 that ran fn.", result)
