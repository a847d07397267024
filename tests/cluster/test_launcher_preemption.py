"""tfdist launch and preemption, with real processes (plain Python, no TensorFlow): a task that
exits with 143 (saved, restart me), the launcher's own SIGTERM and SIGINT, and elastic jobs
(`--workers MIN:MAX`) that lose a worker slot for good and get it back with SIGUSR1.

Each task records "attempt workers index pid" in DIR/attempts.txt: the attempt is numbered by
the order in which the cluster of its TF_CONFIG (fresh ports at every attempt) was first seen.
"""

import io
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tfdist.launcher import JobFailed, launch, plan_job, run_job
from tfdist.launcher import restarts as restarts_module
from tfdist.launcher.outcome import exit_code, failure_message
from tfdist.testing import is_running

from helpers.launcher import _script

HEADER = """
import fcntl, json, os, signal, sys, time
DIR = sys.argv[1]
config = json.loads(os.environ["TF_CONFIG"])
index, workers = config["task"]["index"], len(config["cluster"]["worker"])
with open(os.path.join(DIR, "clusters.txt"), "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    seen = f.read().split()
    key = ",".join(config["cluster"]["worker"])
    if key not in seen:
        f.write(key + "\\n")
        seen.append(key)
attempt = seen.index(key) + 1
with open(os.path.join(DIR, "attempts.txt"), "a") as f:
    f.write(f"{attempt} {workers} {index} {os.getpid()}\\n")


def exists(name):
    return os.path.exists(os.path.join(DIR, name))


def wait_for_peers():  # until every task of this attempt has recorded itself
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with open(os.path.join(DIR, "attempts.txt")) as f:
            if sum(line.split()[0] == str(attempt) for line in f) == workers:
                return
        time.sleep(0.02)


def save_on_sigterm():
    def save(signum, frame):
        open(os.path.join(DIR, f"saved-{attempt}-{index}"), "w").close()
        os._exit(143)

    signal.signal(signal.SIGTERM, save)
"""


def _job(tmp_path, body):
    return _script(tmp_path, HEADER + body)


def _attempts(tmp_path):
    """{attempt: (workers, [indices])} and every pid recorded."""
    attempts, pids = {}, []
    path = tmp_path / "attempts.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        attempt, workers, index, pid = map(int, line.split())
        attempts.setdefault(attempt, (workers, []))[1].append(index)
        pids.append(pid)
    return {a: (w, sorted(i)) for a, (w, i) in attempts.items()}, pids


def _wait_for(condition, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _no_process_left(pids):
    assert pids and not [pid for pid in pids if is_running(pid)]


class _Launcher:
    """`python -m tfdist launch ...` as a subprocess, its output read as it comes."""

    def __init__(self, *argv):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfdist", "launch", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self):
        return "\n".join(self.lines)

    def wait(self, timeout=60):
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:  # SIGTERM: the launcher stops its tasks
                self.proc.terminate()
                self.proc.wait(timeout=60)
        self.reader.join(timeout=10)
        return code


def test_a_preempted_task_restarts_the_job_without_counting_a_restart(tmp_path):
    script = _job(
        tmp_path,
        """
if attempt == 1:
    if index == 1:  # it got SIGTERM: the job saves at the next step, then it exits
        open(os.path.join(DIR, "preempted"), "w").close()
    while not exists("preempted"):
        time.sleep(0.02)
    if index != 1:
        time.sleep(0.3)  # the others follow at that step, a moment later
    print("saved at the agreed step", flush=True)
    sys.exit(143)
print("resumed", flush=True)
""",
    )
    out = io.StringIO()
    started = time.monotonic()
    codes = launch(script, [str(tmp_path)], workers=3, max_restarts=0, grace=20, out=out)
    assert time.monotonic() - started < 15  # the peers were not held for the grace period
    text = out.getvalue()
    assert codes == {"worker:0": 0, "worker:1": 0, "worker:2": 0}, text
    assert (
        "[tfdist] The job was preempted (task worker:1 exited with code 143 first); restarting "
        "it on fresh ports (not counted against --max-restarts; preemption restart 1 of at most "
        "100)." in text
    )
    first = text[: text.index("The job was preempted")]
    for task in ("worker:0", "worker:1", "worker:2"):
        assert f"[tfdist] {task}   preempted (143) " in first
    attempts, pids = _attempts(tmp_path)
    assert attempts == {1: (3, [0, 1, 2]), 2: (3, [0, 1, 2])}
    _no_process_left(pids)


@pytest.mark.parametrize("follows", ["saves when stopped", "does not save"])
def test_a_peer_still_running_after_the_grace_period_is_stopped(tmp_path, follows):
    script = _job(
        tmp_path,
        f"""
if index == 1:
    sys.exit(143)
if {follows == "saves when stopped"}:
    save_on_sigterm()
time.sleep(60)  # never reaches the agreed step by itself
""",
    )
    started = time.monotonic()
    result = run_job(plan_job(script, [str(tmp_path)], workers=2), grace=1.0, quiet=True)
    assert 1.0 <= time.monotonic() - started < 10
    late = result.tasks["worker:0"]
    assert late.stopped and not result.tasks["worker:1"].stopped
    if follows == "saves when stopped":
        assert result.reason == "preempted" and late.returncode == 143
        assert (tmp_path / "saved-1-0").exists()
    else:
        assert result.reason == "failed" and late.returncode == -signal.SIGTERM
        assert failure_message(result, None, grace=1.0).startswith(
            "Task worker:0 was still running 1 s after task worker:1 exited with code 143 "
            "first (preempted), and did not save when it was stopped: it was killed by signal 15."
        )
    _no_process_left(_attempts(tmp_path)[1])


def test_restarts_after_preemptions_are_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(restarts_module, "MAX_PREEMPTION_RESTARTS", 2)
    script = _job(tmp_path, "sys.exit(143)  # whatever happens\n")
    out = io.StringIO()
    result = restarts_module.launch_job(script, [str(tmp_path)], workers=1, quiet=True, out=out)
    assert result.reason == "preempted" and result.returncodes == {"worker:0": 143}
    assert exit_code(result) == 1
    text = out.getvalue()
    assert "(not counted against --max-restarts; preemption restart 2 of at most 2)" in text
    assert "It was restarted 2 times after a preemption already" in text
    assert list(_attempts(tmp_path)[0]) == [1, 2, 3]
    with pytest.raises(JobFailed, match="restarted 2 times after a preemption"):
        launch(script, [str(tmp_path)], workers=1, quiet=True, out=io.StringIO(), check=True)


@pytest.mark.parametrize(
    "signum, saves, code",
    [(signal.SIGTERM, True, 143), (signal.SIGINT, False, 128 + signal.SIGINT)],
    ids=["sigterm-saved", "sigint-not-saved"],
)
def test_the_launchers_own_signal_stops_the_job_without_a_restart(tmp_path, signum, saves, code):
    script = _job(
        tmp_path,
        f"""
if {saves}:
    save_on_sigterm()
time.sleep(60)
""",
    )
    launcher = _Launcher(
        "--workers", "2", "--max-restarts", "3", "--grace", "10", script, str(tmp_path)
    )
    _wait_for(lambda: len(_attempts(tmp_path)[1]) == 2, "the tasks")
    time.sleep(0.3)  # the tasks' handlers are in place
    launcher.proc.send_signal(signum)
    assert launcher.wait() == code, launcher.text
    name = signal.Signals(signum).name
    if saves:
        assert (
            f"[tfdist] The job was interrupted ({name} to the launcher); every task saved and "
            "exited with code 143 (preempted): run the same command again to resume from the "
            "backup." in launcher.lines
        )
        assert {p.name for p in tmp_path.glob("saved-*")} == {"saved-1-0", "saved-1-1"}
    else:
        assert (
            f"[tfdist] The job was interrupted ({name} to the launcher); every task was stopped, "
            "and not every task saved: worker:0 was killed by signal 15, worker:1 was killed by "
            "signal 15." in launcher.lines
        )
    attempts, pids = _attempts(tmp_path)
    assert list(attempts) == [1]  # not restarted
    _no_process_left(pids)


ELASTIC = """
if index >= 2 and exists("bad-slot"):
    wait_for_peers()
    print("this slot is broken", flush=True)
    sys.exit(1)
save_on_sigterm()
while not exists("finish"):
    time.sleep(0.05)
"""


def test_an_elastic_job_loses_a_slot_for_good_and_grows_back_on_sigusr1(tmp_path):
    (tmp_path / "bad-slot").touch()
    script = _job(tmp_path, ELASTIC)
    launcher = _Launcher(
        "--workers", "2:3", "--max-restarts", "1", "--grace", "10", script, str(tmp_path)
    )
    try:
        _wait_for(lambda: _attempts(tmp_path)[0].get(3) == (2, [0, 1]), "2 workers")
        time.sleep(0.3)  # their handlers are in place
        (tmp_path / "bad-slot").unlink()
        launcher.proc.send_signal(signal.SIGUSR1)  # the slot came back
        _wait_for(lambda: _attempts(tmp_path)[0].get(4) == (3, [0, 1, 2]), "3 workers again")
        launcher.proc.send_signal(signal.SIGUSR1)  # one too many: nothing to give back
        _wait_for(lambda: "already runs 3 workers" in launcher.text, "the launcher's note")
        (tmp_path / "finish").touch()
        assert launcher.wait() == 0, launcher.text
    finally:
        launcher.wait()
    text = launcher.text
    assert (
        f"[tfdist] Elastic job (--workers 2:3): starting 3 workers. A worker slot that fails "
        f"more than --max-restarts 1 time is dropped (down to 2 workers); `kill -USR1 "
        f"{launcher.proc.pid}` (this launcher's pid) gives one back." in launcher.lines
    )
    assert "[tfdist] Task worker:2 exited with code 1; the other tasks were stopped." in text
    assert "[tfdist] Restarting the job (1/1 for worker slot 2) on fresh ports." in text
    assert (
        "[tfdist] After 2 failures of worker slot 2, more than --max-restarts 1, the slot is lost "
        "for good: restarting the job with 2 workers on fresh ports (--workers 2:3; not counted "
        "against --max-restarts)." in text
    )
    assert (
        "[tfdist] 1 worker slot came back; restarting the job with 3 workers on fresh ports (not "
        "counted against --max-restarts)." in text
    )
    assert (
        "[tfdist] A worker slot came back, but the job already runs 3 workers (--workers 2:3)."
        in launcher.lines
    )
    attempts, pids = _attempts(tmp_path)
    # each attempt's TF_CONFIG: 3 workers, 3 again (a counted restart), 2 (slot 2 lost), 3
    assert attempts == {1: (3, [0, 1, 2]), 2: (3, [0, 1, 2]), 3: (2, [0, 1]), 4: (3, [0, 1, 2])}
    assert {"saved-3-0", "saved-3-1"} <= {p.name for p in tmp_path.glob("saved-*")}
    _no_process_left(pids)


def test_an_elastic_job_from_python_grows_when_asked_and_stops_below_min(tmp_path):
    (tmp_path / "bad-slot").touch()
    script = _job(tmp_path, ELASTIC.replace("index >= 2", "index >= 1"))
    grow = threading.Event()

    def operator():
        _wait_for(lambda: _attempts(tmp_path)[0].get(2) == (1, [0]), "1 worker")
        (tmp_path / "bad-slot").unlink()
        grow.set()
        _wait_for(lambda: _attempts(tmp_path)[0].get(3) == (2, [0, 1]), "2 workers")
        (tmp_path / "finish").touch()

    helper = threading.Thread(target=operator, daemon=True)
    helper.start()
    out = io.StringIO()
    codes = launch(
        script, [str(tmp_path)], workers=(1, 2), grace=10, grow=grow, out=out, timeout=60
    )
    helper.join(timeout=10)
    assert codes == {"worker:0": 0, "worker:1": 0}, out.getvalue()
    assert "1 worker slot came back; restarting the job with 2 workers" in out.getvalue()
    assert _attempts(tmp_path)[0] == {1: (2, [0, 1]), 2: (1, [0]), 3: (2, [0, 1])}

    # below MIN: with slots 1 and 2 broken, the job cannot go on with 2 of 3 workers
    for name in ("attempts.txt", "clusters.txt", "finish"):
        (tmp_path / name).unlink()
    (tmp_path / "bad-slot").touch()
    with pytest.raises(JobFailed) as caught:
        launch(script, [str(tmp_path)], workers=(2, 3), out=io.StringIO(), check=True)
    # worker:1 or worker:2 failed first in the first attempt; worker:1 then, with 2 workers
    assert re.search(
        r"\nAfter 1 failure of worker slot [12], more than --max-restarts 0, the job stops: it "
        r"cannot go on with fewer than 2 workers \(--workers 2:3\)\.$",
        str(caught.value),
    ), str(caught.value)
    assert caught.value.result.returncodes["worker:1"] == 1
    attempts, pids = _attempts(tmp_path)
    assert attempts == {1: (3, [0, 1, 2]), 2: (2, [0, 1])}
    _no_process_left(pids)
