"""`tfdist launch`, `tfdist horovodrun` and `tfdist serve`: local multi-process jobs.

`launch` runs a script as a job of workers (and ps, chief, evaluator) on loopback, with
restarts and elastic workers (`tfdist.launcher`); `horovodrun` takes horovodrun's common
flags and runs a Horovod script the same way (`tfdist.horovod.run`); `serve` is what the
worker and ps tasks of a launched parameter-server job run.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from tfdist import settings
from tfdist.cli.arguments import positive_seconds, seconds
from tfdist.strategy.communication import MULTI_WORKER
from tfdist.strategy.registry import CLI_CHOICES, WITH_ALL_REDUCE


def _grace(text: str) -> float:
    """A positive, finite number of seconds (`--grace`)."""
    return positive_seconds(
        text,
        "e.g. --grace 60 gives the tasks a minute to save and exit after a SIGTERM before they "
        "are killed; leave --grace out for 30 s.",
    )


def _stall_timeout(text: str) -> float:
    """A finite number of seconds >= 0 (`--stall-timeout`; 0: off)."""
    try:
        return settings.STALL_TIMEOUT.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--stall-timeout must be a number of seconds >= 0, not {text!r}. HINT: e.g. "
            "--stall-timeout 120 names the tasks that made no training step for 2 minutes; "
            "0 turns that off."
        ) from None


def _profile(text: str) -> str:
    """START:END (`--profile`), checked as TFDIST_PROFILE is."""
    try:
        if settings.PROFILE.parse(text) is None:
            raise ValueError("empty")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--profile must be START:END, two whole numbers of steps with 0 <= START < END, "
            f"not {text!r}. HINT: e.g. --profile 10:15 traces steps 10 to 14 of every task."
        ) from None
    return text.strip()


def _workers(text: str):
    """`--workers N` (an int; N < 1 is refused later, with --ps), `MIN:MAX` (a pair), or
    `gpu` (one worker per GPU, or per --gpus-per-worker GPUs)."""
    if text.strip().lower() == "gpu":
        return "gpu"
    low, sep, high = text.partition(":")
    try:
        values = [int(low)] + ([int(high)] if sep else [])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number of workers N nor a range MIN:MAX of whole numbers. "
            "HINT: e.g. --workers 2, --workers 2:3 (an elastic job: start 3 workers, go on "
            "with 2 when a worker slot is lost for good), or --workers gpu (one per GPU)."
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


def _gpus_per_worker(text: str):
    from tfdist.gpus import GpuError, per_worker

    try:
        return per_worker(text)
    except GpuError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _nodes(text: str):
    low, colon, high = text.partition(":")
    try:
        return (int(low), int(high)) if colon else int(low)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of nodes or MIN:MAX. Received: {text!r}. HINT: e.g. 2, or 2:3"
        ) from None


def _count_or_gpu(refusal: str):
    """A parser of "N" or "gpu" (one per GPU), refusing anything else with `refusal` (the
    value quoted in it as {text!r})."""

    def parse(text: str):
        if text.strip().lower() == "gpu":
            return "gpu"
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(refusal.format(text=text)) from None

    return parse


_per_node = _count_or_gpu(
    "must be a number of workers or gpu. Received: {text!r}. HINT: e.g. 2, or gpu"
)
# `-np N` or `-np gpu`
_num_proc = _count_or_gpu(
    "{text!r} is not a number of processes. HINT: e.g. -np 2, or -np gpu (one per GPU)."
)


def add_commands(sub) -> None:
    """Adds `launch`, `horovodrun` and `serve` to the subparsers `sub`."""
    _add_launch_parser(sub)
    _add_horovodrun_parser(sub)
    sub.add_parser("serve", help="run this task (from TF_CONFIG) as a worker/ps server")


def _add_launch_parser(sub) -> None:
    lau = sub.add_parser("launch", help="run a script as a local multi-process job")
    lau.add_argument(
        "--workers",
        type=_workers,
        default=1,
        metavar="N|MIN:MAX|gpu",
        help="number of workers (default 1); MIN:MAX for an elastic job that starts MAX workers "
        "and goes on down to MIN (SIGUSR1 to the launcher gives a lost worker slot back); gpu "
        "for one worker per GPU (per --gpus-per-worker GPUs)",
    )
    lau.add_argument(
        "--gpus-per-worker",
        "--gpus_per_worker",
        type=_gpus_per_worker,
        default="auto",
        metavar="K|auto|shared",
        help="GPUs each training task sees, its own (sets its CUDA_VISIBLE_DEVICES): auto "
        "(default) shares the host's GPUs out evenly, K gives each K, shared lets every task "
        "see every GPU and take only the memory it uses; nothing is set on a host without GPUs",
    )
    lau.add_argument(
        "--evaluator-gpus",
        "--evaluator_gpus",
        type=int,
        default=0,
        metavar="K",
        help="GPUs of the evaluator task (default 0: ps tasks, a parameter-server job's chief "
        "and the evaluator see no GPU)",
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
        "--communication",
        choices=[c for c in MULTI_WORKER if c != "auto"],
        help="how multi_worker_mirrored all-reduces: TensorFlow's ring, NCCL (GPUs), or Gloo "
        "(CPUs, needs tfdist[gloo]) (sets TFDIST_COMMUNICATION; default auto)",
    )
    lau.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="restart the whole job at most this many times after a failure",
    )
    lau.add_argument(
        "--timeout", type=seconds, default=None, help="stop the job after SECONDS (> 0)"
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
        "--stall-timeout",
        "--stall_timeout",
        type=_stall_timeout,
        default=None,
        metavar="SECONDS",
        help="after SECONDS without a training step, name the tasks behind and print every "
        "task's Python stacks; the job goes on (default 300, TFDIST_STALL_TIMEOUT; 0: off)",
    )
    lau.add_argument(
        "--log-dir",
        "--log_dir",
        help="also write each task's output to LOG_DIR/<task>.log, and the launcher's progress "
        "and stall lines to LOG_DIR/launcher.log",
    )
    lau.add_argument(
        "--profile",
        type=_profile,
        default=None,
        metavar="START:END",
        help="every training task captures a TensorFlow profiler trace of its steps START to "
        "END - 1 into LOG_DIR/profile/<task> (with --log-dir), else ./tfdist-profile/<task>; "
        "TensorBoard's profile plugin opens it",
    )
    lau.add_argument(
        "--summary-json",
        "--summary_json",
        metavar="FILE",
        help="write the job's summary to FILE as JSON: each task's exit code, wall time, "
        "training steps and time, the restarts, the slowest task",
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
        "(default: hidden, like TFDIST_VERBOSE=0; errors are always shown), and every "
        "task's step and steps/s in the progress line",
    )
    nodes = lau.add_argument_group(
        "multi-node jobs",
        "the same command on every node, each with its own --node-rank; under SLURM (srun "
        "--ntasks-per-node=1) --nodes and --node-rank default to the allocation's",
    )
    nodes.add_argument(
        "--nodes",
        type=_nodes,
        default=None,
        metavar="N|MIN:MAX",
        help="the machines of the job, one launcher each; MIN:MAX for an elastic job that starts "
        "on MIN, goes on without a node that is lost, and grows when one joins",
    )
    nodes.add_argument(
        "--node-rank", "--node_rank", type=int, default=None, help="this node: 0 .. NODES - 1"
    )
    nodes.add_argument(
        "--rendezvous",
        metavar="HOST:PORT",
        help="node 0's address and a free port there, where the nodes agree on the cluster",
    )
    nodes.add_argument(
        "--workers-per-node",
        "--workers_per_node",
        type=_per_node,
        default=1,
        metavar="K|gpu",
        help="workers on each node (default 1); gpu: one per --gpus-per-worker GPUs",
    )
    nodes.add_argument(
        "--ps-per-node", "--ps_per_node", type=int, default=0, help="ps tasks on each node"
    )
    nodes.add_argument(
        "--token",
        help="the job's secret (default TFDIST_RENDEZVOUS_TOKEN; node 0 makes one and prints it "
        "where neither is given)",
    )
    nodes.add_argument(
        "--node-address",
        "--node_address",
        help="where the other nodes reach this one (default: its address on the way to the "
        "rendezvous)",
    )
    nodes.add_argument(
        "--rendezvous-timeout",
        "--rendezvous_timeout",
        type=seconds,
        default=None,
        help="seconds to wait for the rendezvous and for every node (default 300, "
        "TFDIST_RENDEZVOUS_TIMEOUT)",
    )
    lau.add_argument(
        "-m", dest="module", action="store_true", help="TARGET is a module name, run as python -m"
    )
    lau.add_argument("target", metavar="TARGET", help="the script (or module with -m)")
    lau.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _add_horovodrun_parser(sub) -> None:
    hvd = sub.add_parser(
        "horovodrun",
        help="run a Horovod script (import horovod.tensorflow...) as a local multi-process job",
        description="horovodrun's common flags; the processes run on this machine, over "
        "TensorFlow's collectives (tfdist.horovod). Tuning and transport flags are accepted "
        "and have no effect.",
        allow_abbrev=False,  # the script's own flags (--out) are not prefixes of these
    )
    hvd.add_argument(
        "-np",
        "--num-proc",
        "--num_proc",
        dest="num_proc",
        type=_num_proc,
        required=True,
        help="number of processes, or gpu: one per GPU (each sees every GPU, as with horovodrun)",
    )
    hvd.add_argument("-H", "--hosts", help="this machine's slots, e.g. localhost:2")
    hvd.add_argument("--hostfile", "--host-file", help="a hostfile (`localhost slots=2`)")
    hvd.add_argument(
        "--start-timeout",
        "--start_timeout",
        type=seconds,
        help="seconds for every process to join (TFDIST_STARTUP_TIMEOUT)",
    )
    hvd.add_argument(
        "--output-filename", "--output_filename", help="also write each process's output here"
    )
    hvd.add_argument("--verbose", action="store_true", help="show TensorFlow's start-up logs")
    hvd.add_argument("--timeline-filename", "--timeline_filename", help="refused: no timeline")
    hvd.add_argument(
        "--timeout", type=seconds, default=None, help="stop the job after SECONDS (> 0)"
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


def _refusal(args) -> Optional[str]:
    """Why `tfdist launch` cannot run these flags (the message, with its fix), or None."""
    elastic = isinstance(args.workers, tuple)
    if args.evaluator_gpus < 0 or (args.evaluator_gpus and not args.evaluator):
        return (
            f"--evaluator-gpus {args.evaluator_gpus} needs an evaluator task and a number >= 0. "
            "HINT: e.g. --evaluator --evaluator-gpus 1"
        )
    counted = not elastic and args.workers != "gpu"
    if (counted and args.workers < 1) or args.ps < 0 or args.max_restarts < 0:
        return (
            "--workers must be >= 1, --ps and --max-restarts >= 0 "
            f"(received --workers {args.workers} --ps {args.ps} --max-restarts "
            f"{args.max_restarts}). HINT: e.g. --workers 2 --ps 0 --max-restarts 1"
        )
    if elastic and args.ps:
        low, high = args.workers
        return (
            f"--workers {low}:{high} (an elastic job) does not go with "
            f"--ps {args.ps}. HINT: a parameter-server job already keeps training when a worker "
            "is lost: TensorFlow's ClusterCoordinator runs the lost worker's steps on the workers "
            "left, where each task is its own pod or step (Kubernetes, SLURM); give a number of "
            f"workers, e.g. --workers {high} --ps {args.ps}."
        )
    if not args.module and not os.path.exists(args.target):
        return _no_script(args)
    return None


def _no_script(args) -> str:
    return f"script {args.target!r} does not exist. HINT: give a path, or -m module.name"


def _extra_env(args) -> Optional[dict]:
    """The variables `--strategy`, `--communication`, `--gradient-compression` and `--profile`
    set in every task, or None."""
    extra = {settings.STRATEGY.name: args.strategy} if args.strategy else {}
    if args.communication:
        extra[settings.COMMUNICATION.name] = args.communication
    if args.gradient_compression:
        extra[settings.GRADIENT_COMPRESSION.name] = args.gradient_compression
    if args.profile:
        extra[settings.PROFILE.name] = args.profile
        folder = os.path.join(args.log_dir, "profile") if args.log_dir else "tfdist-profile"
        extra[settings.PROFILE_DIR.name] = os.path.abspath(folder)
    return extra or None


def launch_command(args) -> int:
    """Runs (or with `--dry-run`, prints) the job, on this machine or as this node's part of a
    multi-node job; returns `tfdist launch`'s exit code."""
    from tfdist import gpus
    from tfdist.launcher.outcome import exit_code
    from tfdist.launcher.rendezvous import RendezvousError

    multi_node = bool(args.rendezvous or args.nodes is not None)
    refusal = (_nodes_refusal(args) if multi_node else _refusal(args)) or _summary_refusal(args)
    if refusal:
        print(f"tfdist launch: error: {refusal}", file=sys.stderr)
        return 2
    script_args = _script_args(args)
    # a multi-node job's bad value or rendezvous is said as such; locally, the GPUs asked for
    errors = (ValueError, RendezvousError) if multi_node else (gpus.GpuError,)
    try:
        result = (_run_nodes if multi_node else _run_here)(args, script_args)
    except errors as err:
        print(f"tfdist launch: error: {err}", file=sys.stderr)
        return 2
    if result is None:  # --dry-run
        return 0
    if args.summary_json:
        _write_summary(args.summary_json, result, exit_code(result))
    return exit_code(result)


def _summary_refusal(args) -> Optional[str]:
    folder = os.path.dirname(os.path.abspath(args.summary_json)) if args.summary_json else ""
    if folder and not os.path.isdir(folder):
        return (
            f"--summary-json {args.summary_json}: the directory {folder} does not exist. HINT: "
            "create it first, or give a file in an existing directory."
        )
    return None


def _script_args(args) -> list:
    """The script's arguments (after a leading `--`); sets --stall-timeout for this process,
    the launcher, which reads it."""
    if args.stall_timeout is not None:
        os.environ[settings.STALL_TIMEOUT.name] = repr(args.stall_timeout)
    script_args = list(args.args)
    return script_args[1:] if script_args[:1] == ["--"] else script_args


def _run_here(args, script_args):
    """The job on this machine: its JobResult, or None after printing it (--dry-run)."""
    from tfdist import gpus
    from tfdist.launcher.job import plan_job
    from tfdist.launcher.restarts import launch_job

    job = dict(
        ps=args.ps,
        chief=args.chief,
        evaluator=args.evaluator,
        module=args.module,
        extra_env=_extra_env(args),
        gpus_per_worker=args.gpus_per_worker,
        evaluator_gpus=args.evaluator_gpus,
    )
    workers = args.workers
    if workers == "gpu":
        workers = gpus.worker_count(gpus.visible(), args.gpus_per_worker, args.evaluator_gpus)
    if args.dry_run:
        high = workers[1] if isinstance(workers, tuple) else workers
        for plan in plan_job(args.target, script_args, workers=high, **job):
            print(plan.describe())
        return None
    return launch_job(args.target, script_args, workers=workers, **job, **_run_control(args))


def _run_control(args) -> dict:
    """What a local and a multi-node job take alike from the flags: restarts, the bounds on
    their waits, where the logs go and how much the launcher says."""
    from tfdist.launcher.outcome import GRACE_SECONDS

    return dict(
        max_restarts=args.max_restarts,
        timeout=args.timeout,
        grace=GRACE_SECONDS if args.grace is None else args.grace,
        log_dir=args.log_dir,
        verbose=args.verbose,
    )


def _node_place(args):
    """(nodes, rank) of this node: the flags, else the SLURM allocation's, else None."""
    nodes = args.nodes if args.nodes is not None else _slurm_count("SLURM_NNODES")
    rank = args.node_rank if args.node_rank is not None else _slurm_count("SLURM_NODEID")
    return nodes, rank


def _nodes_refusal(args) -> Optional[str]:
    """Why `tfdist launch --nodes ...` cannot run these flags (with the fix), or None."""
    nodes, rank = _node_place(args)
    if not args.rendezvous or nodes is None or rank is None:
        return (
            "a multi-node job needs --nodes N, --node-rank R and --rendezvous HOST:PORT "
            "(under SLURM, --nodes and --node-rank default to the allocation's). HINT: e.g. "
            "tfdist launch --nodes 2 --node-rank 0 --rendezvous 10.0.0.1:29400 "
            "--workers-per-node 2 train.py"
        )
    if args.workers != 1 or args.ps or args.chief or args.evaluator or args.dry_run:
        return (
            "--workers, --ps, --chief, --evaluator and --dry-run are for a job on this machine; "
            "a multi-node job takes --workers-per-node and --ps-per-node (its chief runs on node "
            "0 where it has ps tasks). HINT: e.g. --nodes 2 --workers-per-node 2 --ps-per-node 1"
        )
    if not args.module and not os.path.exists(args.target):
        return _no_script(args)
    return None


def _run_nodes(args, script_args):
    """`tfdist launch --nodes N --node-rank R --rendezvous HOST:PORT ...`: this node's part."""
    from tfdist.launcher.nodes import launch_nodes

    nodes, rank = _node_place(args)
    return launch_nodes(
        args.target,
        script_args,
        nodes=nodes,
        node_rank=rank,
        rendezvous=args.rendezvous,
        workers_per_node=args.workers_per_node,
        ps_per_node=args.ps_per_node,
        token=args.token,
        node_address=args.node_address,
        module=args.module,
        rendezvous_timeout=args.rendezvous_timeout,
        extra_env=_extra_env(args),
        **_run_control(args),
        gpus_per_worker=args.gpus_per_worker,
    )


def _slurm_count(name: str) -> Optional[int]:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _write_summary(path: str, result, code: int) -> None:
    import json

    try:
        with open(path, "w") as f:
            json.dump(dict(result.as_dict(), exit_code=code), f, indent=1)
    except OSError as err:
        print(f"tfdist launch: cannot write --summary-json {path}: {err}", file=sys.stderr)


def horovodrun_command(args) -> int:
    """Runs the Horovod script as a local job; returns `tfdist launch`'s exit code for it."""
    from tfdist.horovod import run, shim
    from tfdist.launcher.outcome import exit_code
    from tfdist.launcher.restarts import launch_job

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
    return exit_code(launch_job(**launch))


def serve_command(args) -> int:
    """Runs this task (from TF_CONFIG) as a server until the job stops it."""
    from tfdist.strategy import serve

    serve()
    return 0
