"""`tfdist horovodrun`: Horovod's launcher, for the processes of one machine.

`tfdist horovodrun -np 2 python train.py` starts 2 processes of `train.py` on loopback, as
`tfdist launch --workers 2` does (TF_CONFIG, bounded start-up, clean output, SIGTERM to all),
with TFDIST_HOROVOD_SHIM=1, so that the script's `import horovod.tensorflow(.keras)` gives
tfdist's modules where Horovod is not installed, and Horovod's variables (HOROVOD_RANK,
HOROVOD_SIZE, HOROVOD_LOCAL_RANK, ...) set in each process at start-up from its TF_CONFIG.

horovodrun's common flags are accepted: `-np`, `-H`/`--hosts` and `--hostfile` (hosts of this
machine only: a job across machines starts one process per slot with SLURM's `srun` or its own
TF_CONFIG), `--start-timeout`, `--output-filename`, `--verbose`; the tuning and transport flags
(`--gloo`, `--mpi`, `--fusion-threshold-mb`, `--cycle-time-ms`, ...) are accepted and have no
effect; `--timeline-filename` is refused (no timeline: use TensorFlow's profiler).

On a GPU host every process sees every GPU and pins the one of its local rank in `hvd.init()`
(`tfdist.gpus.PINNED`): `-np gpu` starts one per GPU, more processes than GPUs are refused
before any starts, and no process is pushed off NCCL (each has a GPU of its own).

Imports nothing of TensorFlow.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import List, Mapping, Optional, Sequence, Tuple

from tfdist import gpus, settings
from tfdist.horovod.process import Ranks, ranks_from_environment

__all__ = [
    "LOCAL_HOSTS",
    "horovod_environment",
    "parse_hosts",
    "python_command",
    "read_hostfile",
]

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


class HorovodrunError(ValueError):
    """A horovodrun command line tfdist cannot run; the message names the value and the fix."""


def _this_machine() -> set:
    names = set(LOCAL_HOSTS)
    for name in (socket.gethostname(), socket.getfqdn()):
        names.add(name)
        names.add(name.split(".")[0])
    return names


def parse_hosts(text: str) -> List[Tuple[str, int]]:
    """[(host, slots)] from horovodrun's `-H host1:2,host2:4` (slots default to 1)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, _, slots = part.rpartition(":") if ":" in part else (part, "", "1")
        if not host or not slots.isdigit() or int(slots) < 1:
            raise HorovodrunError(
                f"-H {text!r}: {part!r} is not HOST or HOST:SLOTS with SLOTS >= 1. HINT: "
                "-H localhost:2"
            )
        out.append((host, int(slots)))
    if not out:
        raise HorovodrunError(f"-H {text!r} names no host. HINT: -H localhost:2")
    return out


def read_hostfile(path: str) -> List[Tuple[str, int]]:
    """[(host, slots)] from a hostfile: one `host slots=N` (or `host`) per line."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError as err:
        raise HorovodrunError(f"--hostfile {path!r} cannot be read: {err}.") from err
    out = []
    for number, line in enumerate(lines, 1):
        words = line.split("#")[0].split()
        if not words:
            continue
        slots = 1
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "max_slots") and value.isdigit() and int(value) >= 1:
                slots = int(value) if key == "slots" else slots
            else:
                raise HorovodrunError(
                    f"--hostfile {path!r} line {number}: {line!r} is not `HOST slots=N`."
                )
        out.append((words[0], slots))
    if not out:
        raise HorovodrunError(f"--hostfile {path!r} names no host.")
    return out


def check_local(hosts: Sequence[Tuple[str, int]], num_proc: int) -> None:
    """Every host must be this machine, with slots for `num_proc` processes."""
    here = _this_machine()
    remote = [host for host, _ in hosts if host not in here]
    if remote:
        raise HorovodrunError(
            f"tfdist horovodrun runs the processes of this machine only; {', '.join(remote)} "
            "is another host. HINT: across machines, start one process per slot with SLURM's "
            "`srun` (tfdist reads its variables) or give each its own TF_CONFIG (`tfdist "
            "tf-config`); `import tfdist.horovod.tensorflow as hvd` then works in each."
        )
    slots = sum(n for _, n in hosts)
    if slots < num_proc:
        raise HorovodrunError(
            f"-np {num_proc} needs {num_proc} slots, but the hosts give {slots}. HINT: -H "
            f"localhost:{num_proc}"
        )


def python_command(command: Sequence[str]) -> Tuple[str, str, List[str], bool]:
    """(python, target, args, is_module) from `python [-u] train.py ARGS` / `python -m mod`.

    Raises:
        HorovodrunError: the command is not a Python program.
    """
    command = list(command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise HorovodrunError("No command to run. HINT: tfdist horovodrun -np 2 python train.py")
    first = command[0]
    if first.endswith(".py"):
        return sys.executable, first, command[1:], False
    name = os.path.basename(first)
    if not name.startswith("python"):
        raise HorovodrunError(
            f"tfdist horovodrun runs Python programs; {first!r} is not a Python interpreter. "
            "HINT: tfdist horovodrun -np 2 python train.py"
        )
    python = sys.executable if first in ("python", "python3") else first
    rest = command[1:]
    while rest and rest[0] in ("-u", "-B", "-O", "-OO"):
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return python, rest[1], rest[2:], True
    if not rest or rest[0].startswith("-"):
        raise HorovodrunError(
            f"{' '.join(command)!r}: tfdist horovodrun needs a script or -m module after "
            "the interpreter. HINT: tfdist horovodrun -np 2 python train.py"
        )
    if not os.path.exists(rest[0]):
        raise HorovodrunError(
            f"script {rest[0]!r} does not exist. HINT: give the path of the training script."
        )
    return python, rest[0], rest[1:], False


def horovod_environment(ranks: Ranks) -> Mapping[str, str]:
    """Horovod's variables for a process of `ranks`."""
    return {
        "HOROVOD_RANK": str(ranks.rank),
        "HOROVOD_SIZE": str(ranks.size),
        "HOROVOD_LOCAL_RANK": str(ranks.local_rank),
        "HOROVOD_LOCAL_SIZE": str(ranks.local_size),
        "HOROVOD_CROSS_RANK": str(ranks.cross_rank),
        "HOROVOD_CROSS_SIZE": str(ranks.cross_size),
        "HOROVOD_HOSTNAME": socket.gethostname(),
    }


def set_horovod_environment(env: Optional[dict] = None) -> None:
    """Sets Horovod's variables in `env` (default `os.environ`) from this process's TF_CONFIG,
    where no launcher set them (the start-up module runs this under `tfdist horovodrun`)."""
    env = os.environ if env is None else env
    if "HOROVOD_RANK" in env:
        return
    env.update(horovod_environment(ranks_from_environment(env)))


def launch_settings(args) -> dict:
    """The keyword arguments of `tfdist.launcher.restarts.launch_job` for parsed horovodrun flags.

    Raises:
        HorovodrunError: a flag or the command tfdist cannot run.
    """
    if args.timeline_filename:
        raise HorovodrunError(
            f"--timeline-filename {args.timeline_filename!r}: tfdist's Horovod API has no "
            "timeline. HINT: profile with TensorFlow's profiler "
            "(tf.profiler.experimental.start(logdir)) and TensorBoard."
        )
    seen = gpus.visible()
    if args.num_proc == "gpu":
        args.num_proc = len(seen)
        if not args.num_proc:
            raise HorovodrunError(
                "-np gpu starts one process per GPU, and this machine shows none (nvidia-smi "
                "lists none, or CUDA_VISIBLE_DEVICES names none). HINT: give a number, e.g. -np 2."
            )
    if args.num_proc < 1:
        raise HorovodrunError(f"-np must be >= 1 (received -np {args.num_proc}).")
    try:  # each process pins the GPU of its local rank (hvd.init()): one GPU each at most
        gpus.check_one_per_gpu(args.num_proc, seen)
    except gpus.GpuError as err:
        raise HorovodrunError(f"-np {args.num_proc}: {err}") from err
    if args.hosts and args.hostfile:
        raise HorovodrunError("Give -H or --hostfile, not both.")
    hosts = (
        parse_hosts(args.hosts)
        if args.hosts
        else read_hostfile(args.hostfile)
        if args.hostfile
        else [("localhost", args.num_proc)]
    )
    check_local(hosts, args.num_proc)
    python, target, script_args, module = python_command(args.program)
    extra = {settings.HOROVOD_SHIM.name: "1"}
    if args.start_timeout is not None:
        extra[settings.STARTUP_TIMEOUT.name] = f"{args.start_timeout:g}"
    return dict(
        target=target,
        args=script_args,
        workers=args.num_proc,
        module=module,
        extra_env=extra,
        log_dir=args.output_filename,
        verbose=True if args.verbose else None,
        timeout=args.timeout,
        python=python,
        # as horovodrun: every process sees every GPU and pins its own (hvd.local_rank()),
        # taking only the memory it uses; one GPU each, so NCCL stays (no ring, unlike SHARED)
        gpus_per_worker=gpus.PINNED,
    )
