"""What a task of a `tfdist launch` job trains, for the launcher's progress line, its stall
detection and its summary line.

A leaf below the strategy (which installs it) and the launcher (which reads it).

The launcher gives each task a file path in TFDIST_REPORT_FILE. In such a task,
`make_strategy` calls `install()`, which wraps Keras' `CallbackList.on_train_begin` /
`on_train_end` (of the Keras the process uses, Keras 3 or tf_keras): every `fit` in the
process, Keras' own or tfdist's parameter-server loop, adds the growth of its optimizer's
`iterations` and its wall time to the file, rewritten whole after each fit. A task that would
fail the same way if it ran again (a backup that does not match the model) says so in the file
too (`refuse_restart`), and the launcher does not restart the job. The launcher reads the file
when the task has ended.

While the task runs, a thread of its own (`_Reporter`) writes its progress into the same file
every `PROGRESS_SECONDS`: the optimizer step of the fit in progress (read from
`optimizer.iterations`, so no batch callback slows the fit), the steps that fit will train and
the time (`read_progress`). The same thread writes every thread's Python stack to the task's
output when the launcher asks for it (`request_stacks`, a file beside the report): a stuck main
thread, inside TensorFlow or not, cannot prevent that. A task that only serves (a worker or ps
of a parameter-server job) runs a thread that answers such requests and does nothing else
(`answer_stack_requests`).

Without the launcher (a job a scheduler started from TF_CONFIG, with no TFDIST_REPORT_FILE), the
same thread watches for a stall by itself: a task in a fit whose step has not moved for
TFDIST_STALL_TIMEOUT seconds says so and writes the stack of each of its threads, once per stall
(every task of a stuck job does, so their outputs show where each one is).

Under a launcher that watches nothing (TFDIST_STALL_TIMEOUT and TFDIST_STATUS_EVERY both 0, or
`tfdist.launch(quiet=True)`), no thread runs: the file gets the totals at the end of each fit.

Nothing is written without TFDIST_REPORT_FILE, and a report that cannot be read or written costs
nothing but the progress, the steps/s of the summary and the stacks (and a restart).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import threading
import time
import weakref
from typing import Optional

from tfdist import settings

PROGRESS_SECONDS = 1.0  # between two progress reports of a task
STACKS_SUFFIX = ".stacks"  # beside the report: the launcher asks for the task's stacks

_LOCK = threading.Lock()
_WRITING = threading.Lock()
_TOTALS = {"steps": 0, "seconds": 0.0, "fits": 0}
_INSTALLED = False


def _iterations(callbacks) -> Optional[int]:
    return _step(getattr(callbacks, "model", None))


def _step(model) -> Optional[int]:
    """The model's optimizer step, or None."""
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    if iterations is None:
        return None
    try:
        return int(iterations.numpy())
    except Exception:  # pylint: disable=broad-except
        return None  # a counter that cannot be read here: no steps/s, training unaffected


def _write(path: str) -> None:
    with _WRITING:  # the reporter thread and the end of a fit: one writer of the file at once
        with _LOCK:
            payload = dict(_TOTALS)
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(payload, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def read(path: str) -> Optional[dict]:
    """The report at `path`: {"steps", "seconds", "fits"}, with "not_restartable" (why) where
    the task refused a restart; or None (none written, unreadable)."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not (report.get("fits") or report.get("not_restartable")):
        return None
    return report


def read_progress(path: str) -> Optional[dict]:
    """The task's latest progress at `path`: {"step", "total", "fitting", "time"} (time.time()
    of the report), or None (none written yet, unreadable)."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None
    progress = report.get("progress") if isinstance(report, dict) else None
    return progress if isinstance(progress, dict) else None


def request_stacks(path: str) -> None:
    """Asks the task whose report is `path` to write every thread's stack to its output (within
    about PROGRESS_SECONDS)."""
    try:
        with open(path + STACKS_SUFFIX, "w"):
            pass
    except OSError:
        pass


class _Reporter(threading.Thread):
    """The task's progress, written every PROGRESS_SECONDS to `path` (the launcher's report),
    and its stacks when asked; without a `path`, its own stall watch (`stall_timeout` > 0)."""

    def __init__(self, path: Optional[str], stall_timeout: float = 0.0, task: str = ""):
        super().__init__(name="tfdist-progress", daemon=True)
        self.path, self.stall_timeout, self.task = path, stall_timeout, task
        self.fit = None  # (weak reference to the CallbackList's model, total steps or None)
        self.step: Optional[int] = None
        self.moved = time.monotonic()  # when the step last changed, or a fit began
        self.stalled = False  # reported, and no step since

    def begin(self, callbacks) -> None:
        params = getattr(callbacks, "params", None) or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        total = epochs * steps if isinstance(epochs, int) and isinstance(steps, int) else None
        model = getattr(callbacks, "model", None)
        self.moved, self.stalled = time.monotonic(), False
        self.fit = (weakref.ref(model) if model is not None else _none, total)

    def end(self) -> None:
        self.fit = None
        self.report()

    def report(self) -> None:
        fit = self.fit
        if fit is not None:
            step = _step(fit[0]())
            if step is not None:
                if step != self.step:
                    self.moved, self.stalled = time.monotonic(), False
                self.step = step
        if self.path is None:
            return
        with _LOCK:
            _TOTALS["progress"] = {
                "step": self.step,
                "total": fit[1] if fit is not None else None,
                "fitting": fit is not None,
                "time": time.time(),
            }
        _write(self.path)

    def watch(self) -> None:
        """Without the launcher: a fit whose step has not moved for stall_timeout seconds."""
        waited = time.monotonic() - self.moved
        if self.fit is None or self.stalled or waited < self.stall_timeout:
            return
        self.stalled = True
        task = self.task or settings.TASK.get() or "this task"
        where = f"at step {self.step}" if self.step is not None else "before its first step"
        _dump(
            f"tfdist: {task} has made no training step for {round(waited)} s ({where}); the "
            "stack of every thread of this task follows (TFDIST_STALL_TIMEOUT; 0 turns this "
            "off). A task that waits in a collective waits for the others: their output shows "
            "the one that holds the job up."
        )

    def run(self) -> None:
        while True:
            time.sleep(PROGRESS_SECONDS)
            try:
                if self.path is not None:
                    _answer(self.path)
                self.report()
                if self.path is None and self.stall_timeout:
                    self.watch()
            except Exception:  # pylint: disable=broad-except
                pass  # progress is best effort: training goes on without it


def _answer(path: str) -> None:
    """Writes every thread's stack when the launcher asked for it (a file beside the report)."""
    asked = path + STACKS_SUFFIX
    if not os.path.exists(asked):
        return
    try:
        os.remove(asked)
    except OSError:
        return
    _dump("tfdist: the stack of every thread of this task (asked by the launcher):")


def answer_stack_requests() -> bool:
    """In a task that only serves (a worker or ps of a parameter-server job, `tfdist serve`):
    a thread that writes every thread's stack when the launcher asks at a stall, and nothing
    else. Returns True when it runs (under a launcher that watches for stalls)."""
    path = settings.REPORT_FILE.get()
    if not path or not settings.STALL_TIMEOUT.get():
        return False

    def answer():
        while True:
            time.sleep(PROGRESS_SECONDS)
            try:
                _answer(path)
            except Exception:  # pylint: disable=broad-except
                pass  # best effort: the server goes on without it

    threading.Thread(target=answer, name="tfdist-stacks", daemon=True).start()
    return True


def _dump(headline: str) -> None:
    """`headline`, then the Python stack of every thread, on stderr."""
    sys.stdout.flush()
    sys.stderr.write(headline + "\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()


def _none():
    return None


_REPORTER: Optional[_Reporter] = None


def refuse_restart(reason: str) -> None:
    """Tells the launcher that this task would fail the same way if the job ran again (`reason`,
    the error it raises): the launcher does not restart the job. Does nothing outside the
    launcher (no TFDIST_REPORT_FILE)."""
    path = settings.REPORT_FILE.get()
    if not path:
        return
    with _LOCK:
        _TOTALS["not_restartable"] = reason
    _write(path)


def install(watch_stalls: bool = False, task: str = "") -> bool:
    """Counts training steps of every fit in this process and reports its progress when
    TFDIST_REPORT_FILE is set; else, with `watch_stalls` (`task`, e.g. "worker:1", of a job
    started without the launcher) and TFDIST_STALL_TIMEOUT > 0, watches its fits for a stall.

    Returns True when either is (already) installed.
    """
    global _INSTALLED, _REPORTER
    path = settings.REPORT_FILE.get()
    stall_timeout = settings.STALL_TIMEOUT.get() if watch_stalls and not path else 0.0
    if not path and not stall_timeout:
        return False
    with _LOCK:
        if _INSTALLED:
            return True
        _INSTALLED = True
    reporter = _Reporter(path, stall_timeout, task)
    # Under the launcher, its TFDIST_STALL_TIMEOUT and TFDIST_STATUS_EVERY (what it watches,
    # both 0 when it is quiet) say whether anyone reads the progress: if not, no thread runs.
    if not path or settings.STALL_TIMEOUT.get() or settings.STATUS_EVERY.get():
        _REPORTER = reporter
        reporter.start()
    from tfdist import flavour

    callback_list = flavour.keras().callbacks.CallbackList
    begin, end = callback_list.on_train_begin, callback_list.on_train_end

    def on_train_begin(self, logs=None):
        started = time.monotonic()
        result = begin(self, logs)
        # counted after the callbacks' own on_train_begin: BackupAndRestore may restore a
        # later optimizer step there, and the steps before it were not trained by this fit
        self._tfdist_report_start = (_iterations(self), started)
        reporter.begin(self)
        return result

    def on_train_end(self, logs=None):
        result = end(self, logs)
        start = getattr(self, "_tfdist_report_start", None)
        if start is not None:
            first, started = start
            last = _iterations(self)
            with _LOCK:
                _TOTALS["fits"] += 1
                _TOTALS["seconds"] += time.monotonic() - started
                if first is not None and last is not None:
                    _TOTALS["steps"] += max(last - first, 0)
            if path:
                _write(path)
            reporter.end()
        return result

    callback_list.on_train_begin = on_train_begin
    callback_list.on_train_end = on_train_end
    return True
