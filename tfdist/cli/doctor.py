"""`tfdist doctor`: the `tfdist env` report, the problems it shows, and a real smoke test.

Where TensorFlow sees two GPUs or more, the doctor first all-reduces between them through NCCL
in a process of its own (`tfdist.cli.nccl_check`, bounded). The smoke test is a 2-worker job on
loopback (`tfdist.launcher.smoke_job`): an all-reduce, a
3-step multi-worker fit, then scenarios that exercise tfdist's fixes. `diagnose` and
`smoke_verdict` turn what they find into problems and failures, each with its fix.
"""

from __future__ import annotations

import os
from typing import List, Mapping, Optional, Sequence

from tfdist import settings
from tfdist.cli import nccl_check
from tfdist.cli.arguments import seconds
from tfdist.cli.environment import environment_report, print_report

# The doctor's scenarios (tfdist/launcher/smoke_job.py), in the order it runs them, and the fixes
# each one exercises. What the doctor says it runs (its header, the README) is made from this.
SCENARIO_FIXES = {
    "fit_on_a_dataset": (
        "symbolic_build_from_a_local_batch",
        "multi_worker_mean_of_metric_results",
    ),
    "steps_per_execution": ("multi_worker_steps_per_execution",),
    "checkpoints_and_backup": ("multi_worker_checkpoint_callbacks",),
    "dropout_masks_per_worker": ("different_random_draws_per_replica",),
}


def smoke_test_header() -> str:
    """The line that says what the smoke test runs, from SCENARIO_FIXES."""
    fixes = {fix for covered in SCENARIO_FIXES.values() for fix in covered}
    return (
        "-- smoke test: 2 workers on loopback (all-reduce, a 3-step fit, then "
        f"{len(SCENARIO_FIXES)} multi-worker scenarios that exercise {len(fixes)} of the fixes)"
    )


def scenario_line(scenario: str, outcome: str) -> str:
    """The doctor's line for one scenario's outcome ("ok" or "FAILED ...")."""
    return f"{'ok' if outcome == 'ok' else 'FAILED':8} scenario {scenario}"


def add_commands(sub) -> None:
    """Adds `doctor` to the subparsers `sub`."""
    doc = sub.add_parser("doctor", help="environment report plus a real 2-process smoke test")
    doc.add_argument(
        "--timeout", type=seconds, default=180.0, help="seconds for the smoke test (default 180)"
    )


def diagnose(env: Mapping[str, str], devices: Sequence[str]) -> List[str]:
    """Problems tfdist can recognise before running anything, each with its fix."""
    problems = []
    if env.get("TF_CONFIG", "").strip():
        problems.append(
            "TF_CONFIG is set in this shell, so every TensorFlow program started here joins "
            "that cluster (and waits for its peers). HINT: `unset TF_CONFIG` for local runs; "
            "`tfdist launch` sets it per task."
        )
    if settings.COMMUNICATION.get(env) == "nccl" and not any("gpu" in d.lower() for d in devices):
        problems.append(
            f"{settings.COMMUNICATION.name}=nccl, but this host has no GPU (replicas: "
            f"{list(devices)}). HINT: unset it or use ring; NCCL needs every replica on a GPU."
        )
    return problems


def nccl_arguments(devices: Sequence[str]) -> Optional[List[str]]:
    """The arguments of the doctor's NCCL check (`tfdist.cli.nccl_check`) for the replica
    `devices`: every GPU, where there are two or more; None (no check) otherwise."""
    gpus = [d for d in devices if "gpu" in d.lower()]
    return [] if len(gpus) >= 2 else None


def nccl_line(devices: Sequence[str], result: Optional[dict]) -> str:
    """The doctor's line for the NCCL check's `result` (None: not run)."""
    gpus = [d for d in devices if "gpu" in d.lower()]
    if result is None:
        return (
            f"{'skipped':8} NCCL all-reduce: it needs 2 GPUs, and TensorFlow sees {len(gpus)}"
            + (" (one GPU trains without all-reduce)" if len(gpus) == 1 else "")
        )
    if result["outcome"] == "ok":
        return (
            f"{'OK':8} NCCL all-reduce between {len(result['devices'])} GPUs: exact sums, "
            f"{result['bus_gb_per_s']:g} GB/s bus bandwidth on 64 MiB"
        )
    return (
        f"{'FAILED':8} NCCL all-reduce between {len(gpus)} GPUs: {result['error']}. HINT: run "
        "with NCCL_DEBUG=INFO to see why; until it works, train with "
        "communication='hierarchical_copy' (mirrored) or 'ring' (multi_worker_mirrored), or "
        "TFDIST_COMMUNICATION=ring."
    )


def _task_failures(name: str, output: Sequence[str]) -> List[str]:
    """The failures one smoke task's output shows (the job ended in time)."""
    failures = []
    text = "\n".join(output)
    if "could not form the multi-worker cluster" in text:
        failures.append(
            f"{name}: the workers could not meet on loopback. HINT: a blocked "
            "port or a proxy (unset http_proxy/grpc_proxy for 127.0.0.1)."
        )
    elif "SMOKE allreduce=3" not in text:
        failures.append(
            f"{name}: the all-reduce did not give 1 + 2 = 3. Last lines:\n"
            + "\n".join(output[-10:])
        )
    elif "SMOKE fit_steps=3" not in text:
        failures.append(
            f"{name}: the 3-step multi-worker fit failed. Last lines:\n" + "\n".join(output[-10:])
        )
    for scenario, outcome in scenario_outcomes(output).items():
        if outcome != "ok":
            fixes = ", ".join(SCENARIO_FIXES.get(scenario, ())) or "none"
            failures.append(
                f"{name}: the scenario {scenario} failed: {outcome}. The fixes that cover it: "
                f"{fixes} (`tfdist env` shows their state). HINT: use a release of the "
                "tested matrix, or report this release as an issue."
            )
    return failures


def smoke_verdict(result) -> List[str]:
    """Reads the smoke job's result; returns the failures, each with its fix."""
    failures = []
    for name, task in result.tasks.items():
        if result.reason == "timeout":
            failures.append(
                f"{name}: no result in time. HINT: a firewall or a blocked loopback port stops "
                "the workers from meeting; check that 127.0.0.1 ports are open."
            )
        else:
            failures.extend(_task_failures(name, task.output))
    return failures


def scenario_outcomes(lines: Sequence[str]) -> dict:
    """{scenario: "ok" or "FAILED ..."} from the smoke job's `SMOKE scenario:` lines."""
    outcomes = {}
    for line in lines:
        if "SMOKE scenario:" in line:
            key, _, outcome = line.split("SMOKE scenario:", 1)[1].partition("=")
            outcomes[key] = outcome.strip()
    return outcomes


def smoke_gpus(gpus: Sequence[str]) -> dict:
    """How the smoke job's 2 workers use the launcher's `gpus`: with two or more, each gets
    its own (`tfdist launch`'s "auto"); with one, the workers run on CPUs, since two processes
    that each reserve a GPU's memory (or are two NCCL ranks on it) fail for that reason alone.
    Returns `plan_job` keyword arguments."""
    if len(gpus) >= 2:
        return {"gpus_per_worker": "auto", "visible_gpus": list(gpus)}
    if gpus:
        return {"extra_env": {"CUDA_VISIBLE_DEVICES": ""}}
    return {}


def _smoke_job(timeout: float):
    """Runs the 2-worker smoke job (quietly); returns its JobResult."""
    import tempfile

    from tfdist import gpus
    from tfdist.launcher.job import plan_job, run_job

    env = {"TF_CPP_MIN_LOG_LEVEL": "2", settings.STRATEGY.name: "multi_worker_mirrored"}
    on_gpus = smoke_gpus(gpus.visible())
    env.update(on_gpus.pop("extra_env", {}))
    with tempfile.TemporaryDirectory(prefix="tfdist-doctor-") as directory:
        plans = plan_job(
            "tfdist.launcher.smoke_job",
            [directory],
            module=True,
            workers=2,
            extra_env=env,
            **on_gpus,
        )
        return run_job(plans, timeout=timeout, quiet=True, grace=3.0)


def doctor_command(args) -> int:
    """Prints the report, its problems and the smoke test's outcome; returns 1 when the smoke
    test failed."""
    import time

    report = environment_report()
    print_report(report)
    print("\n-- checks")
    problems = diagnose(os.environ, report["replica_devices"])
    if "error" in report["cluster"]:
        problems.append(f"The detected cluster is invalid: {report['cluster']['error']}")
    for problem in problems:
        print(f"PROBLEM  {problem}")
    arguments = nccl_arguments(report["replica_devices"])
    nccl = None if arguments is None else nccl_check.run(arguments, timeout=min(args.timeout, 120))
    print(nccl_line(report["replica_devices"], nccl))
    print(smoke_test_header())
    started = time.monotonic()
    result = _smoke_job(args.timeout)
    failures = smoke_verdict(result)
    for failure in failures:
        print(f"FAILED   {failure}")
    took = time.monotonic() - started
    chief = result.tasks.get("worker:0")
    for scenario, outcome in scenario_outcomes(chief.output if chief else []).items():
        print(scenario_line(scenario, outcome))
    if not failures:
        print(f"OK       2 workers met, all-reduced 1 + 2 = 3 and trained 3 steps ({took:.1f} s)")
    broken = bool(failures) or (nccl is not None and nccl["outcome"] != "ok")
    verdict = (
        "broken (see above)"
        if broken
        else ("problems found (see above)" if problems else "healthy")
    )
    print(f"\nverdict: {verdict}")
    return 1 if broken else 0
