"""Restarts and elastic membership of a local job: `launch`, the Python twin of `tfdist launch`.

`launch(...)` plans and runs the job (`tfdist.launcher.job`) again after it ended other than
done: counted restarts after a failure (`max_restarts`), uncounted ones after a preemption (at
most `MAX_PREEMPTION_RESTARTS`), and, for an elastic job (`workers=(MIN, MAX)`,
`check_workers`), uncounted ones with one worker fewer (a worker slot lost for good, `_Slots`)
or more (SIGUSR1 or `grow`: a slot came back, `_Requests`). A SIGINT or SIGTERM to the
launcher stops the job, which is not restarted. The `tfdist launch` command is a thin wrapper
over `launch_job`, which returns the last attempt's `JobResult` (`tfdist.launcher.outcome`);
`_Attempts` runs the attempts and decides after each one whether to run another.

Holds no module-level state; while `launch` runs in the main thread, it handles SIGINT, SIGTERM
and (an elastic job) SIGUSR1. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from typing import Dict, List, Mapping, Optional, Sequence, TextIO, Tuple, Union

from tfdist import gpus as gpu_lib
from tfdist import settings
from tfdist.errors import is_count
from tfdist.launcher.job import check_grace, check_timeout, plan_job, run_job
from tfdist.launcher.outcome import (
    GRACE_SECONDS,
    JobFailed,
    JobResult,
    failure_message,
    first_failure,
    preempted_by,
    summary,
)
from tfdist.preemption import PREEMPTED_EXIT_CODE

__all__ = ["launch", "launch_job"]

# Restarts after a preemption are not counted against max_restarts; this many at most per
# `launch`, so that a script that exits with 143 whatever happens does not restart forever.
MAX_PREEMPTION_RESTARTS = 100


def check_workers(workers, ps: int = 0) -> Tuple[int, int]:
    """(MIN, MAX) workers of a job: `workers=N` gives (N, N) (N is checked where the cluster is
    made); `workers=(MIN, MAX)`, an elastic job, needs 1 <= MIN <= MAX and no ps.

    Raises:
        ValueError: quoting the value, with the fix.
    """
    if isinstance(workers, (tuple, list)):
        if not (
            len(workers) == 2 and all(is_count(w, 1) for w in workers) and workers[0] <= workers[1]
        ):
            raise ValueError(
                "An elastic job's workers must be a pair (MIN, MAX) of whole numbers with "
                f"1 <= MIN <= MAX. Received: workers={workers!r}. HINT: e.g. workers=(2, 3) "
                "starts 3 workers and goes on with 2 when a worker slot is lost for good."
            )
        if ps:
            raise ValueError(
                f"workers={tuple(workers)!r} (an elastic job) does not go with ps={ps!r}. HINT: "
                "a parameter-server job already keeps training when a worker is lost: "
                "TensorFlow's ClusterCoordinator runs the lost worker's steps on the workers left, "
                "where each task is its own pod or step (Kubernetes, SLURM); give a number of "
                "workers, e.g. workers=2."
            )
        return int(workers[0]), int(workers[1])
    if isinstance(workers, str):
        raise ValueError(
            f"workers must be a number of workers, a pair (MIN, MAX) or 'gpu'. Received: "
            f"workers={workers!r}. HINT: e.g. workers=2, workers=(2, 3) for an elastic job, or "
            "workers='gpu' for one worker per GPU."
        )
    return workers, workers


class _Slots:
    """The worker slots of an elastic job (`workers=(MIN, MAX)`), and the failures of each.

    There are MAX slots, numbered 0..MAX-1. An attempt runs one worker per active slot, in slot
    order, renumbered worker:0..n-1 (TF_CONFIG needs contiguous indices). A failure counts
    against the slot of the task that failed; a slot that failed more than `max_restarts`
    times is lost for good (while MIN slots stay active) and comes back with `grow`. A chief or
    evaluator is a slot of its own that cannot be lost.
    """

    def __init__(self, low: int, high: int, max_restarts: int):
        self.low, self.high, self.max_restarts = low, high, max_restarts
        self.active: List[int] = list(range(high))
        self.lost: List[int] = []
        self.failures: Dict[Union[int, str], int] = {}

    @property
    def workers(self) -> int:
        return len(self.active)

    @property
    def spec(self) -> str:
        """The job's flag, as the messages quote it: "--workers MIN:MAX"."""
        return f"--workers {self.low}:{self.high}"

    def slot(self, task: Optional[str]) -> Union[int, str]:
        """The slot of task "worker:i" of the current attempt; other tasks are their own."""
        job, _, index = (task or "the job").partition(":")
        if job == "worker" and index.isdigit() and int(index) < len(self.active):
            return self.active[int(index)]
        return task or "the job"

    @staticmethod
    def name(slot: Union[int, str]) -> str:
        return f"worker slot {slot}" if isinstance(slot, int) else str(slot)

    def failed(self, task: Optional[str]) -> Tuple[str, Union[int, str], int]:
        """Counts a failure of `task`: ("restart", slot, count) while the slot may restart,
        ("shrink", slot, count) when it is lost for good and the job goes on with one worker
        fewer, ("fail", slot, count) when the job cannot go on."""
        slot = self.slot(task)
        count = self.failures[slot] = self.failures.get(slot, 0) + 1
        if count <= self.max_restarts:
            return "restart", slot, count
        if isinstance(slot, int) and self.workers - 1 >= self.low:
            self.active.remove(slot)
            self.lost.append(slot)
            del self.failures[slot]
            return "shrink", slot, count
        return "fail", slot, count

    def grow(self, wanted: int) -> List[int]:
        """Gives back up to `wanted` lost slots, those lost first first; returns them."""
        back, self.lost = self.lost[:wanted], self.lost[wanted:]
        self.active = sorted(self.active + back)
        return back


class _Requests:
    """What the launcher is asked while `launch` runs: its own SIGINT or SIGTERM (stop, and do
    not restart), and, for an elastic job, SIGUSR1 or the `grow` event (a slot came back)."""

    def __init__(self, grow: Optional[threading.Event]):
        self.signals: List[int] = []
        self._grows: List[int] = []  # one entry a request (a list: signal handlers append)
        self._event = grow
        self.on_sigusr1 = False  # SIGUSR1 is handled (launch runs in the main thread)

    def pending(self) -> int:
        if self._event is not None and self._event.is_set():
            self._event.clear()
            self._grows.append(0)
        return len(self._grows)

    def take(self) -> int:
        count = self.pending()
        del self._grows[:count]
        return count

    @contextlib.contextmanager
    def handled(self, elastic: bool):
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(
                    sig, lambda signum, frame: self.signals.append(signum)
                )
            if elastic and hasattr(signal, "SIGUSR1"):
                previous[signal.SIGUSR1] = signal.signal(
                    signal.SIGUSR1, lambda signum, frame: self._grows.append(signum)
                )
                self.on_sigusr1 = True
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def launch(
    target: str,
    args: Sequence[str] = (),
    *,
    workers: Union[int, Tuple[int, int]] = 1,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    module: bool = False,
    max_restarts: int = 0,
    timeout: Optional[float] = None,
    grace: float = GRACE_SECONDS,
    log_dir: Optional[str] = None,
    extra_env: Optional[Mapping[str, str]] = None,
    quiet: bool = False,
    out: Optional[TextIO] = None,
    check: bool = False,
    verbose: Optional[bool] = None,
    grow: Optional[threading.Event] = None,
    gpus_per_worker: Union[int, str] = gpu_lib.AUTO,
    evaluator_gpus: int = 0,
) -> Dict[str, int]:
    """Runs `target` as a local multi-process job; the Python twin of `tfdist launch`.

    A task's exit code 0 means done, `PREEMPTED_EXIT_CODE` (143) preempted and saved (after a
    SIGTERM, with `tfdist.BackupAndRestore`), anything else failed. A preempted job is
    restarted at once, on fresh ports, without counting against `max_restarts` (at most
    `MAX_PREEMPTION_RESTARTS`, 100, times). A SIGINT or SIGTERM to the launcher itself is passed
    on to every task (SIGKILL after `grace` seconds), and the job is not restarted.

    Args:
        target: str. A script path, or a module name with `module=True`.
        args: list of str. The script's arguments.
        workers: int, or a pair (MIN, MAX): an elastic multi-worker job, which starts with MAX
            workers, goes on with one worker fewer when a worker slot has failed more than
            `max_restarts` times (down to MIN), and with one more on SIGUSR1 to the launcher
            (or when `grow` is set). Not with `ps`. "gpu": one worker per `gpus_per_worker`
            GPUs of this host.
        ps / chief / evaluator: the other tasks of the job (see `plan_job`).
        max_restarts: int. Restart the whole job, on fresh ports, at most this many times after
            a failure (in an elastic job: per worker slot). Defaults to 0.
        timeout: float. Seconds before the job is stopped, > 0. Defaults to no limit.
        grace: float. Seconds the tasks get to exit after a SIGTERM (or after a peer was
            preempted) before SIGKILL, > 0. Defaults to 30.
        log_dir: str. Also write each task's output to `<log_dir>/<type>-<index>.log` (every
            line, TensorFlow's start-up noise included), and the launcher's progress and stall
            lines to `<log_dir>/launcher.log`.
        check: bool. Raise `JobFailed` instead of returning when the job fails.
        verbose: bool. Also forward TensorFlow's start-up noise (C++ INFO lines, the CUDA and
            oneDNN notices). Defaults to TFDIST_VERBOSE (off). Errors are always forwarded.
        grow: threading.Event. An elastic job only: set it (from any thread) to give back one
            worker slot lost for good, like SIGUSR1 does.
        gpus_per_worker: "auto" (default: the host's GPUs shared out evenly among the tasks
            that train, each its own), a number K of GPUs each, or "shared" (every task sees
            every GPU, and takes only the memory it uses). Nothing is set on a host without
            GPUs. See `tfdist.gpus`.
        evaluator_gpus: int. GPUs of the evaluator task (default 0: it runs on the CPU).

    Returns:
        dict: task name ("worker:0") -> exit code of the last attempt.

    Raises:
        ValueError: a bad `workers`, `max_restarts`, `timeout` or `grace`.
        GpuError (a ValueError): the GPUs asked for are not there; no task was started.
        JobFailed: with `check=True`, when the job did not end done.
    """
    return launch_job(
        target,
        args,
        workers=workers,
        ps=ps,
        chief=chief,
        evaluator=evaluator,
        module=module,
        max_restarts=max_restarts,
        timeout=timeout,
        grace=grace,
        log_dir=log_dir,
        extra_env=extra_env,
        quiet=quiet,
        out=out,
        check=check,
        verbose=verbose,
        grow=grow,
        gpus_per_worker=gpus_per_worker,
        evaluator_gpus=evaluator_gpus,
    ).returncodes


def launch_job(
    target: str,
    args: Sequence[str] = (),
    *,
    workers: Union[int, Tuple[int, int]] = 1,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    module: bool = False,
    max_restarts: int = 0,
    timeout: Optional[float] = None,
    grace: float = GRACE_SECONDS,
    log_dir: Optional[str] = None,
    extra_env: Optional[Mapping[str, str]] = None,
    quiet: bool = False,
    out: Optional[TextIO] = None,
    check: bool = False,
    verbose: Optional[bool] = None,
    grow: Optional[threading.Event] = None,
    python: Optional[str] = None,
    gpus_per_worker: Union[int, str] = gpu_lib.AUTO,
    evaluator_gpus: int = 0,
) -> JobResult:
    """`launch`, returning the `JobResult` of the last attempt instead of its exit codes:
    `tfdist launch` and `tfdist horovodrun` make their exit code from it (`exit_code`).

    Args:
        python: str. The tasks' interpreter. Defaults to this one.
        The others: as `launch`.

    Returns:
        JobResult: the last attempt's.

    Raises:
        ValueError: a bad `workers`, `max_restarts`, `timeout` or `grace`.
        JobFailed: with `check=True`, when the job did not end done.
    """
    if not is_count(max_restarts):
        raise ValueError(
            f"max_restarts must be a non-negative integer. Received: "
            f"max_restarts={max_restarts!r}. HINT: 0 runs the job once; 1 restarts it once."
        )
    per = gpu_lib.per_worker(gpus_per_worker)
    if not is_count(evaluator_gpus):
        raise gpu_lib.GpuError(
            f"evaluator_gpus must be a whole number >= 0. Received: {evaluator_gpus!r}. "
            "HINT: 0 runs the evaluator on the CPU; 1 gives it a GPU of its own."
        )
    if isinstance(workers, str) and workers.strip().lower() == "gpu":
        workers = gpu_lib.worker_count(gpu_lib.visible(), per, evaluator_gpus)
    low, high = check_workers(workers, ps)
    elastic = isinstance(workers, (tuple, list))
    if grow is not None and not elastic:
        raise ValueError(
            f"grow= needs an elastic job. Received: workers={workers!r}. HINT: "
            "workers=(MIN, MAX), e.g. workers=(2, 3), starts 3 workers and can go on with 2."
        )
    attempts = _Attempts(
        dict(
            target=target,
            args=args,
            ps=ps,
            chief=chief,
            evaluator=evaluator,
            module=module,
            extra_env=extra_env,
            python=python,
            gpus_per_worker=per,
            evaluator_gpus=evaluator_gpus,
        ),
        workers=workers,
        slots=_Slots(low, high, max_restarts) if elastic else None,
        max_restarts=max_restarts,
        timeout=check_timeout(timeout),
        grace=check_grace(grace),
        log_dir=log_dir,
        quiet=quiet,
        verbose=settings.VERBOSE.get() if verbose is None else bool(verbose),
        out=out or sys.stdout,
    )
    with _Requests(grow).handled(elastic) as requests:
        result = attempts.run(requests)
    return attempts.finish(result, check)


class _Attempts:
    """The attempts of one launched job: `run` runs one after the other while the last one
    asks for a restart (a failure within `max_restarts`, a preemption, an elastic job's slot
    lost or back) and the launcher was not stopped; `finish` says how the job ended."""

    def __init__(
        self,
        plan: Mapping,
        *,
        workers,
        slots: Optional[_Slots],
        max_restarts: int,
        timeout: Optional[float],
        grace: float,
        log_dir: Optional[str],
        quiet: bool,
        verbose: bool,
        out: TextIO,
    ):
        self.plan = plan  # plan_job's arguments but `workers`
        self.workers, self.slots, self.max_restarts = workers, slots, max_restarts
        self.timeout, self.grace, self.log_dir = timeout, grace, log_dir
        self.quiet, self.verbose, self.out = quiet, verbose, out
        self.requests: Optional[_Requests] = None
        self.restarts = self.preemptions = self.attempts = 0
        self.started: Dict[str, int] = {}  # task -> the attempts it ran in
        self.note = ""  # why the job is not restarted, when the counts say so

    def say(self, text: str) -> None:
        self.out.write(f"[tfdist] {text}\n")
        self.out.flush()

    def run(self, requests: _Requests) -> JobResult:
        """Runs attempts until one is not to be restarted; returns the last one's result."""
        self.requests = requests
        if self.slots:
            self._announce()
        result: Optional[JobResult] = None
        while True:
            if requests.signals:  # the launcher's own signal, between two attempts
                signum = requests.signals[0]
                if result:
                    return dataclasses.replace(result, launcher_signal=signum)
                return JobResult("interrupted", {}, launcher_signal=signum)
            if self.slots and self.slots.workers < self.slots.high and requests.pending():
                back = self.slots.grow(requests.take())  # asked for between two attempts
                self.say(
                    f"{_plural(len(back), 'worker slot')} came back: {self.slots.workers} workers."
                )
            result = self._attempt()
            if not self._restart(result):
                return result

    def finish(self, result: JobResult, check: bool) -> JobResult:
        """`result` when the job ended done; else says why (or raises JobFailed, `check`)."""
        result = dataclasses.replace(
            result, restarts=self.attempts - 1, preemption_restarts=self.preemptions
        )
        if result.ok:
            return result
        message = failure_message(result, self.timeout, self.grace)
        if check:
            raise JobFailed(f"{message}\n{self.note}" if self.note else message, result)
        self.say(message)
        if self.note:
            self.say(self.note)
        return result

    def _announce(self) -> None:
        slots, max_restarts = self.slots, self.max_restarts
        how = (
            f"`kill -USR1 {os.getpid()}` (this launcher's pid)"
            if self.requests.on_sigusr1
            else "setting `grow`"
        )
        self.say(
            f"Elastic job ({slots.spec}): starting {slots.high} workers. A worker slot that fails "
            f"more than --max-restarts {max_restarts} {'time' if max_restarts == 1 else 'times'} "
            f"is dropped (down to {slots.low} workers); {how} gives one back."
        )

    def _resize(self) -> Optional[str]:
        """`run_job`'s `stop_when` in an elastic job: "resized" when a slot came back."""
        if not self.requests.pending():
            return None
        if self.slots.workers < self.slots.high:
            return "resized"
        self.requests.take()
        self.say(
            f"A worker slot came back, but the job already runs {self.slots.high} workers "
            f"({self.slots.spec})."
        )
        return None

    def _attempt(self) -> JobResult:
        """Plans and runs the job once, on fresh ports; prints its summary (unless quiet)."""
        self.attempts += 1
        plans = plan_job(workers=self.slots.workers if self.slots else self.workers, **self.plan)
        result = run_job(
            plans,
            timeout=self.timeout,
            grace=self.grace,
            out=self.out,
            log_dir=self.log_dir,
            quiet=self.quiet,
            verbose=self.verbose,
            stop_when=self._resize if self.slots else None,
        )
        for name in result.tasks:
            self.started[name] = self.started.get(name, 0) + 1
        result = dataclasses.replace(
            result, task_restarts={name: self.started[name] - 1 for name in result.tasks}
        )
        if not self.quiet:
            self.out.write(summary(result))
            self.out.flush()
        return result

    def _restart(self, result: JobResult) -> bool:
        """True when the job is to run again after `result` (said why)."""
        if result.ok or result.launcher_signal:
            return False
        if result.reason == "preempted":
            return self._after_preemption(result)
        if result.reason == "resized":
            back = self.slots.grow(self.requests.take())
            self.say(
                f"{_plural(len(back), 'worker slot')} came back; restarting the job with "
                f"{self.slots.workers} workers on fresh ports (not counted against "
                "--max-restarts)."
            )
            return True
        if result.reason != "failed":
            return False
        message = failure_message(result, self.timeout, self.grace)
        refused = [t for t in result.tasks.values() if t.not_restartable]
        if refused:
            reason = refused[0].not_restartable.splitlines()[0]
            self.note = (
                f"The job is not restarted: {refused[0].task} would fail the same way again "
                f"({reason})"
            )
            return False
        if self.slots:
            return self._after_slot_failure(result, message)
        if self.restarts < self.max_restarts:
            self.restarts += 1
            self.say(
                f"{message}\n[tfdist] Restarting the job ({self.restarts}/{self.max_restarts}) "
                "on fresh ports."
            )
            return True
        return False

    def _after_preemption(self, result: JobResult) -> bool:
        if self.preemptions < MAX_PREEMPTION_RESTARTS:
            self.preemptions += 1
            self.say(
                f"The job was preempted ({preempted_by(result)}); restarting it on "
                "fresh ports (not counted against --max-restarts; preemption restart "
                f"{self.preemptions} of at most {MAX_PREEMPTION_RESTARTS})."
            )
            return True
        self.note = (
            f"It was restarted {MAX_PREEMPTION_RESTARTS} times after a preemption "
            "already (MAX_PREEMPTION_RESTARTS), so it is not restarted again. HINT: a "
            f"script that exits with {PREEMPTED_EXIT_CODE} when it was not sent SIGTERM "
            "restarts forever; run the same command again to resume from the backup."
        )
        return False

    def _after_slot_failure(self, result: JobResult, message: str) -> bool:
        """An elastic job failed: restart it, without the slot that failed too often, or stop."""
        slots, max_restarts = self.slots, self.max_restarts
        first = first_failure(result)
        verdict, slot, count = slots.failed(first.task if first else None)
        failures = f"{_plural(count, 'failure')} of {slots.name(slot)}"
        if verdict == "restart":
            self.say(
                f"{message}\n[tfdist] Restarting the job ({count}/{max_restarts} for "
                f"{slots.name(slot)}) on fresh ports."
            )
            return True
        if verdict == "shrink":
            self.say(
                f"{message}\n[tfdist] After {failures}, more than --max-restarts "
                f"{max_restarts}, the slot is lost for good: restarting the job with "
                f"{slots.workers} workers on fresh ports ({slots.spec}; not counted against "
                "--max-restarts)."
            )
            return True
        self.note = f"After {failures}, more than --max-restarts {max_restarts}, the job stops" + (
            f": it cannot go on with fewer than {slots.low} workers ({slots.spec})."
            if isinstance(slot, int)
            else f" ({slot} is not a worker slot that the job can go on without)."
        )
        return False


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
