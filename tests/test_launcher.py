"""tfdist launch: the pure planner, and real processes (plain Python, no TensorFlow) for the
supervision rules: prefixed output, first failure stops all, timeouts, signals, restarts."""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfdist.launcher import JobFailed, launch, plan_job, run_job
from tfdist.testing import is_running


def _script(tmp_path, body, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_plan_multi_worker_job_runs_the_script_on_every_worker():
    plans = plan_job("train.py", ["--epochs", "2"], workers=3, python="py")
    assert [p.task for p in plans] == ["worker:0", "worker:1", "worker:2"]
    configs = [json.loads(p.env["TF_CONFIG"]) for p in plans]
    addresses = configs[0]["cluster"]["worker"]
    assert len(set(addresses)) == 3 and all(a.startswith("127.0.0.1:") for a in addresses)
    for i, (plan, config) in enumerate(zip(plans, configs)):
        assert plan.argv == ("py", "train.py", "--epochs", "2")
        assert config == {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
        assert plan.env["TFDIST_TASK"] == f"worker:{i}" and not plan.serves


def test_plan_parameter_server_job_serves_on_workers_and_ps_and_trains_on_the_chief():
    plans = plan_job(
        "pkg.train",
        workers=2,
        ps=1,
        module=True,
        python="py",
        extra_env={"TFDIST_STRATEGY": "parameter_server"},
    )
    by_task = {p.task: p for p in plans}
    assert list(by_task) == ["chief:0", "worker:0", "worker:1", "ps:0"]
    assert by_task["chief:0"].argv == ("py", "-m", "pkg.train") and not by_task["chief:0"].serves
    for task in ("worker:0", "worker:1", "ps:0"):
        assert by_task[task].argv == ("py", "-m", "tfdist", "serve") and by_task[task].serves
    assert all(p.env["TFDIST_STRATEGY"] == "parameter_server" for p in plans)
    cluster = json.loads(by_task["ps:0"].env["TF_CONFIG"])["cluster"]
    assert [len(cluster[j]) for j in ("chief", "worker", "ps")] == [1, 2, 1]


def test_two_plans_never_share_a_port():
    ports = []
    for _ in range(2):
        for plan in plan_job("x.py", workers=2, ps=1):
            task = json.loads(plan.env["TF_CONFIG"])["task"]
            cluster = json.loads(plan.env["TF_CONFIG"])["cluster"]
            ports.append(cluster[task["type"]][task["index"]])
    assert len(ports) == len(set(ports)) == 8


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
    assert launcher.wait(timeout=30) == 1
    assert b"The job was interrupted; every task was stopped." in launcher.stdout.read()
    assert len(pids) == 4
    assert not [pid for pid in pids if is_running(pid)]  # neither the tasks nor what they started


def test_cli_dry_run_and_bad_input(tmp_path, capsys):
    from tfdist.launcher.cli import main

    script = _script(tmp_path, "print('hi')\n")
    assert (
        main(
            [
                "launch",
                "--workers",
                "2",
                "--strategy",
                "mirrored",
                "--dry_run",
                script,
                "--lr",
                "0.1",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("[worker:0] ") and lines[0].endswith(f"{script} --lr 0.1")
    assert "TFDIST_STRATEGY='mirrored'" in lines[0] and "TF_CONFIG='{" in lines[1]
    assert main(["launch", "missing.py"]) == 2
    assert "script 'missing.py' does not exist" in capsys.readouterr().err
    assert main(["launch", "--workers", "0", script]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


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


def test_the_summary_gives_steps_per_second_for_tasks_that_trained():
    from tfdist.launcher.job import JobResult, TaskResult, summary

    result = JobResult(
        "done",
        {
            "chief:0": TaskResult("chief:0", 0, [], 30.0, steps=400, train_seconds=20.0),
            "worker:0": TaskResult("worker:0", -15, [], 31.0, stopped=True),
            "worker:1": TaskResult("worker:1", 0, [], 2.0, steps=0, train_seconds=1.0),
        },
    )
    lines = summary(result).splitlines()
    assert (
        lines[0] == "[tfdist] chief:0    exit 0                           30.0 s  400 steps, "
        "20.0 steps/s"
    )
    assert lines[1] == "[tfdist] worker:0   served until the job ended       31.0 s"
    assert lines[2] == "[tfdist] worker:1   exit 0                            2.0 s"  # no steps


def test_a_report_is_read_only_when_a_fit_ended(tmp_path):
    from tfdist import training_report as _report

    path = tmp_path / "task.json"
    assert _report.read(str(path)) is None  # never written (a server, a script without fit)
    path.write_text('{"steps": 12, "seconds": 3.0, "fits": 1}')
    assert _report.read(str(path)) == {"steps": 12, "seconds": 3.0, "fits": 1}
    path.write_text('{"steps": 12, "seco')  # cut short
    assert _report.read(str(path)) is None
