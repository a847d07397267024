"""tfdist launch without starting anything: the pure planner, the dry run and the CLI's
input checks, the summary and the task reports. Real processes:
tests/cluster/test_launcher_processes.py."""

import json

from tfdist.launcher import plan_job

from helpers.launcher import _script


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


def test_cli_dry_run_and_bad_input(tmp_path, capsys):
    from tfdist.cli import main

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


def test_the_summary_gives_steps_per_second_for_tasks_that_trained():
    from tfdist.launcher.outcome import JobResult, TaskResult, summary

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
        lines[0] == "[tfdist] chief:0    exit 0                           30.0 s  400 steps in "
        "20.0 s, 20.0 steps/s"
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
