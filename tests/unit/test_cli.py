"""The `tfdist` command in process: `main([...])` for `tf-config` (which imports no
TensorFlow) and the usage errors. The real console script: tests/cluster/test_cli_subprocess.py.
"""

import json
import os

import pytest

from tfdist.cli import main
from tfdist.cluster import ClusterSpec

from helpers.cli import SPEC, _parse_export


def _clear_cluster_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("SLURM_", "TFDIST_")):
            monkeypatch.delenv(key)
    monkeypatch.delenv("TF_CONFIG", raising=False)


# ------------------------------------------------------------------- tf-config, in process

CHIEF_SPEC = ClusterSpec.from_hosts(workers=["w1:1"], chief="c:1", task_type="chief")


@pytest.mark.parametrize(
    "argv, spec, tasks",
    [
        pytest.param(
            ["tf-config", "--chief", "h0:2222", "--worker", "h1:2222,h2:2222", "--ps", "h3:2222"],
            SPEC,
            [("chief", 0)],
            id="default-task-the-coordinator",
        ),
        pytest.param(
            [
                "tf-config",
                "--worker",
                "h1:2222",
                "--worker",
                "h2:2222",
                "--chief",
                "h0:2222",
                "--ps",
                "h3:2222",
                "--task",
                "worker:1",
            ],
            SPEC,
            [("worker", 1)],
            id="repeated-flags",
        ),
        pytest.param(
            [
                "tf-config",
                "--chief",
                "h0:2222",
                "--worker",
                "h1:2222,h2:2222",
                "--ps",
                "h3:2222",
                "--task",
                "ps:0",
            ],
            SPEC,
            [("ps", 0)],
            id="ps-task",
        ),
        pytest.param(
            [
                "tf-config",
                "--chief",
                "h0:2222",
                "--worker",
                "h1:2222,h2:2222",
                "--ps",
                "h3:2222",
                "--all",
            ],
            SPEC,
            [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)],
            id="all",
        ),
        pytest.param(
            [
                "tf_config",
                "--chief=h0:2222",
                "--worker",
                "h1:2222,h2:2222",
                "--ps=h3:2222",
                "--all",
            ],
            SPEC,
            [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)],
            id="underscore-alias",
        ),
        pytest.param(
            ["tf-config", "--chief", "c:1", "--worker", "w1:1"],
            CHIEF_SPEC,
            [("chief", 0)],
            id="default-task-chief",
        ),
        pytest.param(
            ["tf-config", "--chief", "c:1", "--worker", "w1:1", "--all"],
            CHIEF_SPEC,
            [("chief", 0), ("worker", 0)],
            id="chief-all",
        ),
    ],
)
@pytest.mark.parametrize("fmt", ["json", "export"])
def test_tf_config_in_process(capsys, argv, spec, tasks, fmt):
    assert main(argv + ["--format", fmt]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    if fmt == "json":
        configs = [json.loads(line) for line in out.splitlines()]
        comments = None
    else:
        entries = _parse_export(out)
        configs = [config for _, config in entries]
        comments = [comment for comment, _ in entries]
    assert configs == [spec.to_tf_config(t, i) for t, i in tasks]
    if comments is not None:
        all_tasks = "--all" in argv
        assert comments == ([f"{t}:{i}" for t, i in tasks] if all_tasks else [None] * len(tasks))


def test_tf_config_reads_the_environment_without_flags(monkeypatch, capsys):
    _clear_cluster_env(monkeypatch)
    spec = ClusterSpec.local(workers=3, task_index=2)
    monkeypatch.setenv("TF_CONFIG", spec.to_json())
    assert main(["tf-config"]) == 0
    assert json.loads(capsys.readouterr().out) == spec.to_tf_config()
    assert main(["tf-config", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [
        spec.to_tf_config("worker", i) for i in range(3)
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--worker", "h1"], "'h1' is not a 'host:port' address", id="no-port"),
        pytest.param(["--worker", "h1:0"], "port '0' in 'h1:0'", id="port-0"),
        pytest.param(
            ["--worker", "h1:2222", "--task", "worker:5"],
            "Task worker:5 is not in the cluster",
            id="task-out-of-range",
        ),
        pytest.param(
            ["--worker", "h1:2222", "--task", "master:0"],
            "Task type 'master' is not a job",
            id="task-type-not-in-cluster",
        ),
        pytest.param(
            ["--ps", "h3:2222"], "A 'ps' job (['h3:2222']) needs a 'worker' job", id="ps-only"
        ),
        pytest.param(
            ["--worker", "h1:2222,h1:2222"], "Address 'h1:2222' is used twice", id="duplicate"
        ),
        pytest.param([], "No cluster: give its tasks", id="no-cluster"),
    ],
)
def test_tf_config_errors_in_process(monkeypatch, capsys, argv, message):
    _clear_cluster_env(monkeypatch)
    assert main(["tf-config"] + argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("tfdist tf-config: error: ")
    assert message in err


def test_tf_config_invalid_tf_config_in_environment(monkeypatch, capsys):
    _clear_cluster_env(monkeypatch)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h1:2222"]}, "task": ')
    assert main(["tf-config"]) == 2
    assert "TF_CONFIG is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(
            ["tf-config", "--worker", "h:1", "--task", "worker"],
            "'worker' is not a task like 'worker:0'",
            id="task-without-index",
        ),
        pytest.param(
            ["tf-config", "--worker", "h:1", "--task", "worker:x"],
            "'worker:x' is not a task like",
            id="task-bad-index",
        ),
        pytest.param(
            ["tf-config", "--worker", "h:1", "--task", "worker:0", "--all"],
            "not allowed with argument",
            id="task-and-all",
        ),
        pytest.param(
            ["tf-config", "--worker", "h:1", "--format", "yaml"],
            "invalid choice: 'yaml'",
            id="bad-format",
        ),
        pytest.param([], "required", id="no-command"),
        pytest.param(["frobnicate"], "invalid choice: 'frobnicate'", id="unknown-command"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------- launch --gradient-compression


def test_launch_takes_the_gradient_compression_vocabulary():
    from tfdist.cli import build_parser

    args = build_parser().parse_args(["launch", "--gradient-compression", "bf16", "train.py"])
    assert args.gradient_compression == "bf16"
    assert build_parser().parse_args(["launch", "train.py"]).gradient_compression is None


def test_launch_refuses_an_unknown_gradient_compression(capsys):
    from tfdist.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["launch", "--gradient-compression", "int8", "train.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'int8'" in err and "bf16" in err and "fp16" in err


# ------------------------------------------------------------------- launch --communication


def test_launch_communication_sets_the_variable_every_task_reads():
    from tfdist.cli import build_parser
    from tfdist.cli.launch import _extra_env

    args = build_parser().parse_args(["launch", "--communication", "gloo", "train.py"])
    assert _extra_env(args) == {"TFDIST_COMMUNICATION": "gloo"}
    assert _extra_env(build_parser().parse_args(["launch", "train.py"])) is None


def test_launch_refuses_a_communication_multi_worker_mirrored_does_not_take(capsys):
    from tfdist.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["launch", "--communication", "mpi", "train.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'mpi'" in err and "gloo" in err and "ring" in err


@pytest.mark.parametrize("value", ["5:5", "a:b", "-1:3", "7"])
def test_launch_refuses_a_profile_that_is_no_range_of_steps(value, capsys):
    with pytest.raises(SystemExit):
        main(["launch", f"--profile={value}", "--workers", "1", "train.py"])
    err = capsys.readouterr().err
    assert "--profile must be START:END" in err and repr(value) in err and "HINT" in err
