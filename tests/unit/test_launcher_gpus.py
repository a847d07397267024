"""Which GPUs each task of a local job sees (tfdist/gpus.py), on simulated GPU lists:
the assignment, the refusals before anything starts, memory growth, and the `tfdist launch` /
`tfdist horovodrun` flags. Real processes: tests/cluster/test_launcher_gpus_jobs.py."""

import stat

import pytest

import tfdist
from tfdist import gpus
from tfdist.cli import build_parser, main
from tfdist.horovod import run
from tfdist.launcher import plan_job, restarts
from tfdist.launcher.outcome import JobResult

WORKERS_2 = [("worker", 0), ("worker", 1)]


@pytest.fixture
def planned(monkeypatch):
    """Each task's environment that `tfdist.launch` / `tfdist horovodrun` would start it with
    ({task: env}, one per attempt), on simulated GPUs; no process is started."""
    jobs = []

    def run_job(plans, **_):
        jobs.append({plan.task: plan.env for plan in plans})
        return JobResult("done", {})

    monkeypatch.setattr(restarts, "run_job", run_job)
    for name in ("CUDA_VISIBLE_DEVICES", "TFDIST_COMMUNICATION", "TF_FORCE_GPU_ALLOW_GROWTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TFDIST_GPU_MEMORY_GROWTH", raising=False)
    return jobs


def _gpu_variables(env):
    names = ("CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "TFDIST_COMMUNICATION")
    return {name: env[name] for name in names if name in env}


def test_visible_gpus_come_from_the_simulation_then_cuda_visible_devices_then_nvidia_smi(
    tmp_path, monkeypatch
):
    assert gpus.visible({"TFDIST_GPUS": "3", "CUDA_VISIBLE_DEVICES": "5"}) == ["0", "1", "2"]
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "4, 2,GPU-8e1f"}) == ["4", "2", "GPU-8e1f"]
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpus.visible({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]  # CUDA stops at -1
    assert gpus.visible({"TFDIST_GPUS": "0"}) == []
    with pytest.raises(ValueError, match=r"TFDIST_GPUS must be a non-negative integer.*'two'"):
        gpus.visible({"TFDIST_GPUS": "two"})
    # neither set: what nvidia-smi lists (a stand-in on PATH), none without it
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.visible({}) == ["0", "1"]
    plan = gpus.plan(WORKERS_2, 0, env={})
    assert plan["worker:1"] == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert gpus.visible({}) == []
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpus.visible({}) == []


@pytest.mark.parametrize(
    "tasks, ps, found, per, evaluator, expected",
    [
        pytest.param(WORKERS_2, 0, "0123", "auto", 0, {"worker:0": "0,1", "worker:1": "2,3"}),
        pytest.param(WORKERS_2, 0, "0123", 1, 0, {"worker:0": "0", "worker:1": "1"}),
        pytest.param(
            [("chief", 0), ("worker", 0), ("evaluator", 0)],
            0,
            "0123",
            "auto",
            1,
            {"chief:0": "0", "worker:0": "1", "evaluator:0": "3"},
            id="the chief trains; the evaluator's GPU is the last",
        ),
        pytest.param(
            [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)],
            1,
            "01",
            "auto",
            0,
            {"chief:0": "", "worker:0": "0", "worker:1": "1", "ps:0": ""},
            id="a ps job's chief coordinates: no GPU, nor for the ps",
        ),
        pytest.param(
            WORKERS_2 + [("evaluator", 0)],
            0,
            "01",
            "shared",
            0,
            {"worker:0": "0,1", "worker:1": "0,1", "evaluator:0": ""},
        ),
        pytest.param(WORKERS_2, 0, "", "auto", 0, {"worker:0": None, "worker:1": None}),
    ],
)
def test_each_training_task_gets_its_own_gpus_in_order(tasks, ps, found, per, evaluator, expected):
    assert gpus.assign(tasks, ps, list(found), per, evaluator) == expected


@pytest.mark.parametrize(
    "tasks, found, per, evaluator, says",
    [
        (WORKERS_2 + [("worker", 2)], "01", "auto", 0, r"3 training task\(s\) with 1 GPU"),
        (WORKERS_2, "0123", 3, 0, r"with 3 GPU\(s\) each need 6 GPU\(s\).*4 GPU\(s\) \(0,1,2,3\)"),
        (WORKERS_2, "01", "auto", 1, r"and 1 for the evaluator need 3"),
        (WORKERS_2, "", 1, 0, r"was given no GPU"),
    ],
)
def test_too_few_gpus_is_refused_naming_what_was_seen_and_the_fix(
    tasks, found, per, evaluator, says
):
    with pytest.raises(gpus.GpuError, match=says) as refused:
        gpus.assign(tasks, 0, list(found), per, evaluator)
    assert "HINT: --workers gpu" in str(refused.value) and "shared" in str(refused.value)


def test_gpus_per_worker_values():
    assert [gpus.per_worker(v) for v in ("auto", " Shared ", "2", 3)] == ["auto", "shared", 2, 3]
    for bad in ("0", "-1", "1.5", "all", True):
        with pytest.raises(gpus.GpuError, match=r"whole number >= 1, 'auto' or 'shared'"):
            gpus.per_worker(bad)


def test_one_worker_per_gpu_or_per_k_gpus():
    assert gpus.worker_count(list("0123")) == 4
    assert gpus.worker_count(list("0123"), 2) == 2
    assert gpus.worker_count(list("01234"), 2, evaluator_gpus=1) == 2
    with pytest.raises(gpus.GpuError, match=r"was given no GPU.*--workers 2"):
        gpus.worker_count([])


def test_tasks_that_share_gpus_take_only_the_memory_they_use():
    env = {"TFDIST_GPUS": "2"}
    shared = gpus.plan(WORKERS_2, 0, "shared", env=env)
    assert shared["worker:0"] == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "TFDIST_COMMUNICATION": "ring",  # NCCL refuses two ranks on one GPU
    }
    own = gpus.plan(WORKERS_2, 0, "auto", env=env)
    assert own == {
        "worker:0": {"CUDA_VISIBLE_DEVICES": "0"},
        "worker:1": {"CUDA_VISIBLE_DEVICES": "1"},
    }
    alone = gpus.plan([("worker", 0)], 0, "shared", env=env)  # nobody to share with
    assert alone == {"worker:0": {"CUDA_VISIBLE_DEVICES": "0,1"}}
    off = gpus.plan(WORKERS_2, 0, "shared", env=dict(env, TFDIST_GPU_MEMORY_GROWTH="0"))
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in off["worker:1"]
    theirs = gpus.plan(WORKERS_2, 0, "shared", env=dict(env, TF_FORCE_GPU_ALLOW_GROWTH="false"))
    assert theirs["worker:1"]["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert "CUDA_DEVICE_ORDER" not in shared["worker:0"]  # the simulation's ids are not PCI ids
    nccl = gpus.plan(WORKERS_2, 0, "shared", env=dict(env, TFDIST_COMMUNICATION="nccl"))
    assert nccl["worker:0"]["TFDIST_COMMUNICATION"] == "nccl"  # the caller's own choice


def test_plan_job_hands_out_the_gpus_only_when_asked():
    plans = plan_job("train.py", workers=2, gpus_per_worker="auto", visible_gpus=["3", "7"])
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["3", "7"]
    assert all("CUDA_VISIBLE_DEVICES" not in p.env for p in plan_job("train.py", workers=2))
    theirs = plan_job(
        "train.py",
        workers=2,
        gpus_per_worker=1,
        visible_gpus=["0", "1"],
        extra_env={"CUDA_VISIBLE_DEVICES": "5"},
    )
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in theirs] == ["5", "5"]  # extra_env wins


def test_launch_flags_hand_out_the_gpus_and_refuse_before_starting(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    ran = tmp_path / "ran"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    monkeypatch.setenv("TFDIST_GPUS", "4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert (
        main(["launch", "--workers", "gpu", "--gpus-per-worker", "2", "--dry-run", str(script)])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("CUDA_VISIBLE_DEVICES=")[1].split()[0] for line in lines] == [
        "'0,1'",
        "'2,3'",
    ]
    assert main(["launch", "--workers", "5", str(script)]) == 2
    err = capsys.readouterr().err
    assert "5 training task(s) with 1 GPU(s) each need 5 GPU(s)" in err and "0,1,2,3" in err
    assert not ran.exists()  # refused before any task started
    with pytest.raises(SystemExit):
        main(["launch", "--gpus-per-worker", "0", str(script)])
    assert "whole number >= 1" in capsys.readouterr().err
    assert main(["launch", "--evaluator-gpus", "1", str(script)]) == 2
    assert "needs an evaluator task" in capsys.readouterr().err
    monkeypatch.setenv("TFDIST_GPUS", "0")
    assert main(["launch", "--workers", "gpu", str(script)]) == 2
    assert "--workers gpu starts one worker per 1 GPU(s)" in capsys.readouterr().err
    assert main(["horovodrun", "-np", "gpu", "python", str(script)]) == 2
    assert "-np gpu starts one process per GPU" in capsys.readouterr().err


def test_the_driver_s_gpus_are_described_even_where_it_predates_compute_cap(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        'case "$*" in *compute_cap*) echo "Field compute_cap is not a valid field" >&2; exit 2;; '
        "esac\nprintf '0, Tesla K80, 11441\\n1, Tesla K80, [N/A]\\n'\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.describe() == [
        {"index": 0, "name": "Tesla K80", "memory_mib": 11441, "compute_capability": None},
        {"index": 1, "name": "Tesla K80", "memory_mib": None, "compute_capability": None},
    ]
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpus.describe() == []


def test_tasks_that_see_the_same_gpus_take_their_share_by_local_rank():
    assert gpus.share(4, tasks=2, local=0) == ([0, 1], False)
    assert gpus.share(4, tasks=2, local=1) == ([2, 3], False)
    assert gpus.share(4, tasks=3, local=2) == ([2], False)  # 1 each, GPU 3 idle
    assert gpus.share(1, tasks=2, local=1) == ([0], True)  # 2 tasks, 1 GPU: shared, grown


def test_launch_workers_gpu_from_python_gives_each_worker_its_own_gpu(planned, monkeypatch):
    monkeypatch.setenv("TFDIST_GPUS", "3")
    assert tfdist.launch("train.py", workers="gpu", quiet=True) == {}
    assert [{t: _gpu_variables(e) for t, e in job.items()} for job in planned] == [
        {f"worker:{i}": {"CUDA_VISIBLE_DEVICES": str(i)} for i in range(3)}
    ]
    monkeypatch.setenv("TFDIST_GPUS", "4")
    tfdist.launch("train.py", workers="gpu", gpus_per_worker=2, quiet=True)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in planned[-1].values()] == ["0,1", "2,3"]
    with pytest.raises(gpus.GpuError, match=r"5 training task\(s\).*4 GPU\(s\) \(0,1,2,3\)"):
        tfdist.launch("train.py", workers=5, quiet=True)
    assert len(planned) == 2  # refused before any task started


def _horovodrun(argv):
    return build_parser().parse_args(["horovodrun", *argv])


def test_horovodrun_np_gpu_starts_one_process_per_gpu_that_keeps_nccl(
    planned, monkeypatch, tmp_path
):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setenv("TFDIST_GPUS", "2")
    assert main(["horovodrun", "-np", "gpu", "python", str(script)]) == 0
    # every process sees every GPU, pins its own in hvd.init() and grows its memory; each
    # has a GPU of its own, so nothing pushes make_strategy() off NCCL (no TFDIST_COMMUNICATION)
    assert {task: _gpu_variables(env) for task, env in planned[0].items()} == {
        f"worker:{i}": {"CUDA_VISIBLE_DEVICES": "0,1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
        for i in range(2)
    }
    assert all(env["TFDIST_HOROVOD_SHIM"] == "1" for env in planned[0].values())
    monkeypatch.setenv("TFDIST_COMMUNICATION", "ring")  # the caller's own choice is theirs
    launch = run.launch_settings(_horovodrun(["-np", "2", "python", str(script)]))
    plans = plan_job(launch["target"], workers=2, gpus_per_worker=launch["gpus_per_worker"])
    assert [p.env.get("TFDIST_COMMUNICATION") for p in plans] == [None, None]  # inherited
    monkeypatch.setenv("TFDIST_GPU_MEMORY_GROWTH", "0")
    plans = plan_job(launch["target"], workers=2, gpus_per_worker=launch["gpus_per_worker"])
    assert all("TF_FORCE_GPU_ALLOW_GROWTH" not in p.env for p in plans)


def test_horovodrun_refuses_more_processes_than_gpus_before_any_starts(
    planned, monkeypatch, tmp_path, capsys
):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setenv("TFDIST_GPUS", "2")
    with pytest.raises(run.HorovodrunError) as refused:
        run.launch_settings(_horovodrun(["-np", "3", "python", str(script)]))
    message = str(refused.value)
    assert "-np 3: 3 processes each pin one GPU" in message
    assert "was given 2 GPU(s) (0,1)" in message and "HINT:" in message and "-np 2" in message
    assert main(["horovodrun", "-np", "3", "-H", "localhost:3", "python", str(script)]) == 2
    assert "was given 2 GPU(s) (0,1)" in capsys.readouterr().err
    assert planned == []  # no process was started
    monkeypatch.setenv("TFDIST_GPUS", "0")  # a host without GPUs: any number, on the CPUs
    assert run.launch_settings(_horovodrun(["-np", "3", "python", str(script)]))["workers"] == 3
    with pytest.raises(gpus.GpuError, match=r"3 processes each pin one GPU"):
        gpus.assign([("worker", i) for i in range(3)], 0, ["0", "1"], gpus.PINNED)


def test_pinned_is_not_a_spelling_users_give():
    assert gpus.per_worker(gpus.PINNED) is gpus.PINNED
    with pytest.raises(gpus.GpuError, match=r"Received: 'pinned'"):
        gpus.per_worker("pinned")


def test_each_node_of_a_multi_node_job_hands_its_own_gpus_to_its_own_tasks():
    """`tfdist launch --nodes 2 --workers-per-node gpu` on hosts of 2 GPUs each: node 1 runs
    worker:2 and worker:3 of the job's cluster, on its GPUs 0 and 1."""
    from tfdist.cluster import ClusterSpec

    cluster = ClusterSpec({"worker": ["10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1", "10.0.0.2:2"]})
    count = gpus.worker_count(["0", "1"], gpus.per_worker("auto"))
    plans = plan_job(
        "train.py",
        cluster=cluster,
        only=["worker:2", "worker:3"],
        gpus_per_worker=gpus.per_worker("auto"),
        visible_gpus=["0", "1"],
    )
    assert count == 2
    assert [(p.task, p.env["CUDA_VISIBLE_DEVICES"]) for p in plans] == [
        ("worker:2", "0"),
        ("worker:3", "1"),
    ]
    import json

    assert [json.loads(p.env["TF_CONFIG"])["task"]["index"] for p in plans] == [2, 3]
