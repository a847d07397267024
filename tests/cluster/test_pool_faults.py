"""Strategy pools (tfdist.testing.pools) under faults, with real processes and TensorFlow.

- A file that calls compare_training at module level, without an `if __name__ == "__main__":`
  guard, is imported by the pool's process to find build_model: the call fails at once there,
  naming the guard and the file, and the caller's comparison fails with it (no pools of pools).
- A pool's processes die with the caller killed by `kill -9`, even while blocked in an import,
  in a C call that holds the GIL (fresh processes, and forked from a preloader).
- A preloader started for one pool outlives that pool: the kernel's parent-death signal
  follows the *thread* that started a process, and the other pools fork from it too.
- Clients of the pool's socket with a wrong key, with junk or silent are refused, and the pool
  starts all the same; a pool that cannot start raises PoolError with its processes' output.

The callers of the first two run as `python script.py` in a subprocess. Their processes are
found by a marker: the caller's TMPDIR, in the path of every pool's and preloader's socket, so
on the command line of every process a pool starts (fresh, forked, or a wrapper of either).
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from tfdist.testing import PoolError, strategy_server
from tfdist.testing import pools as pools_module
from tfdist.testing.clusters import function_reference
from tfdist.testing.pools import StrategyPool

from helpers.paths import TESTS

pytestmark = pytest.mark.slow  # starts strategy pools

BUILD_MODEL = """
import os
import sys

import numpy as np

MARK = os.path.dirname(os.path.abspath(__file__))


def build_model():
    from tfdist import flavour

    keras = flavour.keras()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def compare():
    from tfdist.testing import compare_training

    x = np.random.RandomState(0).randn(16, 4).astype("float32")
    return compare_training(
        build_model, (x, x.sum(1)), global_batch_size=8, steps=1, epochs=1,
        strategies=("one_device",),
    )
"""


# ------------------------------------------------------------------------- helpers
def _processes(marker):
    """{pid: command line} of the live processes (zombies left out) whose command line holds
    `marker`, this one excepted."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in command and state not in ("Z", "X"):
            found[int(name)] = command
    return found


def _left_after(marker, seconds):
    """The marked processes still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = _processes(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def marked():
    """A short, unique folder: the caller's TMPDIR and its script's home (short enough for a
    Unix socket's path). Whatever is left of its processes is killed at the end."""
    folder = tempfile.mkdtemp(prefix="tfpf-")
    yield folder
    for pid in _processes(folder):  # a failed test's leftovers: ours, started above
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


def _caller(folder, body, **env):
    script = os.path.join(folder, "pool_caller.py")
    with open(script, "w") as f:
        f.write(BUILD_MODEL + textwrap.dedent(body))
    full = dict(os.environ, TMPDIR=folder, TF_CPP_MIN_LOG_LEVEL="2", **env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return script, full


# -------------------------------------------------------------- pools do not nest
def test_a_comparison_at_module_level_without_a_main_guard_fails_at_once(marked):
    """Each strategy process imports the file to find build_model: there the call is refused
    (it used to start a pool of its own, whose processes did the same, without end)."""
    script, env = _caller(marked, "\ncompare()\nprint('compared')\n")
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, script], env=env, cwd=marked, capture_output=True, text=True, timeout=150
    )
    took = time.monotonic() - started
    assert run.returncode == 1, run.stdout + run.stderr
    assert "compared" not in run.stdout
    assert "TrainingDiffers: The reference run (one_device) failed: RuntimeError: " in run.stderr
    assert f"compare_training was called at module level of {script} in a strategy pool" in (
        run.stderr
    )
    assert f'HINT: put the call under `if __name__ == "__main__":` in {script}' in run.stderr
    assert took < 120, took
    assert not _left_after(marked, 10)


def test_a_pool_started_inside_a_pools_process_is_refused(tmp_path, monkeypatch):
    """As in a pool's own process: a file imported there that starts a pool at module level is
    named, with the guard it lacks; a function that starts one is told that pools do not nest."""
    monkeypatch.setattr(strategy_server, "_SERVING", ["local"])
    with pytest.raises(RuntimeError, match=r"pools do not nest\. HINT: call pool_for from"):
        pools_module.pool_for("mirrored")
    user = tmp_path / "unguarded_user_file.py"
    user.write_text("from tfdist.testing import pools\npools.pool_for('mirrored')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError) as caught:
        __import__("unguarded_user_file")
    message = str(caught.value)
    assert f"pool_for was called at module level of {user} in a strategy pool's own process" in (
        message
    )
    assert f'HINT: put the call under `if __name__ == "__main__":` in {user}, or' in message


# ---------------------------------------------------------- dying with the caller
BLOCKED = """
if __name__ == "__main__":
    compare()
else:  # imported by the pool's process: blocked in a C call that holds the GIL
    import ctypes

    with open(os.path.join(MARK, f"blocked-{os.getpid()}"), "w"):
        pass
    ctypes.PyDLL(None).sleep(600)
"""


@pytest.mark.parametrize("preload", ["1", "0"], ids=["forked", "fresh"])
def test_a_pools_processes_die_with_the_caller_even_blocked_in_an_import(marked, preload):
    script, env = _caller(marked, BLOCKED, TFDIST_PRELOAD=preload)
    caller = subprocess.Popen(
        [sys.executable, script],
        env=env,
        cwd=marked,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(name.startswith("blocked-") for name in os.listdir(marked)):
            assert caller.poll() is None, caller.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "the pool's process never imported the file"
            time.sleep(0.1)
        (blocked,) = [int(n.split("-")[1]) for n in os.listdir(marked) if n.startswith("blocked")]
        pool_processes = _processes(marked)
        assert blocked in pool_processes, pool_processes
        caller.kill()  # kill -9: no atexit, no close_pools
        caller.wait()
        left = _left_after(marked, 5)
        assert not left, f"outlived the caller by 5 s: {left}"
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()


def replicas(strategy):
    """Run in the pools below."""
    return [strategy.num_replicas_in_sync, os.getpid()]


REPLICAS = function_reference(replicas)


def test_a_preloader_started_for_a_pool_outlives_it():
    """Two pools fork from one preloader (an environment of their own gets them a new one,
    started for the first pool); closing the first leaves the second's process running."""
    env = {"TF_TFDIST_POOL_FAULTS": str(os.getpid())}  # a preloader of their own
    first = StrategyPool("local", replicas=2, env=env)
    second = StrategyPool("local", replicas=3, env=env)
    try:
        first.ensure_started()
        second.ensure_started()
        ((_, before),) = [reply.value for reply in second.call("mirrored", REPLICAS)]
        first.close()
        time.sleep(1.0)
        assert second.running, second._lines.tail()
        (reply,) = second.call("mirrored", REPLICAS)
        assert reply.ok and reply.value == [3, before], reply
    finally:
        first.close()
        second.close()


# --------------------------------------------------------------- the pool's socket
def test_clients_with_a_wrong_key_junk_or_nothing_are_refused_and_the_pool_starts(caplog):
    pool = StrategyPool("local", replicas=2)
    failed = []

    def start():
        try:
            pool.start()
        except BaseException as err:  # for the assertion below
            failed.append(err)

    starting = threading.Thread(target=start, daemon=True)
    began = time.monotonic()
    starting.start()
    held = []
    try:
        address = None
        while address is None or not os.path.exists(address):
            assert starting.is_alive() or failed, "start ended before its socket was there"
            assert time.monotonic() - began < 30
            if pool._directory:
                address = os.path.join(pool._directory, "pool.sock")
            time.sleep(0.005)
        from multiprocessing.connection import AuthenticationError, Client

        with pytest.raises(AuthenticationError):
            Client(address, family="AF_UNIX", authkey=b"not the pool's key")
        junk = socket.socket(socket.AF_UNIX)
        junk.connect(address)
        junk.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
        junk.close()
        silent = socket.socket(socket.AF_UNIX)  # connects and says nothing, for as long as
        silent.connect(address)  # the pool starts
        held.append(silent)
        starting.join(timeout=170)
        took = time.monotonic() - began
        assert not failed, failed
        assert not starting.is_alive(), f"the pool did not start in {took:.0f} s"
        (reply,) = pool.call("mirrored", REPLICAS)
        assert reply.ok and reply.value[0] == 2, reply
        refused = [r.getMessage() for r in caplog.records if "refused a connection" in r.message]
        assert len(refused) >= 2, refused
        assert any("AuthenticationError" in message for message in refused), refused
        assert took < 60, took
    finally:
        for sock in held:
            sock.close()
        pool.close()


def test_a_pool_that_cannot_start_raises_its_processes_error():
    """A strategy process that fails at start (0 virtual CPUs): the PoolError says so, with the
    process's own traceback, at once (it used to be a FileNotFoundError of the socket's path,
    with an empty output)."""
    pool = StrategyPool("local", replicas=0)
    began = time.monotonic()
    with pytest.raises(PoolError) as caught:
        pool.start()
    took = time.monotonic() - began
    message = str(caught.value)
    assert "The local strategy pool (worker:0) ended while starting (failed)." in message
    assert "ValueError: virtual_cpus(n) needs a positive integer. Received: n=0." in message
    assert "Traceback (most recent call last)" in message
    assert took < 60, took
    assert not pool.running and pool._directory is None
