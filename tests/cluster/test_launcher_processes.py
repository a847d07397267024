"""tfdist launch with real processes (plain Python, no TensorFlow) for the supervision
rules: prefixed output, first failure stops all, timeouts, signals, restarts."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tfdist.launcher import JobFailed, launch, plan_job, run_job
from tfdist.testing import is_running

from helpers.launcher import _script


def test_output_is_prefixed_whole_lines_and_logged(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, time
        task = os.environ["TFDIST_TASK"]
        for i in range(50):
            sys.stdout.write(f"part-{task}-")   # a partial line, flushed ...
            sys.stdout.flush()
            time.sleep(0.001)
            sys.stdout.write(f"{i}\\n")         # ... completed later
            sys.stdout.flush()
        print("to stderr", file=sys.stderr)
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=2, out=out, log_dir=str(tmp_path / "logs"))
    assert codes == {"worker:0": 0, "worker:1": 0}
    lines = out.getvalue().splitlines()
    assert [line.split()[:4] for line in lines[-2:]] == [
        ["[tfdist]", "worker:0", "exit", "0"],
        ["[tfdist]", "worker:1", "exit", "0"],
    ]
    for task in ("worker:0", "worker:1"):
        mine = [line for line in lines if line.startswith(f"[{task}] ")]
        assert mine[:50] == [f"[{task}] part-{task}-{i}" for i in range(50)]
        assert f"[{task}] to stderr" in mine
        log = (tmp_path / "logs" / f"{task.replace(':', '-')}.log").read_text().splitlines()
        assert log[:50] == [f"part-{task}-{i}" for i in range(50)]


def test_first_failure_stops_every_task_and_names_the_task(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, time
        if os.environ["TFDIST_TASK"] == "worker:1":
            print("loading data"); print("something broke")
            sys.exit(3)
        time.sleep(120)
    """,
    )
    out = io.StringIO()
    started = time.monotonic()
    codes = launch(script, workers=2, out=out)
    assert time.monotonic() - started < 30
    assert codes["worker:1"] == 3
    assert codes["worker:0"] == -signal.SIGTERM
    assert (
        "[tfdist] Task worker:1 exited with code 3; the other tasks were stopped. "
        "Its last lines:\nloading data\nsomething broke" in out.getvalue()
    )
    with pytest.raises(JobFailed, match="Task worker:1 exited with code 3"):
        launch(script, workers=2, out=io.StringIO(), check=True)


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, signal, sys, time
        if os.environ["TFDIST_TASK"] == "worker:1":
            time.sleep(0.5); sys.exit(1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(120)
    """,
    )
    started = time.monotonic()
    result = run_job(plan_job(script, workers=2), grace=2.0, quiet=True)
    assert time.monotonic() - started < 30
    assert result.reason == "failed"
    assert result.tasks["worker:0"].returncode == -signal.SIGKILL
    assert result.tasks["worker:0"].stopped


def test_timeout_stops_the_job(tmp_path):
    script = _script(tmp_path, "import time; time.sleep(120)\n")
    out = io.StringIO()
    started = time.monotonic()
    codes = launch(script, workers=2, timeout=2, out=out)
    assert time.monotonic() - started < 20
    assert set(codes.values()) == {-signal.SIGTERM}
    assert "did not finish within --timeout 2 s" in out.getvalue()


def test_restarts_run_the_whole_job_again_on_fresh_ports(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import json, os, sys
        task = os.environ["TFDIST_TASK"]
        with open(os.path.join({str(tmp_path)!r}, "configs.txt"), "a") as f:
            f.write(os.environ["TF_CONFIG"] + "\\n")
        marker = os.path.join({str(tmp_path)!r}, "failed-once")
        if task == "worker:1" and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), 9)
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=2, max_restarts=1, out=out)
    assert codes == {"worker:0": 0, "worker:1": 0}
    assert "Task worker:1 was killed by signal 9" in out.getvalue()
    assert "Restarting the job (1/1) on fresh ports" in out.getvalue()
    configs = [json.loads(line) for line in (tmp_path / "configs.txt").read_text().splitlines()]
    attempts = {tuple(c["cluster"]["worker"]) for c in configs}
    assert len(attempts) == 2
    first, second = attempts
    assert not set(first) & set(second)
    os.remove(tmp_path / "failed-once")
    assert launch(script, workers=2, max_restarts=0, out=io.StringIO())["worker:1"] == -9


def test_sigterm_to_the_launcher_leaves_no_orphans(tmp_path):
    script = _script(
        tmp_path,
        f"""
        import os, subprocess, sys, time
        task = os.environ["TFDIST_TASK"].replace(":", "-")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(os.path.join({str(tmp_path)!r}, task + ".pids"), "w") as f:
            f.write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(120)
    """,
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", "--workers", "2", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.pids"))) < 2:
        assert time.monotonic() < deadline, "the tasks did not start"
        time.sleep(0.1)
    time.sleep(0.3)
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=30) == 128 + signal.SIGTERM  # and the tasks did not save:
    assert (
        b"The job was interrupted (SIGTERM to the launcher); every task was stopped, and not "
        b"every task saved: worker:0 was killed by signal 15, worker:1 was killed by signal 15."
        in launcher.stdout.read()
    )
    assert len(pids) == 4
    assert not [pid for pid in pids if is_running(pid)]  # neither the tasks nor what they started


@pytest.mark.slow
def test_parameter_server_job_servers_stop_when_the_chief_is_done(tmp_path):
    script = _script(
        tmp_path,
        """
        import json, os
        config = json.loads(os.environ["TF_CONFIG"])
        print("chief runs the script as", config["task"])
    """,
    )
    out = io.StringIO()
    codes = launch(script, workers=1, ps=1, out=out, timeout=120)
    assert codes == {"chief:0": 0, "worker:0": 0, "ps:0": 0}
    text = out.getvalue()
    assert "[tfdist] ps:0       served until the job ended" in text
    assert "[chief:0] chief runs the script as {'type': 'chief', 'index': 0}" in text
    assert "[worker:0] chief runs" not in text and "[ps:0] chief runs" not in text
