"""One attempt of a local multi-process TensorFlow job, one process per task, on loopback.

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

Roles: in a parameter-server job (ps > 0) the worker and ps tasks run plain TensorFlow servers
and the chief (added automatically) runs the script. Otherwise every worker (and the chief
and evaluator, if any) runs the script.

What became of the job (`JobResult`, the summary, the messages) is `tfdist.launcher.outcome`;
running it again after a failure or a preemption, and elastic jobs, `tfdist.launcher.restarts`.

Holds `_WARNED`, the warnings this process gave once. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import numbers
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable, Deque, List, Mapping, Optional, Sequence, TextIO, Tuple

from tfdist import gpus as gpu_lib
from tfdist import netns, settings
from tfdist import training_report as _report
from tfdist.cluster import ClusterSpec
from tfdist.launcher import keeper as keeping
from tfdist.launcher import preload as preloading
from tfdist.launcher import startup
from tfdist.launcher.noise import NoiseFilter
from tfdist.launcher.outcome import (
    GRACE_SECONDS,
    KEPT_LINE_CHARS,
    KEPT_LINES,
    JobResult,
    TaskResult,
    classify,
)
from tfdist.launcher.progress import Console, Monitor
from tfdist.preemption import PREEMPTED_EXIT_CODE

__all__ = ["LAUNCHER_LOG", "TaskPlan", "plan_job", "run_job"]

LAUNCHER_LOG = "launcher.log"  # in --log-dir: the launcher's own progress and stall lines


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
    gpus_per_worker: Optional[gpu_lib.PerWorker] = None,
    evaluator_gpus: int = 0,
    visible_gpus: Optional[Sequence[str]] = None,
    only: Optional[Sequence[str]] = None,
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
        gpus_per_worker: "auto", "shared" or K: how the GPUs are handed out
            (`tfdist.gpus`); None leaves every task the launcher's GPUs.
        evaluator_gpus: int. GPUs for the evaluator task (default none).
        visible_gpus: list of str. The GPUs to hand out. Defaults to `gpus.visible()`.
        only: list of str. The tasks this host runs ("worker:2"), of a `cluster` that spans
            several hosts (a multi-node job); the GPUs go to those. Defaults to every task.

    Returns:
        list[TaskPlan], in TF_CONFIG task order.

    Raises:
        GpuError: the GPUs asked for are not there (before anything starts).
    """
    if not isinstance(target, str) or not target:
        raise ValueError(
            f"Nothing to launch: target={target!r}. HINT: give a script path or -m module."
        )
    if isinstance(args, (str, bytes)) or not all(isinstance(arg, str) for arg in _iterable(args)):
        raise TypeError(
            f"args must be a list of strings, the script's arguments. Received: args={args!r}. "
            "HINT: e.g. args=['--epochs', '3']."
        )
    if ps and not chief:
        chief = True  # the coordinator of a parameter-server job
    if cluster is None:
        cluster = ClusterSpec.local(workers=workers, ps=ps, chief=chief, evaluator=evaluator)
    python = python or sys.executable
    script = [python, "-m", target] if module else [python, target]
    tasks = cluster.tasks
    if only is not None:
        wanted = set(only)
        tasks = [(job, index) for job, index in tasks if f"{job}:{index}" in wanted]
    on_gpus = {}
    if gpus_per_worker is not None:
        on_gpus = gpu_lib.plan(tasks, cluster.num_ps, gpus_per_worker, evaluator_gpus, visible_gpus)
    plans = []
    for job, index in tasks:
        serves = bool(cluster.num_ps) and job in ("worker", "ps")
        argv = [python, "-m", "tfdist", "serve"] if serves else script + list(args)
        env = {
            "TF_CONFIG": cluster.to_json(job, index),
            "PYTHONUNBUFFERED": "1",
            # tfdist/launcher/startup/sitecustomize.py: an unmodified script gets `import tfdist`
            "PYTHONPATH": os.pathsep.join(
                filter(None, (startup.FOLDER, os.environ.get("PYTHONPATH")))
            ),
            settings.TASK.name: f"{job}:{index}",
            **on_gpus.get(f"{job}:{index}", {}),
        }
        env.update(extra_env or {})
        if extra_env and "PYTHONPATH" in extra_env:  # theirs, after the start-up folder
            env["PYTHONPATH"] = os.pathsep.join(
                dict.fromkeys(filter(None, (startup.FOLDER, *env["PYTHONPATH"].split(os.pathsep))))
            )
        plans.append(TaskPlan(f"{job}:{index}", tuple(argv), env, serves))
    return plans


def _iterable(value) -> tuple:
    try:
        return tuple(value)
    except TypeError:
        return (None,)  # not iterable: refused as not a list of strings


class _Task:
    def __init__(
        self,
        plan: TaskPlan,
        console: Console,
        log_dir: Optional[str],
        quiet: bool,
        report_dir: str,
        verbose: bool = False,
        namespace: Optional[netns.Namespace] = None,
        preload: bool = False,
        grace: float = GRACE_SECONDS,
        watch: Tuple[float, float] = (0.0, 0.0),
    ):
        self.plan = plan
        self.output: Deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.started = time.monotonic()
        self.ended: Optional[float] = None
        self.stopped = False
        env = dict(os.environ)
        env.pop(settings.RENDEZVOUS_TOKEN.name, None)  # a multi-node job's secret stays here
        env.update(plan.env)
        # Where the task reports the steps it trained (tfdist.training_report), for the summary.
        self.report = env.setdefault(
            settings.REPORT_FILE.name,
            os.path.join(report_dir, plan.task.replace(":", "-") + ".json"),
        )
        # What the launcher watches (its Monitor: stall timeout, seconds between progress
        # lines): with neither, the task reports no progress (tfdist.training_report.install).
        env[settings.STALL_TIMEOUT.name], env[settings.STATUS_EVERY.name] = map(repr, watch)
        # Its scratch files (tfdist.scratch), removed by its keeper once it has ended.
        scratch = os.path.join(report_dir, plan.task.replace(":", "-") + ".tmp")
        os.mkdir(scratch)
        env[settings.TASK_TMPDIR.name] = scratch
        self.log = (
            open(os.path.join(log_dir, plan.task.replace(":", "-") + ".log"), "a")
            if log_dir
            else None
        )
        argv = preloading.task_argv(plan.argv, env) if preload else list(plan.argv)
        argv = namespace.wrap(argv) if namespace else argv
        fds = namespace.fds if namespace else ()
        # The keeper (tfdist.launcher.keeper) ends what the task starts, even when this
        # process is killed: the lifeline's end of file tells it so.
        self.lifeline: Optional[int] = None
        if keeping.available():
            read, self.lifeline = os.pipe()
            argv, fds = keeping.wrap(argv, read, grace, self.report, scratch), (*fds, read)
        try:
            self.proc = subprocess.Popen(
                argv,
                pass_fds=fds,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
                errors="replace",
                bufsize=1,
            )
        finally:
            if self.lifeline is not None:
                os.close(read)
        self.reader = threading.Thread(
            target=self._read, args=(console, quiet, verbose), daemon=True
        )
        self.reader.start()

    def _read(self, console: Console, quiet: bool, verbose: bool) -> None:
        noise = NoiseFilter()
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            # The last lines, for the failure tail and the result; the log keeps every line.
            self.output.append(
                line
                if len(line) <= KEPT_LINE_CHARS
                else f"{line[:KEPT_LINE_CHARS]} ... ({len(line)} characters in all)"
            )
            if self.log:
                self.log.write(line + "\n")
                self.log.flush()
            if not quiet and (not noise.is_noise(line) or verbose):
                # whole lines only: never interleave two tasks' partial lines
                console.line(f"[{self.plan.task}] {line}")

    def signal(self, sig: int) -> None:
        # The whole process group, even when the task itself has exited: what it started
        # (e.g. a server under a wrapper) may still run.
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL to the task and all it started (its keeper's sweep, where it has one: a
        process it started in a session of its own is not in its group), then to its group."""
        if self.lifeline is not None and self.proc.poll() is None:
            try:
                os.write(self.lifeline, keeping.KILL)
                self.proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.close_lifeline()

    def close_lifeline(self) -> None:
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None

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
            list(self.output),
            end - self.started,
            self.stopped,
            report.get("steps"),
            report.get("seconds"),
            self.plan.serves,
            report.get("not_restartable"),
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
    preload: bool = False,
    private_network: bool = True,
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
        preload: bool. Fork the Python tasks from a process that has imported TensorFlow
            (`tfdist.launcher.preload`) instead of starting each afresh. Defaults to False.
        private_network: bool. False runs the tasks in the host's network whatever
            TFDIST_NETWORK_NAMESPACE says (a multi-node job: other hosts must reach them).

    While the tasks train, their progress is shown and a stall is named
    (`tfdist.launcher.progress`: TFDIST_STATUS_EVERY, TFDIST_STALL_TIMEOUT), unless `quiet`.

    Returns:
        JobResult. Raises nothing for failed tasks: see `launch`.

    Raises:
        ValueError: a timeout or grace that is not a positive number of seconds.
        RuntimeError: TFDIST_NETWORK_NAMESPACE=require, and no namespace can be had.
    """
    timeout = check_timeout(timeout)
    grace = check_grace(grace)
    verbose = settings.VERBOSE.get() if verbose is None else bool(verbose)
    stall_timeout, every = settings.STALL_TIMEOUT.get(), settings.STATUS_EVERY.get()
    out = out or sys.stdout
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    console = Console(
        out,
        threading.Lock(),
        live=bool(every) and _is_terminal(out),
        log=os.path.join(log_dir, LAUNCHER_LOG) if log_dir else None,
    )
    namespace = _job_namespace(out, quiet) if private_network else None  # closed below
    tasks: List[_Task] = []
    report_dir = tempfile.mkdtemp(prefix="tfdist-reports-")
    watch = _Watch(timeout, grace, stop_when)
    previous = watch.catch_signals()
    try:
        for plan in plans:
            tasks.append(
                _Task(
                    plan,
                    console,
                    log_dir,
                    quiet,
                    report_dir,
                    verbose,
                    namespace,
                    preload,
                    grace,
                    watch=(0.0, 0.0) if quiet else (stall_timeout, every),
                )
            )
        monitor = (
            None
            if quiet
            else Monitor(
                tasks, console, stall_timeout, every, now=time.monotonic(), per_task=verbose
            )
        )
        reason = watch.wait(tasks, monitor)
        console.clear()
        _stop(tasks, grace)
    finally:
        for task in tasks:  # whatever happened above, no child outlives the launcher
            task.kill()
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
        launcher_signal=watch.interrupted[0] if watch.interrupted else None,
    )


def _is_terminal(out: TextIO) -> bool:
    """Whether `out` is a terminal that takes a status line updated in place."""
    try:
        return bool(out.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False


class _Watch:
    """When a running job must end, and why: "failed" (a task exited with a code other than 0
    and 143), "ended" (every script task exited, or a preempted task's peers had `grace`
    seconds to follow), "interrupted" (the launcher's own SIGINT or SIGTERM), `stop_when`'s
    reason, or "timeout"."""

    def __init__(self, timeout: Optional[float], grace: float, stop_when):
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.grace, self.stop_when = grace, stop_when
        self.interrupted: List[int] = []  # the launcher's own signals, in order
        self.followed_until: Optional[float] = None  # once a script task was preempted

    def catch_signals(self) -> dict:
        """In the main thread, records SIGINT and SIGTERM (the job then ends "interrupted");
        returns the handlers they had, to put back."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    def _on_signal(self, signum, frame) -> None:
        self.interrupted.append(signum)

    def wait(self, tasks: List[_Task], monitor: Optional[Monitor] = None) -> str:
        """Looks at the tasks every 50 ms until the job must end (and lets `monitor` read
        their progress); returns why."""
        scripts = [t for t in tasks if not t.plan.serves]
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            for task in tasks:
                if task.ended is None and task.proc.poll() is not None:
                    task.ended = now
            if monitor is not None:
                monitor.poll(now)
            reason = self._reason(tasks, scripts, now)
            if reason is not None:
                return reason

    def _reason(self, tasks: List[_Task], scripts: List[_Task], now: float) -> Optional[str]:
        ended = [t for t in tasks if t.ended is not None]
        if any(t.proc.returncode not in (0, PREEMPTED_EXIT_CODE) for t in ended):
            return "failed"
        if scripts and all(t.ended is not None for t in scripts):
            return "ended"  # "done" or "preempted": the exit codes tell (run_job)
        # (servers only, a node of a multi-node parameter-server job: until `stop_when`)
        if self.interrupted:
            return "interrupted"
        asked = self.stop_when() if self.stop_when is not None else None
        if asked:
            return asked
        if self.deadline is not None and now > self.deadline:
            return "timeout"
        if self.followed_until is not None:
            # The tasks still running did not follow in time: stopped by run_job.
            return "ended" if now > self.followed_until else None
        if any(t.proc.returncode == PREEMPTED_EXIT_CODE for t in ended if not t.plan.serves):
            self.followed_until = now + self.grace
        return None


def _stop(tasks: List[_Task], grace: float) -> None:
    running = [t for t in tasks if t.proc.poll() is None]
    for task in running:
        task.stopped = True
        task.signal(signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(t.proc.poll() is None for t in running):
        time.sleep(0.05)
    for task in running:
        task.kill()
        if task.ended is None:
            task.ended = time.monotonic()
