"""Run a script as a local multi-process TensorFlow job, one process per task, on loopback.

Two steps, kept apart so the first is testable without spawning anything:

1. `plan_job(...)` is a pure function: the cluster (free loopback ports) and, for each task,
   its command line and environment (its own TF_CONFIG).
2. `run_job(plans)` starts the processes, forwards each output line prefixed with its task
   (TensorFlow's start-up noise left out, `tfdist.launcher.noise`), stops every task when one
   fails (SIGTERM, then SIGKILL after a grace period), and returns each task's exit code.

The tasks of a job run in a private network namespace of their own where the system allows it
(`tfdist.netns`; TFDIST_NETWORK_NAMESPACE): TensorFlow's servers listen on every
interface, and only there does "loopback only" hold.

`launch(...)` does both, with restarts; the `tfdist launch` command is a thin wrapper over it.

Roles: in a parameter-server job (ps > 0) the worker and ps tasks run plain TensorFlow servers
and the chief (added automatically) runs the script. Otherwise every worker (and the chief
and evaluator, if any) runs the script.
"""

from __future__ import annotations

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
from typing import Dict, List, Mapping, Optional, Sequence, TextIO

from tfdist import netns, settings
from tfdist import training_report as _report
from tfdist.cluster import ClusterSpec
from tfdist.errors import is_count
from tfdist.launcher.noise import NoiseFilter

__all__ = ["JobFailed", "JobResult", "TaskPlan", "TaskResult", "launch", "plan_job", "run_job"]

GRACE_SECONDS = 10.0
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
    """What became of one task: exit code (negative: killed by that signal), output, time."""

    task: str
    returncode: Optional[int]
    output: List[str]
    seconds: float
    stopped: bool = False  # stopped by the launcher (a peer failed, timeout, job ended)
    steps: Optional[int] = None  # training steps of every fit in the task (optimizer steps)
    train_seconds: Optional[float] = None  # wall time of those fits

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
    """The end of a job: why it ended ("done", "failed", "timeout", "interrupted"), per task."""

    reason: str
    tasks: Dict[str, TaskResult]
    isolated: bool = False  # the tasks ran in a private network namespace (loopback only)

    @property
    def ok(self) -> bool:
        return self.reason == "done"

    @property
    def returncodes(self) -> Dict[str, Optional[int]]:
        """Exit code per task; servers stopped after a successful job count as 0."""
        return {
            name: (0 if r.stopped and self.ok else r.returncode) for name, r in self.tasks.items()
        }


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
        )


def check_timeout(timeout, name: str = "timeout") -> Optional[float]:
    """`timeout` as a float of seconds (None: no limit). Refuses what is not a positive,
    finite number of seconds, bools and strings included.

    Raises:
        ValueError: quoting the value.
    """
    if timeout is None:
        return None
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, numbers.Real)
        or not 0 < float(timeout) < math.inf
    ):
        raise ValueError(
            f"{name} must be a positive, finite number of seconds. Received: "
            f"{name}={timeout!r}. HINT: e.g. {name}=600 stops the job after 10 minutes; "
            "None (the default) sets no limit."
        )
    return float(timeout)


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
) -> JobResult:
    """Runs the planned tasks until every script task has exited, or one fails.

    When a task exits non-zero, or `timeout` seconds pass, every other task is stopped
    (SIGTERM to its process group, SIGKILL after `grace` seconds). Server-only tasks are
    stopped once every script task has succeeded. The tasks run in a private network namespace
    where the system allows it (TFDIST_NETWORK_NAMESPACE).

    Args:
        verbose: bool. Forward TensorFlow's start-up noise too. Defaults to TFDIST_VERBOSE.

    Returns:
        JobResult. Raises nothing for failed tasks: see `launch`.

    Raises:
        ValueError: a timeout that is not a positive number of seconds.
        RuntimeError: TFDIST_NETWORK_NAMESPACE=require, and no namespace can be had.
    """
    timeout = check_timeout(timeout)
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
        reason = None
        while reason is None:
            time.sleep(0.05)
            for task in tasks:
                if task.ended is None and task.proc.poll() is not None:
                    task.ended = time.monotonic()
            failed = [t for t in tasks if t.ended is not None and t.proc.returncode != 0]
            if failed:
                reason = "failed"
            elif all(t.ended is not None for t in tasks if not t.plan.serves):
                reason = "done"
            elif interrupted:
                reason = "interrupted"
            elif deadline is not None and time.monotonic() > deadline:
                reason = "timeout"
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
        return JobResult(
            reason, {t.plan.task: t.result() for t in tasks}, isolated=namespace is not None
        )
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


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
    """One line per task: exit code (or how it was stopped), wall time, and for a task that
    trained, its training steps and steps per second of training time."""
    lines = []
    for name, task in result.tasks.items():
        code = result.returncodes[name]
        if task.stopped and result.ok:
            how = "served until the job ended"
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


def _failure_message(result: JobResult, timeout) -> str:
    reason, results = result.reason, result.tasks
    if reason == "timeout":
        return f"The job did not finish within --timeout {timeout:g} s; every task was stopped."
    if reason == "interrupted":
        return "The job was interrupted; every task was stopped."
    first = min(
        (r for r in results.values() if r.returncode not in (0, None) and not r.stopped),
        key=lambda r: r.seconds,
        default=None,
    )
    if first is None:
        return "The job failed."
    code = first.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    message = (
        f"Task {first.task} {how}; the other tasks were stopped. Its last lines:\n{first.tail}"
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


def launch(
    target: str,
    args: Sequence[str] = (),
    *,
    workers: int = 1,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    module: bool = False,
    max_restarts: int = 0,
    timeout: Optional[float] = None,
    log_dir: Optional[str] = None,
    extra_env: Optional[Mapping[str, str]] = None,
    quiet: bool = False,
    out: Optional[TextIO] = None,
    check: bool = False,
    verbose: Optional[bool] = None,
) -> Dict[str, int]:
    """Runs `target` as a local multi-process job; the Python twin of `tfdist launch`.

    Args:
        target: str. A script path, or a module name with `module=True`.
        args: list of str. The script's arguments.
        workers / ps / chief / evaluator: the tasks of the job (see `plan_job`).
        max_restarts: int. Restart the whole job, on fresh ports, at most this many times after
            a failure. Defaults to 0.
        timeout: float. Seconds before the job is stopped, > 0. Defaults to no limit.
        log_dir: str. Also write each task's output to `<log_dir>/<type>-<index>.log` (every
            line, TensorFlow's start-up noise included).
        check: bool. Raise `JobFailed` instead of returning when the job fails.
        verbose: bool. Also forward TensorFlow's start-up noise (C++ INFO lines, the CUDA and
            oneDNN notices). Defaults to TFDIST_VERBOSE (off). Errors are always forwarded.

    Returns:
        dict: task name ("worker:0") -> exit code of the last attempt.
    """
    if not is_count(max_restarts):
        raise ValueError(
            f"max_restarts must be a non-negative integer. Received: "
            f"max_restarts={max_restarts!r}. HINT: 0 runs the job once; 1 restarts it once."
        )
    timeout = check_timeout(timeout)
    verbose = settings.VERBOSE.get() if verbose is None else bool(verbose)
    out = out or sys.stdout
    attempt = 0
    while True:
        plans = plan_job(
            target,
            args,
            workers=workers,
            ps=ps,
            chief=chief,
            evaluator=evaluator,
            module=module,
            extra_env=extra_env,
        )
        result = run_job(
            plans, timeout=timeout, out=out, log_dir=log_dir, quiet=quiet, verbose=verbose
        )
        if not quiet:
            out.write(summary(result))
            out.flush()
        if result.ok:
            return result.returncodes
        message = _failure_message(result, timeout)
        if result.reason == "failed" and attempt < max_restarts:
            attempt += 1
            out.write(
                f"[tfdist] {message}\n[tfdist] Restarting the job ({attempt}/{max_restarts})"
                " on fresh ports.\n"
            )
            out.flush()
            continue
        if check:
            raise JobFailed(message, result)
        out.write(f"[tfdist] {message}\n")
        out.flush()
        return result.returncodes
