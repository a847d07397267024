"""SIGTERM and SIGINT in tfdist's processes: they end the process at once, with a message, or,
while a training listens for preemption, they become a preemption notice.

Schedulers end a task with SIGTERM (spot VMs, SLURM, Kubernetes, `tfdist launch` stopping a
job). In a multi_worker_mirrored process TensorFlow's coordination service installs a C++
SIGTERM handler (preemption_notifier.cc, "SIGTERM caught") that only logs the signal: the
process went on as if nothing came. `take_sigterm`, run once the strategy is built, puts a
Python handler in its place: SIGTERM ends the process (its default action), unless a
`listening` block is active, which then gets the signal instead (`tfdist.BackupAndRestore`
turns it into "stop at an agreed step, save, exit").

Python runs a signal handler only between bytecodes of the main thread, and a step of training
or a collective waiting for a dead peer can hold the main thread inside TensorFlow. So a
watchdog thread reads the signal numbers Python's C handler writes to the wakeup descriptor and
acts at once. Imports nothing of tfdist or TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import sys
import threading
import time
from typing import Callable, Iterator, List, Optional

__all__ = ["die", "is_default", "listening", "take_sigterm", "Watchdog"]

_DYING = threading.Lock()


def die(signum: int, message: str) -> None:
    """Writes `message`, then ends the process by `signum` (its default action)."""
    if not _DYING.acquire(blocking=False):  # the handler and the watchdog both saw it
        time.sleep(10)
        return
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except Exception:  # pylint: disable=broad-except
        pass
    try:
        import ctypes

        ctypes.CDLL(None).signal(signum, 0)  # SIG_DFL, from any thread
        os.kill(os.getpid(), signum)
        time.sleep(2)
    finally:
        os._exit(128 + signum)


def is_default(handler) -> bool:
    """True for the handler a program has when it installed none (SIGTERM: SIG_DFL; SIGINT:
    Python's KeyboardInterrupt), or tfdist's own process-wide one. A program's own handler, or
    SIG_IGN, is respected."""
    return handler in (signal.SIG_DFL, signal.default_int_handler, None) or getattr(
        handler, "_tfdist_default", False
    )


class Watchdog:
    """Reads the signals Python's C handler writes to the wakeup descriptor, even while the
    main thread waits in TensorFlow, and calls `on_signal(signum)` for those in `signals`."""

    def __init__(self, signals, on_signal: Callable[[int], None]):
        self.signals, self.on_signal = set(signals), on_signal
        self.read_fd, self.write_fd = os.pipe()
        self.stop_r, self.stop_w = os.pipe()
        os.set_blocking(self.write_fd, False)
        try:
            self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            self.previous_fd = None
        self.thread = threading.Thread(target=self._run, name="tfdist-signals", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.read_fd, self.stop_r], [], [])
            except InterruptedError:
                continue
            except OSError as err:
                if err.errno == errno.EINTR:
                    continue
                return
            if self.stop_r in ready:
                return
            for signum in os.read(self.read_fd, 64):
                if signum in self.signals:
                    self.on_signal(signum)

    def stop(self) -> None:
        if self.previous_fd is not None:
            signal.set_wakeup_fd(self.previous_fd)
        os.write(self.stop_w, b"x")
        self.thread.join(timeout=5)
        for fd in (self.read_fd, self.write_fd, self.stop_r, self.stop_w):
            os.close(fd)


# ------------------------------------------------------------- the process-wide SIGTERM

_LISTENERS: List[Callable[[int], None]] = []
_LOCK = threading.Lock()
_TAKEN: List[str] = []  # the task name, once take_sigterm has run
_WATCHDOG: List[Watchdog] = []


def _on_sigterm(signum: int) -> None:
    if signal.getsignal(signal.SIGTERM) is not _handler:
        return  # the program installed its own handler since: it decides
    with _LOCK:
        listeners = list(_LISTENERS)
    if listeners:
        for listener in listeners:
            listener(signum)
        return
    task = _TAKEN[0] if _TAKEN else "of this process"
    die(signum, f"tfdist: task {task} received SIGTERM; exiting.")


def _handler(signum, frame):  # the main thread's turn, after the watchdog's
    _on_sigterm(signum)


_handler._tfdist_default = True  # `interruptible` waits may take over from it


def take_sigterm(task: Optional[str] = None) -> bool:
    """Makes SIGTERM end this process (or notify a `listening` block), in the place of
    TensorFlow's handler that swallows it. Idempotent; a no-op outside the main thread and when
    the program installed a SIGTERM handler of its own. Returns whether tfdist handles SIGTERM.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is _handler:
        return True
    if not is_default(current):
        return False  # the program's own handler (installed before or since): respected
    signal.signal(signal.SIGTERM, _handler)  # sigaction: replaces TensorFlow's C++ handler
    if not _TAKEN:
        _TAKEN.append(task or "of this process")
        _WATCHDOG.append(Watchdog([signal.SIGTERM], _on_sigterm))
    return True


@contextlib.contextmanager
def listening(listener: Callable[[int], None], task: Optional[str] = None) -> Iterator[bool]:
    """While inside, SIGTERM calls `listener(signal.SIGTERM)` (from a watchdog thread, then
    again from the main thread: it must be idempotent and quick) instead of ending the process.
    Yields False, and listens to nothing, when the program handles SIGTERM itself."""
    handles = take_sigterm(task)
    if handles:
        with _LOCK:
            _LISTENERS.append(listener)
    try:
        yield handles
    finally:
        if handles:
            with _LOCK:
                _LISTENERS.remove(listener)
