"""The keeper: the process between the launcher and one task, so that nothing the task starts
outlives the job, even when the launcher itself is killed with `kill -9`.

The launcher starts `python -I -S keeper.py LIFELINE GRACE REPORT SCRATCH -- ARGV...` as the
head of the task's process group; the keeper forks the task (which execs ARGV, in the same
group) and:

- is the task's subreaper (PR_SET_CHILD_SUBREAPER): whatever the task starts, even in a new
  session of its own, stays the keeper's descendant when its parent exits;
- reads LIFELINE, a pipe whose other end only the launcher holds: end of file means the
  launcher is gone (however it died), and every descendant gets SIGTERM, then SIGKILL after
  GRACE seconds (and the task's REPORT file goes, with the launcher's report directory once
  the last keeper removed its own); the byte "K" asks for SIGKILL of every descendant at
  once (the launcher's SIGKILL to the group would end the keeper before it could do that);
- when the task exits, gives what is left of its descendants SIGTERM, then SIGKILL after
  `LEFTOVER_GRACE` seconds, and exits as the task did (its exit code, or the signal that
  ended it), so the launcher reports the task and not the keeper;
- ignores the signals the launcher sends to the group (SIGTERM, SIGINT, ...): the task gets
  them itself, as a member of the group;
- removes SCRATCH, the task's scratch directory (TFDIST_TASK_TMPDIR, `tfdist.scratch`),
  with what a task killed in the middle of a save left there, once the task and its
  descendants have ended.

The task dies with the keeper (PR_SET_PDEATHSIG): a keeper killed with SIGKILL takes its task
along. Linux only; elsewhere the launcher starts tasks without a keeper (`available`).

Run as a script this file imports the standard library only.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time

__all__ = ["KILL", "LEFTOVER_GRACE", "available", "wrap"]

KILL = b"K"
LEFTOVER_GRACE = 5.0  # seconds the task's leftovers get between SIGTERM and SIGKILL
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_HELD = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGPIPE,
)


def available() -> bool:
    """True where tasks can run under a keeper (Linux, with /proc)."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self")


def wrap(argv, lifeline: int, grace: float, report: str = "", scratch: str = "") -> list:
    """The command line that runs `argv` under a keeper reading the pipe end `lifeline` (pass
    it in Popen's pass_fds); `report` is the task's report file in the launcher's report
    directory (`tfdist.training_report`), `scratch` the task's scratch directory, which the
    keeper removes after the task."""
    return [
        sys.executable,
        "-I",
        "-S",
        os.path.abspath(__file__),
        str(lifeline),
        repr(float(grace)),
        report,
        scratch,
        "--",
        *argv,
    ]


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        return ctypes.CDLL(None).prctl(option, value, 0, 0, 0) == 0
    except Exception:  # pylint: disable=broad-except
        return False


def _alive_descendants(root: int) -> list:
    """The pids below `root` that are not zombies, read from /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def _remove_report(path: str) -> None:
    """Removes the task's report to the launcher (`tfdist.training_report`), and the launcher's
    report directory once it is empty: the launcher that would have removed them is gone."""
    folder = os.path.dirname(path)
    if not os.path.basename(folder).startswith("tfdist-reports-"):
        return  # not the launcher's own directory
    for remove in (lambda: os.remove(path), lambda: os.rmdir(folder)):
        try:
            remove()
        except OSError:
            pass


class _Keeper:
    def __init__(self, lifeline: int, grace: float, report: str, scratch: str):
        self.lifeline, self.grace, self.report, self.scratch = lifeline, grace, report, scratch
        self.task = 0
        self.status = None  # the task's wait status, once it exited

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.task:
                self.status = status

    def sweep(self, grace: float, first: int = signal.SIGTERM) -> None:
        """Ends every descendant: `first`, then SIGKILL to those left after `grace` seconds."""
        me = os.getpid()
        for sig in (first, signal.SIGKILL):
            for pid in _alive_descendants(me):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + (grace if sig != signal.SIGKILL else 10.0)
            while True:
                self.reap()
                if not _alive_descendants(me) or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            if sig == signal.SIGKILL or not _alive_descendants(me):
                return

    def run(self, argv) -> None:
        launcher = os.getppid()
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        me = os.getpid()
        self.task = os.fork()
        if self.task == 0:
            try:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
                os.close(self.lifeline)
                _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != me:
                    os._exit(128 + signal.SIGKILL)  # the keeper died before prctl took
                os.execvp(argv[0], argv)
            except BaseException as err:  # pylint: disable=broad-except
                sys.stderr.write(f"tfdist: cannot start {argv[0]}: {err}\n")
                sys.stderr.flush()
            os._exit(127)
        os.set_blocking(self.lifeline, False)
        gone = os.getppid() != launcher  # the launcher died before the keeper started
        while self.status is None:
            if gone:
                self.sweep(self.grace)
                self.remove_scratch()
                _remove_report(self.report)
                gone = False
            readable, _, _ = select.select([self.lifeline], [], [], 0.1)
            if readable:
                try:
                    data = os.read(self.lifeline, 64)
                except BlockingIOError:
                    data = b"-"
                if not data:
                    gone = True
                elif KILL in data:
                    self.sweep(0.0, signal.SIGKILL)
            self.reap()
        self.sweep(LEFTOVER_GRACE)
        self.remove_scratch()

    def remove_scratch(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def exit_as_the_task(self) -> None:
        status = self.status
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                import resource

                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the task dumped, if any
            except (ImportError, ValueError, OSError):
                pass
            while signal.sigtimedwait(_HELD, 0) is not None:
                pass  # the group's signals held until now must not end the keeper instead
            if sig != signal.SIGKILL:
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)  # a signal that does not end a process by default
        os._exit(os.waitstatus_to_exitcode(status))


def main(args) -> None:
    if len(args) < 6 or args[4] != "--":
        sys.stderr.write("usage: keeper.py LIFELINE GRACE REPORT SCRATCH -- ARGV...\n")
        os._exit(2)
    keeper = _Keeper(int(args[0]), float(args[1]), args[2], args[3])
    argv = args[5:]
    keeper.run(argv)
    keeper.exit_as_the_task()


if __name__ == "__main__":
    main(sys.argv[1:])
