"""`tfdist tf-config`: the TF_CONFIG of one task of a cluster, or of every task (`--all`).

The cluster comes from the flags (`--worker h1:2222,h2:2222 --ps ...`), else from the
environment (TF_CONFIG, SLURM). Printed as a JSON line, or as `export TF_CONFIG='...'` lines
for batch scripts.
"""

from __future__ import annotations

import argparse
import shlex
from typing import List, Optional

from tfdist.cluster import ClusterConfigError, ClusterSpec, detect_cluster


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


def add_commands(sub) -> None:
    """Adds `tf-config` (alias `tf_config`) to the subparsers `sub`."""
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


def _cluster(args) -> ClusterSpec:
    """The cluster the flags give, else the one detected; raises for no cluster at all."""
    workers, ps = _hosts(args.worker), _hosts(args.ps)
    if workers or ps or args.chief or args.evaluator:
        return ClusterSpec.from_hosts(
            workers=workers,
            ps=ps,
            chief=args.chief,
            evaluator=args.evaluator,
            task_type="chief" if args.chief else "worker",
        )
    spec = detect_cluster()
    if spec.is_single_process:
        raise ClusterConfigError(
            "No cluster: give its tasks, e.g. `tfdist tf-config --worker h1:2222,h2:2222 "
            "--all`, or set TF_CONFIG / run inside srun."
        )
    return spec


def tf_config_command(args) -> int:
    """Prints the TF_CONFIG of the tasks asked for; returns the exit code (0)."""
    spec = _cluster(args)
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
