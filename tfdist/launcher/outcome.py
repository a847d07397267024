"""What became of a local job: each task's result, the job's, and what the launcher says of it.

`run_job` (`tfdist.launcher.job`) returns a `JobResult` that holds a `TaskResult` per task.
`classify` tells how a job went from its script tasks' exit codes (0: done;
`PREEMPTED_EXIT_CODE`, 143: saved after a SIGTERM; anything else: failed). `summary` gives a
line per task, `exit_code` the exit code of `tfdist launch`, and `failure_message` why a job
did not end done: the task that failed first and its last lines, the task preempted first,
a hint when a task needed the network that its private namespace lacks. `JobFailed` carries a
`JobResult` out of `launch(check=True)`.

`GRACE_SECONDS` is here, the lowest module that quotes it: the default of `run_job` and
`launch`, and of the messages that name the grace a preempted job's tasks had.

Holds no state and spawns nothing. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from typing import Dict, Iterable, List, Optional

from tfdist import settings
from tfdist.launcher.noise import NoiseFilter
from tfdist.preemption import PREEMPTED_EXIT_CODE

__all__ = [
    "JobFailed",
    "JobResult",
    "TaskResult",
    "failure_message",
    "first_failure",
    "preempted_by",
]

GRACE_SECONDS = 30.0  # after a SIGTERM (or a peer's preemption), before SIGKILL
_TAIL_LINES = 20
KEPT_LINES = 10_000  # of each task's output, in memory (a task may print gigabytes)
KEPT_LINE_CHARS = 16_384


class JobFailed(RuntimeError):
    """A task of a launched job failed, or the job timed out."""

    def __init__(self, message: str, result: "JobResult"):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class TaskResult:
    """What became of one task: exit code (negative: killed by that signal), output, time.

    Exit code 0: the task finished; `PREEMPTED_EXIT_CODE` (143): it saved a backup after a
    SIGTERM and asks to be started again; anything else: it failed.
    """

    task: str
    returncode: Optional[int]
    output: List[str]  # the last KEPT_LINES lines (cut at KEPT_LINE_CHARS); the log has all
    seconds: float
    stopped: bool = False  # stopped by the launcher (a peer failed, timeout, job ended)
    steps: Optional[int] = None  # training steps of every fit in the task (optimizer steps)
    train_seconds: Optional[float] = None  # wall time of those fits
    serves: bool = False  # only ran a server (a worker or ps of a parameter-server job)
    not_restartable: Optional[str] = None  # why running it again would fail the same way

    @property
    def steps_per_second(self) -> Optional[float]:
        if not self.steps or not self.train_seconds:
            return None
        return self.steps / self.train_seconds

    @property
    def tail(self) -> str:
        """The last lines of the task's output without TensorFlow's start-up noise (its
        `--log-dir` file has every line)."""
        noise = NoiseFilter()
        return "\n".join([line for line in self.output if not noise.is_noise(line)][-_TAIL_LINES:])


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
    restarts: int = 0  # the job's attempts before this one (`launch`), for any reason
    preemption_restarts: int = 0  # those of them after a preemption
    # per task: the attempts it ran in before this one (an elastic job's tasks come and go)
    task_restarts: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def slowest(self) -> Optional[str]:
        """The training task with the fewest steps per second, when two or more trained."""
        rates = {n: t.steps_per_second for n, t in self.tasks.items() if t.steps_per_second}
        return min(rates, key=lambda n: (rates[n], n)) if len(rates) > 1 else None

    def as_dict(self) -> dict:
        """The job's summary as plain data (`tfdist launch --summary-json`)."""
        codes = self.returncodes
        return {
            "reason": self.reason,
            "restarts": self.restarts,
            "preemption_restarts": self.preemption_restarts,
            "slowest": self.slowest,
            "tasks": {
                name: {
                    "exit_code": codes[name],
                    "restarts": self.task_restarts.get(name, 0),
                    "stopped": task.stopped,
                    "served": task.serves,
                    "seconds": round(task.seconds, 3),
                    "steps": task.steps,
                    "train_seconds": task.train_seconds,
                    "steps_per_second": task.steps_per_second,
                }
                for name, task in self.tasks.items()
            },
        }

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


def summary(result: JobResult) -> str:
    """One line per task: exit code (or how it was stopped, or that it was preempted), wall
    time, and for a task that trained, its training steps, the time in its fits and steps per
    second of that time; the restarts it had, if any."""
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
            line += f"  {task.steps} steps in {task.train_seconds:.1f} s, {rate:.1f} steps/s"
        restarts = result.task_restarts.get(name, 0)
        if restarts:
            line += f"  ({restarts} {'restart' if restarts == 1 else 'restarts'} before)"
        lines.append(line + "\n")
    slowest = result.slowest
    if slowest is not None:
        lines.append(
            f"[tfdist] The slowest task: {slowest}, "
            f"{result.tasks[slowest].steps_per_second:.1f} steps/s.\n"
        )
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


def first_failure(result: JobResult) -> Optional[TaskResult]:
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


def preempted_by(result: JobResult) -> str:
    first = _first_preempted(result)
    if first is None:
        return f"a task exited with code {PREEMPTED_EXIT_CODE}"
    return f"task {first.task} exited with code {PREEMPTED_EXIT_CODE} first"


def failure_message(result: JobResult, timeout, grace: float = GRACE_SECONDS) -> str:
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
        return f"The job was preempted ({preempted_by(result)})."
    first = first_failure(result)
    if first is None:
        return "The job failed."
    if first.stopped:
        message = (
            f"Task {first.task} was still running {grace:g} s after {preempted_by(result)} "
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
