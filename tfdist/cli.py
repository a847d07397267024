"""The `tfdist` command (also `python -m tfdist`): the top of tfdist, which imports its parts.

    tfdist env [--json]                      versions, devices, cluster, the "auto" strategy
    tfdist tf-config --worker h:p,h:p ...    TF_CONFIG of one task, or of every task (--all)
    tfdist launch --workers 2 train.py ...   run a script as a local multi-process job
    tfdist horovodrun -np 2 python train.py  run a Horovod script as a local job (tfdist.horovod)
    tfdist serve                             run this task as a parameter-server job's server
    tfdist doctor                            env report + a real 2-process smoke test
    tfdist verify model.py                   train the script's model under every strategy:
                                             the same as on one device, step by step?

Flags accept hyphens or underscores (--max-restarts / --max_restarts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
from typing import List, Mapping, Optional, Sequence

from tfdist import settings
from tfdist.cluster import ClusterConfigError, ClusterSpec, detect_cluster, detect_environment
from tfdist.strategy.registry import CLI_CHOICES, POOLED, WITH_ALL_REDUCE


def _hosts(values: Optional[List[str]]) -> List[str]:
    hosts: List[str] = []
    for value in values or []:
        hosts.extend(part.strip() for part in value.split(",") if part.strip())
    return hosts


def _task(text: str):
    job, sep, index = text.partition(":")
    if not sep or not index.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a task like 'worker:0' (job:index)")
    return job.strip(), int(index)


def _positive_seconds(text: str, hint: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive number of seconds. HINT: {hint}"
        )
    return value


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (`--timeout`)."""
    return _positive_seconds(
        text, "e.g. --timeout 600 stops the job after 10 minutes; leave --timeout out for no limit."
    )


def _grace(text: str) -> float:
    """A positive, finite number of seconds (`--grace`)."""
    return _positive_seconds(
        text,
        "e.g. --grace 60 gives the tasks a minute to save and exit after a SIGTERM before they "
        "are killed; leave --grace out for 30 s.",
    )


def _workers(text: str):
    """`--workers N` (an int; N < 1 is refused later, with --ps), or `MIN:MAX` (a pair)."""
    low, sep, high = text.partition(":")
    try:
        values = [int(low)] + ([int(high)] if sep else [])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of workers N nor a range MIN:MAX of whole numbers. "
            "HINT: e.g. --workers 2, or --workers 2:3 (an elastic job: start 3 workers, go on "
            "with 2 when a worker slot is lost for good)."
        ) from None
    if not sep:
        return values[0]
    low, high = values
    if low < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: MIN must be at least 1, a job needs a worker. HINT: --workers "
            f"1:{max(high, 1)} starts {max(high, 1)} workers and goes on down to 1."
        )
    if low > high:
        raise argparse.ArgumentTypeError(
            f"{text!r}: MIN {low} is more than MAX {high}. HINT: --workers {high}:{low} starts "
            f"{low} workers and goes on down to {high}."
        )
    return low, high


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdist", description="Distributed TensorFlow training with Keras."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    env = sub.add_parser("env", help="report versions, devices, cluster and the auto strategy")
    env.add_argument("--json", action="store_true", help="print JSON for machines")

    tfc = sub.add_parser(
        "tf-config", aliases=["tf_config"], help="print TF_CONFIG for tasks of a cluster"
    )
    tfc.add_argument(
        "--worker",
        action="append",
        metavar="HOST:PORT[,...]",
        help="worker address(es); repeat or comma-separate",
    )
    tfc.add_argument(
        "--ps", action="append", metavar="HOST:PORT[,...]", help="parameter-server address(es)"
    )
    tfc.add_argument("--chief", metavar="HOST:PORT", help="the chief's address")
    tfc.add_argument("--evaluator", metavar="HOST:PORT", help="the evaluator's address")
    which = tfc.add_mutually_exclusive_group()
    which.add_argument(
        "--task",
        type=_task,
        metavar="TYPE:INDEX",
        help="the task to print (default: the chief, else worker:0)",
    )
    which.add_argument("--all", action="store_true", help="print every task")
    tfc.add_argument(
        "--format",
        choices=("json", "export"),
        default="json",
        help="a JSON line, or `export TF_CONFIG='...'` for batch scripts",
    )

    lau = sub.add_parser("launch", help="run a script as a local multi-process job")
    lau.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N|MIN:MAX",
        help="number of workers (default 1); MIN:MAX for an elastic job that starts MAX workers "
        "and goes on down to MIN (SIGUSR1 to the launcher gives a lost worker slot back)",
    )
    lau.add_argument("--ps", type=int, default=0, help="number of parameter servers")
    lau.add_argument("--chief", action="store_true", help="add a chief task")
    lau.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    lau.add_argument(
        "--strategy",
        choices=CLI_CHOICES,
        help="strategy name for tfdist.make_strategy() (sets TFDIST_STRATEGY)",
    )
    lau.add_argument(
        "--gradient-compression",
        "--gradient_compression",
        choices=("bf16", "fp16", "none"),
        help=f"cast float32 gradients for the all-reduce of {' and '.join(WITH_ALL_REDUCE)} "
        "(sets TFDIST_GRADIENT_COMPRESSION; default none)",
    )
    lau.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="restart the whole job at most this many times after a failure",
    )
    lau.add_argument(
        "--timeout", type=_seconds, default=None, help="stop the job after SECONDS (> 0)"
    )
    lau.add_argument(
        "--grace",
        type=_grace,
        default=None,
        metavar="SECONDS",
        help="seconds the tasks get to save and exit after a SIGTERM (or after a peer was "
        "preempted) before SIGKILL (default 30)",
    )
    lau.add_argument(
        "--log-dir", "--log_dir", help="also write each task's output to LOG_DIR/<task>.log"
    )
    lau.add_argument(
        "--dry-run",
        "--dry_run",
        action="store_true",
        help="print each task's command and environment; start nothing",
    )
    lau.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        default=None,
        help="show every line of the tasks, TensorFlow's C++ start-up logs included "
        "(default: hidden, like TFDIST_VERBOSE=0; errors are always shown)",
    )
    lau.add_argument(
        "-m", dest="module", action="store_true", help="TARGET is a module name, run as python -m"
    )
    lau.add_argument("target", metavar="TARGET", help="the script (or module with -m)")
    lau.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")

    _horovodrun_parser(sub)

    sub.add_parser("serve", help="run this task (from TF_CONFIG) as a worker/ps server")

    doc = sub.add_parser("doctor", help="environment report plus a real 2-process smoke test")
    doc.add_argument(
        "--timeout", type=_seconds, default=180.0, help="seconds for the smoke test (default 180)"
    )

    ver = sub.add_parser(
        "verify",
        help="train a script's build_model() under every strategy and compare with one device",
    )
    ver.add_argument(
        "script", help="a .py file defining build_model(), data() and GLOBAL_BATCH_SIZE"
    )
    ver.add_argument(
        "--strategies",
        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
        help=f"comma-separated, the first is the reference (default: {', '.join(POOLED)})",
    )
    ver.add_argument("--global-batch-size", "--global_batch_size", type=_positive_int)
    ver.add_argument("--steps", type=_positive_int, help="steps per epoch (default 4)")
    ver.add_argument("--epochs", type=_positive_int, help="epochs (default 2)")
    ver.add_argument("--rtol", type=float, help="relative tolerance (default 1e-4)")
    ver.add_argument("--atol", type=float, help="absolute tolerance (default 1e-5)")
    ver.add_argument(
        "--replicas", type=_positive_int, default=2, help="mirrored's virtual CPUs (default 2)"
    )
    ver.add_argument(
        "--workers",
        type=_positive_int,
        default=2,
        help="multi_worker_mirrored's processes (default 2)",
    )
    ver.add_argument(
        "--keep-random-layers",
        "--keep_random_layers",
        action="store_true",
        help="leave Dropout and noise layers on (default: their rate is set to 0 in every run)",
    )
    return parser


def _horovodrun_parser(sub) -> None:
    hvd = sub.add_parser(
        "horovodrun",
        help="run a Horovod script (import horovod.tensorflow...) as a local multi-process job",
        description="horovodrun's common flags; the processes run on this machine, over "
        "TensorFlow's collectives (tfdist.horovod). Tuning and transport flags are accepted "
        "and have no effect.",
        allow_abbrev=False,  # the script's own flags (--out) are not prefixes of these
    )
    hvd.add_argument("-np", "--num-proc", "--num_proc", dest="num_proc", type=int, required=True)
    hvd.add_argument("-H", "--hosts", help="this machine's slots, e.g. localhost:2")
    hvd.add_argument("--hostfile", "--host-file", help="a hostfile (`localhost slots=2`)")
    hvd.add_argument(
        "--start-timeout",
        "--start_timeout",
        type=_seconds,
        help="seconds for every process to join (TFDIST_STARTUP_TIMEOUT)",
    )
    hvd.add_argument(
        "--output-filename", "--output_filename", help="also write each process's output here"
    )
    hvd.add_argument("--verbose", action="store_true", help="show TensorFlow's start-up logs")
    hvd.add_argument("--timeline-filename", "--timeline_filename", help="refused: no timeline")
    hvd.add_argument(
        "--timeout", type=_seconds, default=None, help="stop the job after SECONDS (> 0)"
    )
    for flag in ("--gloo", "--mpi", "--jsrun", "--disable-cache", "--autotune"):
        hvd.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in (
        "-p",
        "--ssh-port",
        "--ssh-identity-file",
        "--network-interface",
        "--network-interfaces",
        "--fusion-threshold-mb",
        "--cycle-time-ms",
        "--cache-capacity",
        "--mpi-args",
        "--log-level",
    ):
        hvd.add_argument(flag, help=argparse.SUPPRESS)
    for flag in ("--hierarchical-allreduce", "--hierarchical-allgather", "--timeline-mark-cycles"):
        hvd.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    hvd.add_argument("program", nargs=argparse.REMAINDER, help="python train.py ARGS")


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command.replace("_", "-")](args)
    except ClusterConfigError as err:
        print(f"tfdist {args.command}: error: {err}", file=sys.stderr)
        return 2


def _cmd_tf_config(args) -> int:
    workers, ps = _hosts(args.worker), _hosts(args.ps)
    if workers or ps or args.chief or args.evaluator:
        spec = ClusterSpec.from_hosts(
            workers=workers,
            ps=ps,
            chief=args.chief,
            evaluator=args.evaluator,
            task_type="chief" if args.chief else "worker",
        )
    else:
        spec = detect_cluster()
        if spec.is_single_process:
            raise ClusterConfigError(
                "No cluster: give its tasks, e.g. `tfdist tf-config --worker h1:2222,h2:2222 "
                "--all`, or set TF_CONFIG / run inside srun."
            )
    if args.all:
        tasks = spec.tasks
    elif args.task:
        tasks = [args.task]
    else:
        tasks = [(spec.task_type, spec.task_index)]
    for job, index in tasks:
        text = spec.to_json(job, index)
        if args.format == "export":
            if args.all:
                print(f"# {job}:{index}")
            print(f"export TF_CONFIG={shlex.quote(text)}")
        else:
            print(text)
    return 0


def environment_report() -> dict:
    """What `tfdist env` prints: versions, devices, NCCL, cluster, the "auto" strategy."""
    import tensorflow as tf

    from tfdist import flavour
    from tfdist.strategy import local_devices, resolve_strategy_name

    report = dict(flavour.versions())
    report["python"] = sys.version.split()[0]
    report["releases"] = release_report(report)
    report["physical_devices"] = [d.name for d in tf.config.list_physical_devices()]
    devices = local_devices()
    report["replica_devices"] = devices
    gpus = tf.config.list_physical_devices("GPU")
    report["nccl"] = {
        "usable": bool(gpus) and tf.test.is_built_with_cuda(),
        "reason": (
            "every replica is a GPU and TensorFlow is built with CUDA"
            if gpus and tf.test.is_built_with_cuda()
            else "no GPU found: collectives use ring (gRPC) / reduce-to-one-device"
        ),
    }
    report["environment_variables"] = {
        k: v
        for k, v in sorted(os.environ.items())
        if k in ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES")
        or k.startswith(settings.PREFIX)
    }
    try:
        environment = detect_environment()
        spec = environment.cluster_spec()
        report["cluster"] = {
            "detected_from": environment.name,
            "jobs": spec.cluster,
            "task": spec.task,
            "num_workers": spec.num_workers,
            "num_ps": spec.num_ps,
            "is_chief": spec.is_chief,
        }
        report["auto_strategy"] = resolve_strategy_name("auto", spec, devices)
        from tfdist.precision import auto_precision

        report["precision"] = auto_precision(devices)
    except ClusterConfigError as err:
        report["cluster"] = {"error": str(err)}
        report["auto_strategy"] = None
    return report


def release_report(versions: Mapping[str, str]) -> dict:
    """Where these releases stand against the tested matrix, and each fix's state."""
    from tfdist import fixes, releases

    here = releases.support(versions["tensorflow"], versions["keras"], versions["keras_flavour"])
    return {
        "support": here.status,
        "message": here.message,
        "matrix": [dataclasses.asdict(r) for r in releases.MATRIX],
        "fixes": [status.as_dict() for status in fixes.report()],
    }


def _print_releases(report: dict) -> None:
    releases = report["releases"]
    print(f"{'releases':16} {releases['support']}: {releases['message']}")
    pairs = ", ".join(f"{r['tensorflow']}+{r['keras']}" for r in releases["matrix"])
    print(f"{'tested pairs':16} TensorFlow+Keras {pairs} (each with its tf_keras)")
    for status in releases["fixes"]:
        print(f"{'fix':16} {status['name']}: {status['state']} ({status['reason']})")


def _cmd_env(args) -> int:
    report = environment_report()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        for key in ("tensorflow", "keras", "keras_flavour", "python"):
            print(f"{key:16} {report[key]}")
        _print_releases(report)
        print(f"{'devices':16} {', '.join(report['physical_devices'])}")
        print(f"{'replicas':16} {', '.join(report['replica_devices'])}")
        print(
            f"{'nccl':16} {'yes' if report['nccl']['usable'] else 'no'} "
            f"({report['nccl']['reason']})"
        )
        cluster = report["cluster"]
        if "error" in cluster:
            print(f"{'cluster':16} INVALID: {cluster['error']}")
        else:
            print(
                f"{'cluster':16} {cluster['jobs'] or 'single process'} "
                f"(from {cluster['detected_from']})"
            )
            print(
                f"{'task':16} {cluster['task'] or '-'}{' (chief)' if cluster['is_chief'] else ''}"
            )
        print(f"{'auto strategy':16} {report['auto_strategy']}")
        if "precision" in report:
            print(
                f"{'auto precision':16} {report['precision']['policy']} "
                f"({report['precision']['reason']})"
            )
        for key, value in report["environment_variables"].items():
            print(f"{key:16} {value}")
    return 1 if "error" in report["cluster"] else 0


def _cmd_launch(args) -> int:
    from tfdist.launcher.job import plan_job
    from tfdist.launcher.outcome import GRACE_SECONDS, exit_code
    from tfdist.launcher.restarts import _launch

    script_args = list(args.args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    extra = {settings.STRATEGY.name: args.strategy} if args.strategy else {}
    if args.gradient_compression:
        extra[settings.GRADIENT_COMPRESSION.name] = args.gradient_compression
    extra = extra or None
    elastic = isinstance(args.workers, tuple)
    if (not elastic and args.workers < 1) or args.ps < 0 or args.max_restarts < 0:
        print(
            "tfdist launch: error: --workers must be >= 1, --ps and --max-restarts >= 0 "
            f"(received --workers {args.workers} --ps {args.ps} --max-restarts "
            f"{args.max_restarts}). HINT: e.g. --workers 2 --ps 0 --max-restarts 1",
            file=sys.stderr,
        )
        return 2
    if elastic and args.ps:
        low, high = args.workers
        print(
            f"tfdist launch: error: --workers {low}:{high} (an elastic job) does not go with "
            f"--ps {args.ps}. HINT: a parameter-server job already keeps training when a worker "
            "is lost: TensorFlow's ClusterCoordinator runs the lost worker's steps on the workers "
            "left, where each task is its own pod or step (Kubernetes, SLURM); give a number of "
            f"workers, e.g. --workers {high} --ps {args.ps}.",
            file=sys.stderr,
        )
        return 2
    if not args.module and not os.path.exists(args.target):
        print(
            f"tfdist launch: error: script {args.target!r} does not exist. HINT: give a path, "
            "or -m module.name",
            file=sys.stderr,
        )
        return 2
    job = dict(
        ps=args.ps,
        chief=args.chief,
        evaluator=args.evaluator,
        module=args.module,
        extra_env=extra,
    )
    if args.dry_run:
        workers = args.workers[1] if elastic else args.workers
        for plan in plan_job(args.target, script_args, workers=workers, **job):
            print(plan.describe())
        return 0
    result = _launch(
        args.target,
        script_args,
        workers=args.workers,
        **job,
        max_restarts=args.max_restarts,
        timeout=args.timeout,
        grace=GRACE_SECONDS if args.grace is None else args.grace,
        log_dir=args.log_dir,
        verbose=args.verbose,
    )
    return exit_code(result)


def _cmd_horovodrun(args) -> int:
    from tfdist.horovod import run, shim
    from tfdist.launcher.outcome import exit_code
    from tfdist.launcher.restarts import _launch

    try:
        launch = run.launch_settings(args)
    except run.HorovodrunError as err:
        print(f"tfdist horovodrun: error: {err}", file=sys.stderr)
        return 2
    real = shim.real_horovod()
    if real is not None:
        print(
            f"tfdist horovodrun: warning: Horovod is installed ({real.origin}); the script's "
            "`import horovod` gets it, not tfdist's API, and its processes will not find each "
            "other here. HINT: import tfdist.horovod.tensorflow as hvd in the script, or "
            "uninstall horovod.",
            file=sys.stderr,
        )
    return exit_code(_launch(**launch))


def _cmd_serve(args) -> int:
    from tfdist.strategy import serve

    serve()
    return 0


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


def smoke_verdict(result) -> List[str]:
    """Reads the smoke job's result; returns the failures, each with its fix."""
    failures = []
    for name, task in result.tasks.items():
        text = "\n".join(task.output)
        if result.reason == "timeout":
            failures.append(
                f"{name}: no result in time. HINT: a firewall or a blocked loopback port stops "
                "the workers from meeting; check that 127.0.0.1 ports are open."
            )
            continue
        if "could not form the multi-worker cluster" in text:
            failures.append(
                f"{name}: the workers could not meet on loopback. HINT: a blocked "
                "port or a proxy (unset http_proxy/grpc_proxy for 127.0.0.1)."
            )
        elif "SMOKE allreduce=3" not in text:
            failures.append(
                f"{name}: the all-reduce did not give 1 + 2 = 3. Last lines:\n"
                + "\n".join(task.output[-10:])
            )
        elif "SMOKE fit_steps=3" not in text:
            failures.append(
                f"{name}: the 3-step multi-worker fit failed. Last lines:\n"
                + "\n".join(task.output[-10:])
            )
        for scenario, outcome in scenario_outcomes(task.output).items():
            if outcome != "ok":
                fixes = ", ".join(SCENARIO_FIXES.get(scenario, ())) or "none"
                failures.append(
                    f"{name}: the scenario {scenario} failed: {outcome}. The fixes that cover it: "
                    f"{fixes} (`tfdist env` shows their state). HINT: use a release of the "
                    "tested matrix, or report this release as an issue."
                )
    return failures


# The doctor's scenarios (tfdist/launcher/smoke_job.py) and the fixes each one exercises.
SCENARIO_FIXES = {
    "fit_on_a_dataset": (
        "symbolic_build_from_a_local_batch",
        "multi_worker_mean_of_metric_results",
    ),
    "steps_per_execution": ("multi_worker_steps_per_execution",),
    "checkpoints_and_backup": ("multi_worker_checkpoint_callbacks",),
    "dropout_masks_per_worker": ("different_random_draws_per_replica",),
}


def scenario_outcomes(lines: Sequence[str]) -> dict:
    """{scenario: "ok" or "FAILED ..."} from the smoke job's `SMOKE scenario:` lines."""
    outcomes = {}
    for line in lines:
        if "SMOKE scenario:" in line:
            key, _, outcome = line.split("SMOKE scenario:", 1)[1].partition("=")
            outcomes[key] = outcome.strip()
    return outcomes


def _cmd_doctor(args) -> int:
    import tempfile
    import time

    from tfdist.launcher.job import plan_job, run_job

    report = environment_report()
    _cmd_env(argparse.Namespace(json=False))
    print("\n-- checks")
    problems = diagnose(os.environ, report["replica_devices"])
    if "error" in report["cluster"]:
        problems.append(f"The detected cluster is invalid: {report['cluster']['error']}")
    for problem in problems:
        print(f"PROBLEM  {problem}")
    print(
        "-- smoke test: 2 workers on loopback (all-reduce, a 3-step fit, then the scenarios "
        "that exercise the fixes)"
    )
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", settings.STRATEGY.name: "multi_worker_mirrored"}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfdist-doctor-") as directory:
        plans = plan_job(
            "tfdist.launcher.smoke_job", [directory], module=True, workers=2, extra_env=env
        )
        result = run_job(plans, timeout=args.timeout, quiet=True, grace=3.0)
    failures = smoke_verdict(result)
    for failure in failures:
        print(f"FAILED   {failure}")
    seconds = time.monotonic() - started
    chief = result.tasks.get("worker:0")
    for scenario, outcome in scenario_outcomes(chief.output if chief else []).items():
        print(f"{'ok' if outcome == 'ok' else 'FAILED':8} scenario {scenario}")
    if not failures:
        print(
            f"OK       2 workers met, all-reduced 1 + 2 = 3 and trained 3 steps ({seconds:.1f} s)"
        )
    verdict = (
        "healthy"
        if not (failures or problems)
        else ("problems found (see above)" if not failures else "broken (see above)")
    )
    print(f"\nverdict: {verdict}")
    return 1 if failures else 0


def _cmd_verify(args) -> int:
    from tfdist.testing.verify import verify_script

    return verify_script(
        args.script,
        global_batch_size=args.global_batch_size,
        strategies=args.strategies,
        steps=args.steps,
        epochs=args.epochs,
        rtol=args.rtol,
        atol=args.atol,
        replicas=args.replicas,
        workers=args.workers,
        random_layers="keep" if args.keep_random_layers else "off",
    )


_COMMANDS = {
    "env": _cmd_env,
    "tf-config": _cmd_tf_config,
    "launch": _cmd_launch,
    "horovodrun": _cmd_horovodrun,
    "serve": _cmd_serve,
    "doctor": _cmd_doctor,
    "verify": _cmd_verify,
}
