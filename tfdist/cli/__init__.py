"""The `tfdist` command (also `python -m tfdist`): the top of tfdist, which imports its parts.

    tfdist env [--json]                      versions, devices, cluster, the "auto" strategy
    tfdist tf-config --worker h:p,h:p ...    TF_CONFIG of one task, or of every task (--all)
    tfdist launch --workers 2 train.py ...   run a script as a local multi-process job
    tfdist horovodrun -np 2 python train.py  run a Horovod script as a local job (tfdist.horovod)
    tfdist serve                             run this task as a parameter-server job's server
    tfdist doctor                            env report + a real 2-process smoke test
    tfdist verify model.py                   train the script's model under every strategy:
                                             the same as on one device, step by step?

Flags accept hyphens or underscores (--max-restarts / --max_restarts). One module per command
group: `environment` (env), `tf_config`, `launch` (launch, horovodrun, serve), `doctor`,
`verify`; `arguments` holds the argument types they share.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from tfdist.cli import doctor, environment, launch, tf_config, verify
from tfdist.cluster import ClusterConfigError

__all__ = ["build_parser", "main"]

# Each command (its name with hyphens) -> the function that runs it and returns the exit code.
_COMMANDS = {
    "env": environment.env_command,
    "tf-config": tf_config.tf_config_command,
    "launch": launch.launch_command,
    "horovodrun": launch.horovodrun_command,
    "serve": launch.serve_command,
    "doctor": doctor.doctor_command,
    "verify": verify.verify_command,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every `tfdist` command, in the order `tfdist --help` lists them."""
    parser = argparse.ArgumentParser(
        prog="tfdist", description="Distributed TensorFlow training with Keras."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for group in (environment, tf_config, launch, doctor, verify):
        group.add_commands(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the `tfdist` command `argv` (default: the process's arguments).

    Returns:
        int: the exit code; 2 for a cluster configuration error, which is printed.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command.replace("_", "-")](args)
    except ClusterConfigError as err:
        print(f"tfdist {args.command}: error: {err}", file=sys.stderr)
        return 2
