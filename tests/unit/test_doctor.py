"""tfdist doctor: the checks it can make without running anything (the real smoke test:
tests/cluster/test_doctor_smoke.py)."""

import pytest

from tfdist.cli.doctor import diagnose, scenario_outcomes, smoke_verdict
from tfdist.launcher import JobResult, TaskResult


def test_diagnose_recognises_shell_settings_with_their_fixes():
    assert diagnose({}, ["/cpu:0"]) == []
    [problem] = diagnose({"TF_CONFIG": '{"cluster": {}}'}, ["/cpu:0"])
    assert problem.startswith("TF_CONFIG is set in this shell") and "unset TF_CONFIG" in problem
    [problem] = diagnose({"TFDIST_COMMUNICATION": "NCCL"}, ["/cpu:0", "/cpu:1"])
    assert "no GPU (replicas: ['/cpu:0', '/cpu:1'])" in problem and "use ring" in problem
    assert diagnose({"TFDIST_COMMUNICATION": "nccl"}, ["/gpu:0"]) == []


def _job(reason, *outputs):
    return JobResult(
        reason,
        {
            f"worker:{i}": TaskResult(f"worker:{i}", 0, list(lines), 1.0)
            for i, lines in enumerate(outputs)
        },
    )


@pytest.mark.parametrize(
    "job, expected",
    [
        (_job("done", ["SMOKE allreduce=3", "SMOKE fit_steps=3"]), []),
        (_job("timeout", []), ["no result in time. HINT: a firewall or a blocked loopback port"]),
        (
            _job("failed", ["RuntimeError: Task worker:0 could not form the multi-worker cluster"]),
            ["could not meet on loopback. HINT: a blocked port or a proxy"],
        ),
        (_job("failed", ["SMOKE allreduce=2"]), ["the all-reduce did not give 1 + 2 = 3"]),
        (
            _job("failed", ["SMOKE allreduce=3", "ValueError: boom"]),
            [
                "the 3-step multi-worker fit failed. Last lines:\n"
                "SMOKE allreduce=3\nValueError: boom"
            ],
        ),
    ],
)
def test_smoke_verdicts(job, expected):
    _check_verdict(job, expected)


def test_a_failed_scenario_names_the_fixes_that_cover_it():
    lines = [
        "SMOKE allreduce=3",
        "SMOKE fit_steps=3",
        "SMOKE scenario:fit_on_a_dataset=ok",
        "SMOKE scenario:steps_per_execution=FAILED InvalidArgumentError: boom",
    ]
    _check_verdict(
        _job("done", lines),
        [
            "the scenario steps_per_execution failed: FAILED InvalidArgumentError: boom. The "
            "fixes that cover it: multi_worker_steps_per_execution (`tfdist env` shows"
        ],
    )
    assert scenario_outcomes(lines) == {
        "fit_on_a_dataset": "ok",
        "steps_per_execution": "FAILED InvalidArgumentError: boom",
    }


def _check_verdict(job, expected):
    failures = smoke_verdict(job)
    assert len(failures) == len(expected)
    for failure, text in zip(failures, expected):
        assert text in failure


def test_the_nccl_check_runs_on_two_gpus_or_more_and_says_what_it_found():
    from tfdist.cli.doctor import nccl_arguments, nccl_line

    assert nccl_arguments(["/cpu:0", "/cpu:1"]) is None
    assert nccl_arguments(["/gpu:0"]) is None
    assert nccl_arguments(["/gpu:0", "/gpu:1"]) == []
    assert nccl_line(["/cpu:0"], None) == (
        "skipped  NCCL all-reduce: it needs 2 GPUs, and TensorFlow sees 0"
    )
    assert nccl_line(["/gpu:0"], None).endswith("sees 1 (one GPU trains without all-reduce)")
    gpus = ["/gpu:0", "/gpu:1"]
    ok = {"outcome": "ok", "devices": gpus, "bus_gb_per_s": 81.5}
    assert nccl_line(gpus, ok) == (
        "OK       NCCL all-reduce between 2 GPUs: exact sums, 81.5 GB/s bus bandwidth on 64 MiB"
    )
    failed = nccl_line(gpus, {"outcome": "timeout", "error": "no result in 120 s"})
    assert failed.startswith("FAILED   NCCL all-reduce between 2 GPUs: no result in 120 s. HINT")
    assert "NCCL_DEBUG=INFO" in failed and "TFDIST_COMMUNICATION=ring" in failed


def test_the_smoke_job_gives_each_worker_its_own_gpu_or_runs_on_cpus():
    from tfdist.cli.doctor import smoke_gpus

    assert smoke_gpus([]) == {}
    assert smoke_gpus(["0"]) == {"extra_env": {"CUDA_VISIBLE_DEVICES": ""}}
    assert smoke_gpus(["3", "5"]) == {"gpus_per_worker": "auto", "visible_gpus": ["3", "5"]}
