"""`run_cluster`: one Python function run in every task of a local multi-process cluster.

Each call starts fresh processes (`tfdist.launcher.job`), waits for them with a hard timeout and
returns what each task printed, returned or raised. Imports nothing of TensorFlow.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import pickle
import tempfile
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from tfdist import settings
from tfdist.launcher.job import plan_job, run_job
from tfdist.launcher.outcome import JobResult
from tfdist.launcher.run_function import child_pythonpath, read_result

__all__ = ["ClusterRunError", "TaskRun", "is_running", "run_cluster"]


class ClusterRunError(AssertionError):
    """A task of `run_cluster` failed or timed out. The message holds every task's output."""


@dataclasses.dataclass
class TaskRun:
    """One task of a `run_cluster` job."""

    task: str
    returncode: Optional[int]
    output: str
    value: Any = None
    error: Optional[str] = None


def is_running(pid: int) -> bool:
    """True while process `pid` runs (a zombie, killed but not yet reaped, does not count).

    For tests that check that no task of a job outlives it.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to signal 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def run_cluster(
    fn: Callable,
    *,
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    args: Sequence = (),
    kwargs: Optional[Mapping] = None,
    timeout: float = 180.0,
    env: Optional[Mapping[str, str]] = None,
    check: bool = True,
) -> Dict[str, TaskRun]:
    """Runs `fn(*args, **kwargs)` in every training task of a local multi-process cluster.

    Each task is a fresh Python process with its own TF_CONFIG on free loopback ports. In a
    parameter-server job (ps > 0) the worker and ps tasks run servers and `fn` runs on the chief.
    A hard timeout stops every task (and anything it started) so a hung collective never hangs
    the test run.

    Args:
        fn: a module-level function (importable by its module and name), returning a picklable
            value. It typically calls `tfdist.make_strategy()` first.
        workers / ps / chief: the cluster. Defaults to 2 workers.
        args / kwargs: picklable arguments for `fn`.
        timeout: float. Seconds before every task is killed. Defaults to 180.
        env: mapping. Extra environment variables for every task.
        check: bool. Raise `ClusterRunError` (with all outputs) unless every task succeeded.

    Returns:
        dict: task name ("worker:0") -> TaskRun(returncode, output, value, error).

    Example:

    ```python
    def allreduce():
        strategy = tfdist.make_strategy()
        ...
        return total

    def test_allreduce(run_cluster):
        runs = run_cluster(allreduce, workers=2)
        assert runs["worker:0"].value == runs["worker:1"].value == 3.0
    ```
    """
    module, qualname, source = function_reference(fn)
    with tempfile.TemporaryDirectory(prefix="tfdist-run-") as tmp:
        call_file = os.path.join(tmp, "call.pkl")
        with open(call_file, "wb") as f:
            pickle.dump((tuple(args), dict(kwargs or {})), f)
        extra = {"PYTHONPATH": child_pythonpath(*([os.path.dirname(source)] if source else []))}
        extra.update(env or {})
        plans = plan_job(
            "tfdist.launcher.run_function",
            [module, qualname, source, call_file, tmp],
            workers=workers,
            ps=ps,
            chief=chief,
            module=True,
            extra_env=extra,
        )
        result = run_job(
            plans, timeout=timeout, quiet=True, grace=3.0, preload=settings.PRELOAD.get()
        )
        runs = {name: _task_run(name, r, tmp) for name, r in result.tasks.items()}
    if check and not result.ok:
        raise ClusterRunError(_report(fn, result, runs, timeout))
    return runs


def function_reference(fn: Callable, caller: str = "run_cluster"):
    """(module, qualname, source file) by which a child process imports `fn`."""
    if not callable(fn) or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        raise TypeError(
            f"{caller} needs a module-level function that child processes can import. "
            f"Received: {fn!r}. HINT: define it at the top level of the test module."
        )
    source = inspect.getsourcefile(fn) or ""
    module = fn.__module__
    if module == "__main__":
        module = os.path.splitext(os.path.basename(source))[0]
    return module, fn.__qualname__, os.path.abspath(source) if source else ""


def _task_run(name: str, result, tmp: str) -> TaskRun:
    run = TaskRun(name, result.returncode, "\n".join(result.output))
    written = read_result(tmp, name)
    if written is not None:
        status, payload = written
        if status == "ok":
            run.value = payload
        else:
            run.error = payload
    return run


def _report(fn, result: JobResult, runs: Dict[str, TaskRun], timeout: float) -> str:
    head = {
        "timeout": f"timed out after {timeout:g} s",
        "failed": "failed",
        "interrupted": "was interrupted",
    }.get(result.reason, result.reason)
    lines = [f"run_cluster({fn.__qualname__}) {head}."]
    for name, run in runs.items():
        tail = "\n    ".join(run.output.splitlines()[-40:])
        lines.append(
            f"--- {name}: exit code {run.returncode}"
            f"{', ' + run.error if run.error else ''}\n    {tail}"
        )
    return "\n".join(lines)
