"""Run a script as a local multi-process TensorFlow job, one process per task, on loopback.

Two steps, kept apart so the first is testable without spawning anything:

1. `plan_job(...)` is a pure function: the cluster (free loopback ports) and, for each task,
   its command line and environment (its own TF_CONFIG).
2. `run_job(plans)` starts the processes, forwards each output line prefixed with its task
   (TensorFlow's start-up noise left out, `tfdist.launcher.noise`), stops every task when one
   fails (SIGTERM, then SIGKILL after a grace period), and returns each task's exit code.
   A task that exits with `PREEMPTED_EXIT_CODE` (143) saved a backup after a SIGTERM: its
   peers stop at the same step by themselves, so they get the grace period to exit first.

The tasks of a job run in a private network namespace of their own where the system allows it
(`tfdist.netns`; TFDIST_NETWORK_NAMESPACE): TensorFlow's servers listen on every
interface, and only there does "loopback only" hold.

`launch(...)` does both, with restarts: counted ones after a failure (`max_restarts`), uncounted
ones after a preemption, and, for an elastic job (`workers=(MIN, MAX)`), uncounted ones with one
worker fewer (a worker slot lost for good) or more (SIGUSR1: a slot came back). The `tfdist
launch` command is a thin wrapper over it.

Roles: in a parameter-server job (ps > 0) the worker and ps tasks run plain TensorFlow servers
and the chief (added automatically) runs the script. Otherwise every worker (and the chief
and evaluator, if any) runs the script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple, Union

from tfdist import netns, settings
from tfdist import training_report as _report
from tfdist.cluster import ClusterSpec
from tfdist.errors import is_count
from tfdist.launcher.noise import NoiseFilter
from tfdist.preemption import PREEMPTED_EXIT_CODE

__all__ = ["JobFailed", "JobResult", "TaskPlan", "TaskResult", "launch", "plan_job", "run_job"]

GRACE_SECONDS = 30.0  # after a SIGTERM (or a peer's preemption), before SIGKILL
# Restarts after a preemption are not counted against max_restarts; this many at most per
# `launch`, so that a script that exits with 143 whatever happens does not restart forever.
MAX_PREEMPTION_RESTARTS = 100
_TAIL_LINES = 20


class JobFailed(RuntimeError):
    """A task of a launched job failed, or the job timed out."""

    def __init__(self, message: str, result: "JobResult"):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """How one task of a job is started: its name ("worker:1"), command and environment.

    `env` holds only the variables tfdist sets; they are added to the launcher's own.
    `serves` is True for tasks that only run a server (workers/ps of a parameter-server job).
    """

    task: str
    argv: tuple
    env: Mapping[str, str]
    serves: bool = False

    def describe(self) -> str:
        """A shell-like line: `TF_CONFIG='...' python script.py ...`."""
        env = " ".join(f"{k}='{v}'" for k, v in sorted(self.env.items()))
        return f"[{self.task}] {env} {' '.join(self.argv)}"


@dataclasses.dataclass
class TaskResult:
    """What became of one task: exit code (negative: killed by that signal), output, time.

    Exit code 0: the task finished; `PREEMPTED_EXIT_CODE` (143): it saved a backup after a
    SIGTERM and asks to be started again; anything else: it failed.
    """

    task: str
    returncode: Optional[int]
    output: List[str]
    seconds: float
    stopped: bool = False  # stopped by the launcher (a peer failed, timeout, job ended)
    steps: Optional[int] = None  # training steps of every fit in the task (optimizer steps)
    train_seconds: Optional[float] = None  # wall time of those fits
    serves: bool = False  # only ran a server (a worker or ps of a parameter-server job)

    @property
    def steps_per_second(self) -> Optional[float]:
        if not self.steps or not self.train_seconds:
            return None
        return self.steps / self.train_seconds

    @property
    def tail(self) -> str:
        return "\n".join(self.output[-_TAIL_LINES:])


@dataclasses.dataclass
class JobResult:
    """The end of a job, and each task's.

    `reason`: "done" (every script task exited 0), "preempted" (each exited 0 or 143, at least
    one 143: the job saved and asks to be started again), "failed", "timeout", "interrupted"
    (the launcher got SIGINT or SIGTERM), or what `run_job(stop_when=)` returned ("resized").
    `launcher_signal`: the signal the launcher itself got while the job ran, if any.
    """

    reason: str
    tasks: Dict[str, TaskResult]
    isolated: bool = False  # the tasks ran in a private network namespace (loopback only)
    launcher_signal: Optional[int] = None

    @property
    def ok(self) -> bool:
        return self.reason == "done"

    @property
    def saved(self) -> bool:
        """Every script task exited with PREEMPTED_EXIT_CODE: the job saved where it stood."""
        codes = [r.returncode for r in self.tasks.values() if not r.serves]
        return bool(codes) and all(c == PREEMPTED_EXIT_CODE for c in codes)

    def _served(self, task: TaskResult) -> bool:
        # A server stopped because the job ended (only servers are stopped in a "done" job).
        return task.stopped and (self.ok or (self.reason == "preempted" and task.serves))

    @property
    def returncodes(self) -> Dict[str, Optional[int]]:
        """Exit code per task; servers stopped after a successful (or preempted) job count as 0."""
        return {name: (0 if self._served(r) else r.returncode) for name, r in self.tasks.items()}


def classify(tasks: Iterable[TaskResult]) -> str:
    """How a job went once its script tasks have ended: "done" when every one exited 0,
    "preempted" when each exited 0 or PREEMPTED_EXIT_CODE and at least one the latter,
    "failed" otherwise. Server-only tasks are not looked at: they are stopped at the end."""
    codes = [t.returncode for t in tasks if not t.serves]
    if any(code not in (0, PREEMPTED_EXIT_CODE) for code in codes):
        return "failed"
    return "preempted" if PREEMPTED_EXIT_CODE in codes else "done"


def plan_job(
    target: str,
    args: Sequence[str] = (),
    *,
    workers: int = 1,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    module: bool = False,
    cluster: Optional[ClusterSpec] = None,
    python: Optional[str] = None,
    extra_env: Optional[Mapping[str, str]] = None,
) -> List[TaskPlan]:
    """Computes the command and environment of every task of a local job. Spawns nothing.

    Args:
        target: str. A script path, or a module name when `module=True` (`python -m`).
        args: list of str. Arguments passed to the script in every task.
        workers / ps / chief / evaluator: the tasks. A parameter-server job (ps > 0) always
            gets a chief, which runs the script as the coordinator.
        cluster: ClusterSpec. Use these addresses instead of fresh loopback ports.
        python: str. The interpreter. Defaults to the current one.
        extra_env: mapping. More variables for every task.

    Returns:
        list[TaskPlan], in TF_CONFIG task order.
    """
    if not isinstance(target, str) or not target:
        raise ValueError(
            f"Nothing to launch: target={target!r}. HINT: give a script path or -m module."
        )
    if ps and not chief:
        chief = True  # the coordinator of a parameter-server job
    if cluster is None:
        cluster = ClusterSpec.local(workers=workers, ps=ps, chief=chief, evaluator=evaluator)
    python = python or sys.executable
    script = [python, "-m", target] if module else [python, target]
    plans = []
    for job, index in cluster.tasks:
        serves = bool(cluster.num_ps) and job in ("worker", "ps")
        argv = [python, "-m", "tfdist", "serve"] if serves else script + list(args)
        env = {
            "TF_CONFIG": cluster.to_json(job, index),
            "PYTHONUNBUFFERED": "1",
            settings.TASK.name: f"{job}:{index}",
        }
        env.update(extra_env or {})
        plans.append(TaskPlan(f"{job}:{index}", tuple(argv), env, serves))
    return plans


class _Task:
    def __init__(
        self,
        plan: TaskPlan,
        out: TextIO,
        lock: threading.Lock,
        log_dir: Optional[str],
        quiet: bool,
        report_dir: str,
        verbose: bool = False,
        namespace: Optional[netns.Namespace] = None,
    ):
        self.plan = plan
        self.output: List[str] = []
        self.started = time.monotonic()
        self.ended: Optional[float] = None
        self.stopped = False
        env = dict(os.environ)
        env.update(plan.env)
        # Where the task reports the steps it trained (tfdist.training_report), for the summary.
        self.report = env.setdefault(
            settings.REPORT_FILE.name,
            os.path.join(report_dir, plan.task.replace(":", "-") + ".json"),
        )
        self.log = (
            open(os.path.join(log_dir, plan.task.replace(":", "-") + ".log"), "a")
            if log_dir
            else None
        )
        argv = list(plan.argv)
        self.proc = subprocess.Popen(
            namespace.wrap(argv) if namespace else argv,
            pass_fds=namespace.fds if namespace else (),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            errors="replace",
            bufsize=1,
        )
        self.reader = threading.Thread(
            target=self._read, args=(out, lock, quiet, verbose), daemon=True
        )
        self.reader.start()

    def _read(self, out: TextIO, lock: threading.Lock, quiet: bool, verbose: bool) -> None:
        noise = NoiseFilter()
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.output.append(line)  # every line: the failure tail and the log keep them all
            if self.log:
                self.log.write(line + "\n")
                self.log.flush()
            if not quiet and (not noise.is_noise(line) or verbose):
                with lock:  # whole lines only: never interleave two tasks' partial lines
                    out.write(f"[{self.plan.task}] {line}\n")
                    out.flush()

    def signal(self, sig: int) -> None:
        # The whole process group, even when the task itself has exited: what it started
        # (e.g. a server under a wrapper) may still run.
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def result(self) -> TaskResult:
        self.reader.join(timeout=5)
        if self.log:
            self.log.close()
            self.log = None
        end = self.ended if self.ended is not None else time.monotonic()
        report = _report.read(self.report) or {}
        return TaskResult(
            self.plan.task,
            self.proc.returncode,
            self.output,
            end - self.started,
            self.stopped,
            report.get("steps"),
            report.get("seconds"),
            self.plan.serves,
        )


def _check_seconds(value, name: str, hint: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 < float(value) < math.inf
    ):
        raise ValueError(
            f"{name} must be a positive, finite number of seconds. Received: "
            f"{name}={value!r}. HINT: {hint}"
        )
    return float(value)


def check_timeout(timeout, name: str = "timeout") -> Optional[float]:
    """`timeout` as a float of seconds (None: no limit). Refuses what is not a positive,
    finite number of seconds, bools and strings included.

    Raises:
        ValueError: quoting the value.
    """
    if timeout is None:
        return None
    return _check_seconds(
        timeout,
        name,
        f"e.g. {name}=600 stops the job after 10 minutes; None (the default) sets no limit.",
    )


def check_grace(grace) -> float:
    """`grace` as a float of seconds: a positive, finite number (bools and strings refused).

    Raises:
        ValueError: quoting the value.
    """
    return _check_seconds(
        grace,
        "grace",
        f"e.g. grace=60 gives the tasks a minute to save and exit after a SIGTERM before they "
        f"are killed (SIGKILL); the default is {GRACE_SECONDS:g}.",
    )


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
            f"workers must be a number of workers or a pair (MIN, MAX). Received: "
            f"workers={workers!r}. HINT: e.g. workers=2, or workers=(2, 3) for an elastic job."
        )
    return workers, workers


_WARNED: List[str] = []  # the warnings already given by this process


def _job_namespace(out: TextIO, quiet: bool) -> Optional[netns.Namespace]:
    """A private network namespace for the job's tasks, or None (with a warning, once)."""
    mode = settings.NETWORK_NAMESPACE.get()
    if mode == "off":
        return None
    try:
        return netns.create()
    except netns.Unavailable as err:
        risk = (
            f"tfdist cannot start this job's tasks in a private network namespace ({err.strerror})"
            ", so their TensorFlow servers listen on every interface of this host (TensorFlow "
            "binds 0.0.0.0:PORT, whatever TF_CONFIG says), and other hosts that reach it can "
            "connect to them."
        )
        if mode == "require":
            raise RuntimeError(
                f"{risk} {settings.NETWORK_NAMESPACE.name}=require refuses to run it. HINT: allow "
                "user namespaces (Linux: sysctl user.max_user_namespaces=10000, "
                "kernel.unprivileged_userns_clone=1; a container needs them allowed), or set "
                f"{settings.NETWORK_NAMESPACE.name}=auto to run it with this risk."
            ) from err
        if "namespace" not in _WARNED:
            _WARNED.append("namespace")
            message = (
                f"WARNING: {risk} HINT: firewall the job's ports, or allow user namespaces "
                "(see docs/launcher.md); "
                f"{settings.NETWORK_NAMESPACE.name}=off runs jobs there without this warning."
            )
            if quiet:
                warnings.warn(message, RuntimeWarning, stacklevel=3)
            else:
                out.write(f"[tfdist] {message}\n")
                out.flush()
        return None


def run_job(
    plans: Sequence[TaskPlan],
    *,
    timeout: Optional[float] = None,
    grace: float = GRACE_SECONDS,
    out: Optional[TextIO] = None,
    log_dir: Optional[str] = None,
    quiet: bool = False,
    verbose: Optional[bool] = None,
    stop_when: Optional[Callable[[], Optional[str]]] = None,
) -> JobResult:
    """Runs the planned tasks until every script task has exited, or one fails.

    When a task exits with a code other than 0 and `PREEMPTED_EXIT_CODE` (143), or `timeout`
    seconds pass, or the launcher gets SIGINT or SIGTERM, every other task is stopped (SIGTERM
    to its process group, SIGKILL after `grace` seconds). When a script task exits with 143 (it
    saved after a SIGTERM; its peers stop at the same step by themselves), the others get
    `grace` seconds to exit on their own before they are stopped the same way. Server-only
    tasks are stopped once every script task has ended. The tasks run in a private network
    namespace where the system allows it (TFDIST_NETWORK_NAMESPACE).

    Args:
        grace: float. Seconds between SIGTERM and SIGKILL, and that the tasks get to follow a
            preempted peer. Defaults to 30.
        verbose: bool. Forward TensorFlow's start-up noise too. Defaults to TFDIST_VERBOSE.
        stop_when: callable. Asked about every 50 ms while the tasks run; when it returns a
            reason (a str), every task is stopped as above and the job ends with that reason.

    Returns:
        JobResult. Raises nothing for failed tasks: see `launch`.

    Raises:
        ValueError: a timeout or grace that is not a positive number of seconds.
        RuntimeError: TFDIST_NETWORK_NAMESPACE=require, and no namespace can be had.
    """
    timeout = check_timeout(timeout)
    grace = check_grace(grace)
    verbose = settings.VERBOSE.get() if verbose is None else bool(verbose)
    out = out or sys.stdout
    lock = threading.Lock()
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    namespace = _job_namespace(out, quiet)  # closed below, with the tasks
    tasks: List[_Task] = []
    report_dir = tempfile.mkdtemp(prefix="tfdist-reports-")
    deadline = None if timeout is None else time.monotonic() + timeout
    interrupted: List[int] = []
    previous = {}

    def on_signal(signum, frame):
        interrupted.append(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        for plan in plans:
            tasks.append(_Task(plan, out, lock, log_dir, quiet, report_dir, verbose, namespace))
        scripts = [t for t in tasks if not t.plan.serves]
        reason = None
        followed_until = None  # once a script task was preempted: when its peers must be done
        while reason is None:
            time.sleep(0.05)
            now = time.monotonic()
            for task in tasks:
                if task.ended is None and task.proc.poll() is not None:
                    task.ended = now
            ended = [t for t in tasks if t.ended is not None]
            if any(t.proc.returncode not in (0, PREEMPTED_EXIT_CODE) for t in ended):
                reason = "failed"
            elif all(t.ended is not None for t in scripts):
                reason = "ended"  # "done" or "preempted": the exit codes tell, below
            elif interrupted:
                reason = "interrupted"
            elif stop_when is not None and (asked := stop_when()):
                reason = asked
            elif deadline is not None and now > deadline:
                reason = "timeout"
            elif followed_until is not None and now > followed_until:
                reason = "ended"  # the tasks still running did not follow: stopped, below
            elif followed_until is None and any(
                t.proc.returncode == PREEMPTED_EXIT_CODE for t in ended if not t.plan.serves
            ):
                followed_until = now + grace
        _stop(tasks, grace)
    finally:
        for task in tasks:  # whatever happened above, no child outlives the launcher
            task.signal(signal.SIGKILL)
            task.proc.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if namespace:
            namespace.close()
    try:
        results = {t.plan.task: t.result() for t in tasks}
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)
    if reason == "ended":
        reason = classify(results.values())
    return JobResult(
        reason,
        results,
        isolated=namespace is not None,
        launcher_signal=interrupted[0] if interrupted else None,
    )


def _stop(tasks: List[_Task], grace: float) -> None:
    running = [t for t in tasks if t.proc.poll() is None]
    for task in running:
        task.stopped = True
        task.signal(signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(t.proc.poll() is None for t in running):
        time.sleep(0.05)
    for task in running:
        task.signal(signal.SIGKILL)
        task.proc.wait()
        if task.ended is None:
            task.ended = time.monotonic()


def summary(result: JobResult) -> str:
    """One line per task: exit code (or how it was stopped, or that it was preempted), wall
    time, and for a task that trained, its training steps and steps per second of training
    time."""
    lines = []
    for name, task in result.tasks.items():
        code = result.returncodes[name]
        if result._served(task):
            how = "served until the job ended"
        elif code == PREEMPTED_EXIT_CODE:
            how = f"preempted ({code})"
        elif task.stopped:
            how = f"stopped ({code})"
        else:
            how = f"exit {code}"
        line = f"[tfdist] {name:10} {how:28} {task.seconds:8.1f} s"
        rate = task.steps_per_second
        if rate is not None:
            line += f"  {task.steps} steps, {rate:.1f} steps/s"
        lines.append(line + "\n")
    return "".join(lines)


def exit_code(result: JobResult) -> int:
    """The exit code of `tfdist launch` for the job's last attempt: 0 when it is done; else,
    after the launcher's own SIGINT or SIGTERM, PREEMPTED_EXIT_CODE (143) when every script
    task saved and exited with it, or 128 + the signal's number when not; 1 otherwise."""
    if result.ok:
        return 0
    if result.launcher_signal:
        return PREEMPTED_EXIT_CODE if result.saved else 128 + result.launcher_signal
    return 1


def _how(code: Optional[int]) -> str:
    if code is None:
        return "did not end"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _first_failure(result: JobResult) -> Optional[TaskResult]:
    """The task whose failure ended the job: the first to exit by itself with a code other than
    0 and 143; else the first script task the launcher stopped that did not save (one still
    running `grace` seconds after a peer was preempted)."""
    bad = [r for r in result.tasks.values() if r.returncode not in (0, PREEMPTED_EXIT_CODE, None)]
    pool = [r for r in bad if not r.stopped] or [r for r in bad if not r.serves]
    return min(pool, key=lambda r: r.seconds, default=None)


def _first_preempted(result: JobResult) -> Optional[TaskResult]:
    """The script task that exited with PREEMPTED_EXIT_CODE first."""
    saved = [r for r in result.tasks.values() if r.returncode == PREEMPTED_EXIT_CODE]
    pool = [r for r in saved if not r.stopped] or saved
    return min(pool, key=lambda r: r.seconds, default=None)


def _preempted_by(result: JobResult) -> str:
    first = _first_preempted(result)
    if first is None:
        return f"a task exited with code {PREEMPTED_EXIT_CODE}"
    return f"task {first.task} exited with code {PREEMPTED_EXIT_CODE} first"


def _failure_message(result: JobResult, timeout, grace: float = GRACE_SECONDS) -> str:
    reason, results = result.reason, result.tasks
    if result.launcher_signal:
        how = f"The job was interrupted ({_signal_name(result.launcher_signal)} to the launcher)"
        if result.saved:
            return (
                f"{how}; every task saved and exited with code {PREEMPTED_EXIT_CODE} "
                "(preempted): run the same command again to resume from the backup."
            )
        if not results:
            return f"{how} before any task started."
        unsaved = ", ".join(
            f"{r.task} {_how(r.returncode)}"
            for r in results.values()
            if not r.serves and r.returncode != PREEMPTED_EXIT_CODE
        )
        return f"{how}; every task was stopped, and not every task saved: {unsaved}."
    if reason == "timeout":
        return f"The job did not finish within --timeout {timeout:g} s; every task was stopped."
    if reason == "interrupted":
        return "The job was interrupted; every task was stopped."
    if reason == "preempted":
        return f"The job was preempted ({_preempted_by(result)})."
    first = _first_failure(result)
    if first is None:
        return "The job failed."
    if first.stopped:
        message = (
            f"Task {first.task} was still running {grace:g} s after {_preempted_by(result)} "
            f"(preempted), and did not save when it was stopped: it {_how(first.returncode)}. "
            f"Its last lines:\n{first.tail}"
        )
    else:
        message = (
            f"Task {first.task} {_how(first.returncode)}; the other tasks were stopped. "
            f"Its last lines:\n{first.tail}"
        )
    if result.isolated and _NETWORK_ERRORS.search("\n".join(first.output)):
        message += (
            "\nThe tasks ran in a private network namespace, which has no network but loopback."
            f" HINT: download what the script needs before the job, or set "
            f"{settings.NETWORK_NAMESPACE.name}=off to run the tasks in the host's network."
        )
    return message


# What a task that needed the network prints, in the namespace that has none.
_NETWORK_ERRORS = re.compile(
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|No address associated with hostname|nodename nor servname"
)


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
            (or when `grow` is set). Not with `ps`.
        ps / chief / evaluator: the other tasks of the job (see `plan_job`).
        max_restarts: int. Restart the whole job, on fresh ports, at most this many times after
            a failure (in an elastic job: per worker slot). Defaults to 0.
        timeout: float. Seconds before the job is stopped, > 0. Defaults to no limit.
        grace: float. Seconds the tasks get to exit after a SIGTERM (or after a peer was
            preempted) before SIGKILL, > 0. Defaults to 30.
        log_dir: str. Also write each task's output to `<log_dir>/<type>-<index>.log` (every
            line, TensorFlow's start-up noise included).
        check: bool. Raise `JobFailed` instead of returning when the job fails.
        verbose: bool. Also forward TensorFlow's start-up noise (C++ INFO lines, the CUDA and
            oneDNN notices). Defaults to TFDIST_VERBOSE (off). Errors are always forwarded.
        grow: threading.Event. An elastic job only: set it (from any thread) to give back one
            worker slot lost for good, like SIGUSR1 does.

    Returns:
        dict: task name ("worker:0") -> exit code of the last attempt.

    Raises:
        ValueError: a bad `workers`, `max_restarts`, `timeout` or `grace`.
        JobFailed: with `check=True`, when the job did not end done.
    """
    return _launch(
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
    ).returncodes


def _launch(
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
) -> JobResult:
    """`launch`, returning the JobResult of the last attempt (the CLI's exit code needs it)."""
    if not is_count(max_restarts):
        raise ValueError(
            f"max_restarts must be a non-negative integer. Received: "
            f"max_restarts={max_restarts!r}. HINT: 0 runs the job once; 1 restarts it once."
        )
    low, high = check_workers(workers, ps)
    elastic = isinstance(workers, (tuple, list))
    if grow is not None and not elastic:
        raise ValueError(
            f"grow= needs an elastic job. Received: workers={workers!r}. HINT: "
            "workers=(MIN, MAX), e.g. workers=(2, 3), starts 3 workers and can go on with 2."
        )
    timeout = check_timeout(timeout)
    grace = check_grace(grace)
    verbose = settings.VERBOSE.get() if verbose is None else bool(verbose)
    out = out or sys.stdout
    spec = f"--workers {low}:{high}"
    slots = _Slots(low, high, max_restarts) if elastic else None

    def say(text: str) -> None:
        out.write(f"[tfdist] {text}\n")
        out.flush()

    with _Requests(grow).handled(elastic) as requests:

        def resize() -> Optional[str]:
            if not requests.pending():
                return None
            if slots.workers < high:
                return "resized"
            requests.take()
            say(f"A worker slot came back, but the job already runs {high} workers ({spec}).")
            return None

        if elastic:
            how = (
                f"`kill -USR1 {os.getpid()}` (this launcher's pid)"
                if requests.on_sigusr1
                else "setting `grow`"
            )
            say(
                f"Elastic job ({spec}): starting {high} workers. A worker slot that fails more "
                f"than --max-restarts {max_restarts} {'time' if max_restarts == 1 else 'times'} "
                f"is dropped (down to {low} workers); {how} gives one back."
            )
        attempt = preemptions = 0
        result: Optional[JobResult] = None
        note = ""
        while True:
            if requests.signals:  # the launcher's own signal, between two attempts
                signum = requests.signals[0]
                result = (
                    dataclasses.replace(result, launcher_signal=signum)
                    if result
                    else JobResult("interrupted", {}, launcher_signal=signum)
                )
                break
            if elastic and slots.workers < high and requests.pending():
                back = slots.grow(requests.take())  # asked for between two attempts
                say(f"{_plural(len(back), 'worker slot')} came back: {slots.workers} workers.")
            plans = plan_job(
                target,
                args,
                workers=slots.workers if elastic else workers,
                ps=ps,
                chief=chief,
                evaluator=evaluator,
                module=module,
                extra_env=extra_env,
            )
            result = run_job(
                plans,
                timeout=timeout,
                grace=grace,
                out=out,
                log_dir=log_dir,
                quiet=quiet,
                verbose=verbose,
                stop_when=resize if elastic else None,
            )
            if not quiet:
                out.write(summary(result))
                out.flush()
            if result.ok or result.launcher_signal:
                break
            if result.reason == "preempted":
                if preemptions < MAX_PREEMPTION_RESTARTS:
                    preemptions += 1
                    say(
                        f"The job was preempted ({_preempted_by(result)}); restarting it on "
                        "fresh ports (not counted against --max-restarts; preemption restart "
                        f"{preemptions} of at most {MAX_PREEMPTION_RESTARTS})."
                    )
                    continue
                note = (
                    f"It was restarted {MAX_PREEMPTION_RESTARTS} times after a preemption "
                    "already (MAX_PREEMPTION_RESTARTS), so it is not restarted again. HINT: a "
                    f"script that exits with {PREEMPTED_EXIT_CODE} when it was not sent SIGTERM "
                    "restarts forever; run the same command again to resume from the backup."
                )
                break
            if result.reason == "resized":
                back = slots.grow(requests.take())
                say(
                    f"{_plural(len(back), 'worker slot')} came back; restarting the job with "
                    f"{slots.workers} workers on fresh ports (not counted against "
                    "--max-restarts)."
                )
                continue
            if result.reason != "failed":
                break
            message = _failure_message(result, timeout, grace)
            if not elastic:
                if attempt < max_restarts:
                    attempt += 1
                    say(
                        f"{message}\n[tfdist] Restarting the job ({attempt}/{max_restarts}) on "
                        "fresh ports."
                    )
                    continue
                break
            first = _first_failure(result)
            verdict, slot, count = slots.failed(first.task if first else None)
            failures = f"{_plural(count, 'failure')} of {slots.name(slot)}"
            if verdict == "restart":
                say(
                    f"{message}\n[tfdist] Restarting the job ({count}/{max_restarts} for "
                    f"{slots.name(slot)}) on fresh ports."
                )
                continue
            if verdict == "shrink":
                say(
                    f"{message}\n[tfdist] After {failures}, more than --max-restarts "
                    f"{max_restarts}, the slot is lost for good: restarting the job with "
                    f"{slots.workers} workers on fresh ports ({spec}; not counted against "
                    "--max-restarts)."
                )
                continue
            note = f"After {failures}, more than --max-restarts {max_restarts}, the job stops" + (
                f": it cannot go on with fewer than {low} workers ({spec})."
                if isinstance(slot, int)
                else f" ({slot} is not a worker slot that the job can go on without)."
            )
            break
    if result.ok:
        return result
    message = _failure_message(result, timeout, grace)
    if check:
        raise JobFailed(f"{message}\n{note}" if note else message, result)
    say(message)
    if note:
        say(note)
    return result


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
