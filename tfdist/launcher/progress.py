"""A running job's progress and stalls, read from its tasks' reports (`tfdist.training_report`).

`Console` is the launcher's output while the job runs: every task's whole lines and the
launcher's own, and, on a terminal, one status line kept below them and updated in place.
`Monitor` reads each training task's report once a second: the optimizer step of the fit in
progress, the steps that fit trains. It shows the job's step (the slowest task's), its steps/s
over the last `RATE_WINDOW` seconds and the slowest task (with `per_task`, `tfdist launch
--verbose`: every task's step and steps/s): in the status line on a terminal, as a
line every TFDIST_STATUS_EVERY seconds elsewhere (a log, a pipe).

A stall: a task in a fit whose step has not moved for TFDIST_STALL_TIMEOUT seconds
(`tfdist launch --stall-timeout`). The launcher names the tasks that are behind (with those
seen to stop within `SEEN_LATE` of them), with their steps and the steps of the others, and
asks every training task for the Python stack of each of its threads, which the task writes to
its output; the job goes on (a stall may end: a slow save, a long evaluation). Once per stall:
the next is reported after some task steps again.
A task before its first fit, or between two, is never stalled (it may be loading data).

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import collections
import threading
from typing import Dict, List, Optional, TextIO

from tfdist import training_report as reports

__all__ = ["Console", "Monitor", "READ_SECONDS", "RATE_WINDOW", "SEEN_LATE"]

READ_SECONDS = 1.0  # between two reads of the tasks' reports
# how late the launcher may see a step: a task reports every PROGRESS_SECONDS, the launcher reads
# every READ_SECONDS. Tasks that stopped together (one holds up, the others wait for it in a
# collective) are seen to stop up to this far apart, and are named together at a stall.
SEEN_LATE = reports.PROGRESS_SECONDS + READ_SECONDS
RATE_WINDOW = 10.0  # seconds of steps behind the steps/s shown
_CLEAR = "\r\x1b[K"  # back to the start of the line, and erase it


class Console:
    """Whole lines of the tasks and the launcher, and on a terminal (`live`) a status line below
    them: a line written while the status shows erases it, then writes it again below. The
    launcher's own lines (`say`: progress, stalls) also go to the file `log` when given (the
    tasks' lines have their own logs)."""

    def __init__(self, out: TextIO, lock: threading.Lock, live: bool, log: Optional[str] = None):
        self.out, self.lock, self.live, self.log = out, lock, live, log
        self._status = ""

    def say(self, text: str) -> None:
        """A line of the launcher's own: shown, and kept in the launcher's log."""
        self.line(text)
        if self.log:
            try:
                with open(self.log, "a") as f:
                    f.write(text + "\n")
            except OSError:
                pass  # a log that cannot be written costs the log, not the job

    def line(self, text: str) -> None:
        with self.lock:
            if self._status:
                self.out.write(_CLEAR)
            self.out.write(text + "\n")
            if self._status:
                self.out.write(self._status)
            self.out.flush()

    def status(self, text: str) -> None:
        if not self.live:
            return
        with self.lock:
            self.out.write(_CLEAR + text)
            self._status = text
            self.out.flush()

    def clear(self) -> None:
        with self.lock:
            if self._status:
                self.out.write(_CLEAR)
                self._status = ""
                self.out.flush()


class _Seen:
    """What the launcher knows of one task's progress."""

    __slots__ = ("step", "total", "fitting", "moved", "rates")

    def __init__(self):
        self.step: Optional[int] = None
        self.total: Optional[int] = None
        self.fitting = False
        self.moved = 0.0  # time.monotonic() when its step last changed, or its fit began
        self.rates: collections.deque = collections.deque()  # (time, step) of its last reads


def _rate(rates: collections.deque, now: float, step: int) -> Optional[float]:
    """Steps/s over the last RATE_WINDOW seconds, `step` read at `now` added to `rates`."""
    rates.append((now, step))
    while rates and now - rates[0][0] > RATE_WINDOW:
        rates.popleft()
    (first_time, first_step), (last_time, last_step) = rates[0], rates[-1]
    if last_time > first_time:
        return (last_step - first_step) / (last_time - first_time)
    return None


class Monitor:
    """The progress line and stall detection of one run of a job.

    `tasks`: the launcher's tasks (`tfdist.launcher.job._Task`: `.plan.task`, `.plan.serves`,
    `.report`, `.ended`); only script tasks report; at a stall the servers are asked for their
    stacks too. `stall_timeout` 0 turns stall detection off, `every` 0 the progress lines (and
    the status line).
    """

    def __init__(
        self,
        tasks,
        console: Console,
        stall_timeout: float,
        every: float,
        now: float,
        per_task: bool = False,
    ):
        self.per_task = per_task  # each task's step and steps/s in the line (--verbose)
        self.tasks = [t for t in tasks if not t.plan.serves]
        self.servers = [t for t in tasks if t.plan.serves]  # asked for their stacks at a stall
        self.console, self.stall_timeout, self.every = console, stall_timeout, every
        self.seen: Dict[str, _Seen] = {t.plan.task: _Seen() for t in self.tasks}
        self.rates: collections.deque = collections.deque()  # (time, job step)
        self.next_read = now + READ_SECONDS
        self.next_line = now + every  # a job shorter than that prints none
        self.stalled = False  # a stall was reported and no step came since

    def poll(self, now: float) -> None:
        """Called often by the launcher's wait loop; reads the reports once a second."""
        if now < self.next_read:
            return
        self.next_read = now + READ_SECONDS
        running = [t for t in self.tasks if t.ended is None]
        moved = False
        for task in running:
            seen = self.seen[task.plan.task]
            progress = reports.read_progress(task.report)
            if progress is None:
                continue
            step, fitting = progress.get("step"), bool(progress.get("fitting"))
            if fitting and not seen.fitting:
                seen.moved = now  # a fit began: its clock starts
            if step != seen.step and step is not None:
                if seen.step is not None:
                    moved = True
                seen.moved = now
            seen.step, seen.total, seen.fitting = step, progress.get("total"), fitting
        if moved:
            self.stalled = False
        fitting = [t.plan.task for t in running if self.seen[t.plan.task].fitting]
        if not fitting:
            return
        self._show(fitting, now)
        if self.stall_timeout and not self.stalled:
            self._stall(fitting, running, now)

    def _show(self, fitting: List[str], now: float) -> None:
        steps = {name: self.seen[name].step for name in fitting if self.seen[name].step is not None}
        if not steps or not self.every:
            return
        slowest = min(steps, key=lambda name: (steps[name], name))
        step = steps[slowest]
        rate = _rate(self.rates, now, step)
        total = self.seen[slowest].total
        text = f"[tfdist] step {step}" + (f"/{total}" if total else "")
        if rate is not None:
            text += f", {rate:.1f} steps/s"
        if self.per_task:
            rates = {name: _rate(self.seen[name].rates, now, n) for name, n in steps.items()}
            text += "; " + ", ".join(
                f"{name} {value}" + (f" {rates[name]:.1f}/s" if rates[name] is not None else "")
                for name, value in sorted(steps.items())
            )
        elif len(set(steps.values())) > 1:
            text += f", slowest {slowest} (the others at " + ", ".join(
                f"{name} {value}" for name, value in sorted(steps.items()) if name != slowest
            )
            text += ")"
        if self.console.live:
            self.console.status(text)
        elif now >= self.next_line:
            self.next_line = now + self.every
            self.console.say(text)

    def _stall(self, fitting: List[str], running, now: float) -> None:
        if all(now - self.seen[n].moved < self.stall_timeout for n in fitting):
            return
        # with those seen to stop at about the same time: which of them stopped first is not
        # known to within SEEN_LATE, and naming one alone would tell that the others go on
        late = self.stall_timeout - SEEN_LATE
        stuck = [n for n in fitting if now - self.seen[n].moved >= late]
        self.stalled = True
        wait = round(self.stall_timeout)

        def where(name):
            step = self.seen[name].step
            return f"{name} at step {step}" if step is not None else f"{name} before its first step"

        others = [n for n in self.seen if n not in stuck]
        if not others:
            head = f"No task has made a training step for {wait} s: " + ", ".join(
                where(n) for n in sorted(stuck)
            )
        else:
            head = (
                ", ".join(where(n) for n in sorted(stuck))
                + f" made no training step for {wait} s, while "
                + ", ".join(where(n) for n in sorted(others))
            )
        self.console.say(
            f"[tfdist] Stall: {head}. The job goes on; the Python stacks of every task "
            "follow. HINT: a task that waits in a collective waits for the others; the task "
            "whose stack is elsewhere (its input, a callback, a save) holds them up. "
            "--stall-timeout 0 turns this off."
        )
        for task in running + [t for t in self.servers if t.ended is None]:
            reports.request_stacks(task.report)
