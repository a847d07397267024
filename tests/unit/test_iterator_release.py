"""The releaser of tfdist.fixes.iterators, on plain Python objects: what it is handed is dropped
in its own thread, in order; a full backlog is dropped by the caller; at exit it waits, bounded,
for what it holds. (The fix itself, on TensorFlow's iterators: tests/cluster/test_each_fix.py.)
"""

import os
import subprocess
import sys
import threading
import time

import pytest

from tfdist.fixes import iterators


class _Part:
    """Records the thread that drops it; a slow destructor, when told to be."""

    def __init__(self, freed, seconds=0.0):
        self.freed, self.seconds = freed, seconds

    def __del__(self):
        time.sleep(self.seconds)
        self.freed.append(threading.current_thread().name)


def _wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_what_is_handed_over_is_dropped_in_the_releasers_thread():
    releaser, freed = iterators._Releaser(), []
    started = time.monotonic()
    releaser.release([_Part(freed, seconds=0.3)])  # the caller does not wait for the drop
    assert time.monotonic() - started < 0.2
    assert _wait_for(lambda: freed)
    assert freed == [iterators.THREAD_NAME]
    assert releaser.drain(seconds=5)


def test_a_full_backlog_is_dropped_by_the_caller(monkeypatch):
    monkeypatch.setattr(iterators, "MAX_PENDING", 2)
    releaser, freed = iterators._Releaser(), []
    for _ in range(2):
        releaser.release([_Part(freed, seconds=0.5)])  # the first busies the thread
    releaser.release([_Part(freed)])  # the backlog holds 1 or 2: one more may still go
    releaser.release([_Part(freed)])
    assert "MainThread" in freed
    assert releaser.drain(seconds=10)
    assert len(freed) == 4


def test_drain_waits_for_the_backlog_and_gives_up_at_its_bound():
    releaser, freed = iterators._Releaser(), []
    releaser.release([_Part(freed, seconds=1.0)])
    started = time.monotonic()
    assert releaser.drain(seconds=0.1) is False
    assert time.monotonic() - started < 0.5
    assert releaser.drain(seconds=10) is True
    assert freed == [iterators.THREAD_NAME]


def test_a_releaser_never_used_drains_at_once():
    assert iterators._Releaser().drain(seconds=0) is True


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_its_own_thread():
    releaser, freed = iterators._Releaser(), []
    releaser.release([_Part(freed)])
    assert releaser.drain(seconds=5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread does not exist here
        child_freed = []
        releaser.release([_Part(child_freed)])
        ok = releaser.drain(seconds=5) and child_freed == [iterators.THREAD_NAME]
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)


def test_at_exit_the_process_waits_for_what_its_releaser_holds():
    code = (
        "import threading, time\n"
        "from tfdist.fixes import iterators\n"
        "class Part:\n"
        "    def __del__(self):\n"
        "        time.sleep(0.5)\n"
        "        print('dropped in', threading.current_thread().name, flush=True)\n"
        "iterators.RELEASER.release([Part()])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == f"dropped in {iterators.THREAD_NAME}\n", done
