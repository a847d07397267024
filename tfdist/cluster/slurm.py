"""SLURM: the cluster of a task of an `srun` step, from SLURM's variables.

`SlurmEnvironment` implements the `tfdist.cluster.environments.Environment` protocol; its node
list and tasks-per-node parsers (`expand_nodelist`, `expand_tasks_per_node`) are public, for
batch scripts that need the hosts themselves.

Imports the spec, tfdist.errors and tfdist.settings; never TensorFlow.
"""

from __future__ import annotations

import os
import re
from typing import List, Mapping, Optional, Tuple

from tfdist import settings
from tfdist.cluster import spec
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import ClusterConfigError

__all__ = ["SlurmEnvironment", "expand_nodelist", "expand_tasks_per_node", "unbound_gpu_tasks"]

_NODELIST_HINT = "SLURM writes node lists like 'gpu-a[01-03,07],cpu1' (scontrol show hostnames)."


class SlurmEnvironment:
    """A task of a SLURM `srun` step.

    Reads SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE
    (and SLURM_STEP_NUM_NODES when present, to check the node list). Tasks are laid out in rank
    order, in block distribution (srun's default): the first node's tasks get the lowest ranks.
    Task `r` on its node listens on `port + local_index`.

    Roles: without parameter servers every task is a worker (rank 0 is worker 0, which leads).
    With `num_ps` parameter servers, rank 0 is the chief (the coordinator), ranks 1..num_ps are
    the ps tasks, and the rest are workers.

    Settings (explicit argument > environment variable > default):
        num_ps: TFDIST_NUM_PS, default 0.
        port: TFDIST_SLURM_PORT, default 8888.
    """

    name = "slurm"

    # Job names of interactive allocations (`srun --pty bash`): the shell itself is not a
    # training task, the job it starts is.
    _INTERACTIVE_JOB_NAMES = ("bash", "interactive", "sh", "zsh")

    @classmethod
    def detect(cls, env: Optional[Mapping[str, str]] = None) -> bool:
        env = os.environ if env is None else env
        in_step = "SLURM_STEP_ID" in env and "SLURM_PROCID" in env
        interactive = env.get("SLURM_JOB_NAME", "") in cls._INTERACTIVE_JOB_NAMES
        return in_step and not interactive

    @classmethod
    def cluster_spec(
        cls,
        env: Optional[Mapping[str, str]] = None,
        num_ps: Optional[int] = None,
        port: Optional[int] = None,
    ) -> ClusterSpec:
        env = os.environ if env is None else env
        rank = _int_var(env, "SLURM_PROCID")
        ntasks = _int_var(env, "SLURM_STEP_NUM_TASKS", fallback="SLURM_NTASKS")
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise ClusterConfigError(
                "SLURM_STEP_NODELIST is not set. HINT: start the job with `srun`, which sets "
                "the step variables for every task."
            )
        nodes = expand_nodelist(nodelist)
        if "SLURM_STEP_NUM_NODES" in env:
            num_nodes = _int_var(env, "SLURM_STEP_NUM_NODES")
            if len(nodes) != num_nodes:
                raise ClusterConfigError(
                    f"SLURM_STEP_NODELIST={nodelist!r} names {len(nodes)} node(s), but "
                    f"SLURM_STEP_NUM_NODES={num_nodes}. HINT: the two must agree; check the srun "
                    "arguments (--nodes)."
                )
        per_node_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        if per_node_text:
            per_node = expand_tasks_per_node(per_node_text)
        elif ntasks % len(nodes) == 0:
            per_node = [ntasks // len(nodes)] * len(nodes)
        else:
            raise ClusterConfigError(
                f"SLURM_STEP_TASKS_PER_NODE is not set and {ntasks} tasks do not split evenly "
                f"over {len(nodes)} nodes. HINT: run under srun, which sets it."
            )
        if len(per_node) != len(nodes):
            raise ClusterConfigError(
                f"SLURM_STEP_TASKS_PER_NODE={per_node_text!r} describes {len(per_node)} node(s) "
                f"but SLURM_STEP_NODELIST={nodelist!r} names {len(nodes)}. HINT: are the "
                "variables from two different steps?"
            )
        if sum(per_node) != ntasks:
            raise ClusterConfigError(
                f"SLURM_STEP_TASKS_PER_NODE={per_node_text!r} adds up to {sum(per_node)} tasks, "
                f"but SLURM_STEP_NUM_TASKS={ntasks}. HINT: are the variables from two different "
                "steps? Run under srun, which sets them together."
            )
        if rank >= ntasks:
            raise ClusterConfigError(
                f"SLURM_PROCID={rank} is not below SLURM_STEP_NUM_TASKS={ntasks}. HINT: the "
                "rank must be 0 to ntasks - 1; are the variables from two different steps?"
            )
        num_ps = _setting(num_ps, env, settings.NUM_PS, "num_ps")
        port = _setting(port, env, settings.SLURM_PORT, "port")
        if not 1 <= port <= 65535 - max(per_node) + 1:
            raise ClusterConfigError(
                f"SLURM base port {port} leaves no room for {max(per_node)} task(s) per node "
                "(ports must be 1 to 65535). HINT: set TFDIST_SLURM_PORT or port=."
            )
        if num_ps and ntasks < num_ps + 2:
            raise ClusterConfigError(
                f"num_ps={num_ps} needs at least {num_ps + 2} SLURM tasks (a chief, {num_ps} ps "
                f"and at least one worker), but the step has {ntasks}. HINT: raise --ntasks or "
                "lower num_ps / TFDIST_NUM_PS."
            )
        addresses = [
            f"{node}:{port + local}"
            for node, count in zip(nodes, per_node)
            for local in range(count)
        ]
        if num_ps:
            roles = (
                [("chief", 0)]
                + [("ps", i) for i in range(num_ps)]
                + [("worker", i) for i in range(ntasks - num_ps - 1)]
            )
            cluster = {
                "chief": addresses[:1],
                "worker": addresses[num_ps + 1 :],
                "ps": addresses[1 : num_ps + 1],
            }
        else:
            roles = [("worker", i) for i in range(ntasks)]
            cluster = {"worker": addresses}
        task_type, task_index = roles[rank]
        return ClusterSpec(cluster, task_type, task_index)


spec._ENVIRONMENT_READERS["slurm"] = SlurmEnvironment.cluster_spec


def expand_nodelist(nodelist: str) -> List[str]:
    """Expands a SLURM hostlist expression into host names, in order.

    Handles comma lists, ranges with zero padding, and several bracket groups per name:
    `"gpu-a[01-03,07],cpu[1-2]"` -> gpu-a01, gpu-a02, gpu-a03, gpu-a07, cpu1, cpu2;
    `"r[1-2]n[1-2]"` -> r1n1, r1n2, r2n1, r2n2.

    Raises:
        ClusterConfigError: unbalanced brackets, an empty name or a decreasing range.
    """
    if not isinstance(nodelist, str) or not nodelist.strip():
        raise ClusterConfigError(
            f"Empty SLURM node list. Received: {nodelist!r}. HINT: {_NODELIST_HINT}"
        )
    hosts: List[str] = []
    for item in _split_top_level(nodelist.strip(), nodelist):
        hosts.extend(_expand_host(item, nodelist))
    return hosts


def _split_top_level(text: str, whole: str) -> List[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ClusterConfigError(
                    f"Nested '[' in SLURM node list {whole!r}. HINT: {_NODELIST_HINT}"
                )
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ClusterConfigError(
                    f"Unbalanced ']' in SLURM node list {whole!r}. HINT: {_NODELIST_HINT}"
                )
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ClusterConfigError(
            f"Unbalanced '[' in SLURM node list {whole!r}. HINT: {_NODELIST_HINT}"
        )
    items.append(text[start:])
    for item in items:
        if not item.strip():
            raise ClusterConfigError(
                f"Empty host name in SLURM node list {whole!r}. HINT: {_NODELIST_HINT}"
            )
    return [item.strip() for item in items]


def _expand_host(pattern: str, whole: str) -> List[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if not match:
        return [pattern]
    prefix, suffix = pattern[: match.start()], pattern[match.end() :]
    out = []
    for part in match.group(1).split(","):
        part = part.strip()
        bounds = part.split("-")
        if len(bounds) == 1 and bounds[0].isdigit():
            values = [bounds[0]]
        elif len(bounds) == 2 and bounds[0].isdigit() and bounds[1].isdigit():
            low, high = int(bounds[0]), int(bounds[1])
            if low > high:
                raise ClusterConfigError(
                    f"Decreasing range {part!r} in SLURM node list {whole!r}. HINT: write "
                    "ranges low-high, e.g. 01-04."
                )
            width = len(bounds[0])
            values = [str(v).zfill(width) for v in range(low, high + 1)]
        else:
            raise ClusterConfigError(
                f"{part!r} in SLURM node list {whole!r} is not a number or a range like 01-04. "
                f"HINT: {_NODELIST_HINT}"
            )
        for value in values:
            out.extend(_expand_host(prefix + value + suffix, whole))
    return out


def expand_tasks_per_node(text: str) -> List[int]:
    """Expands SLURM_STEP_TASKS_PER_NODE, e.g. "2(x3),1" -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for part in str(text).split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ClusterConfigError(
                f"SLURM tasks-per-node value {text!r} is not like '2(x3),1'. HINT: use the "
                "value srun sets (SLURM_STEP_TASKS_PER_NODE)."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def unbound_gpu_tasks(env: Mapping[str, str]) -> Optional[Tuple[int, int]]:
    """(local rank, tasks on its node) of a task of an `srun` step whose tasks on a node all see
    the same GPUs; None where SLURM bound GPUs to tasks, outside a step, or alone on its node.

    srun binds GPUs only when asked (`--gpus-per-task`, or a `--gpu-bind` other than none):
    otherwise every task of a node sees every GPU of the allocation, and the first to start
    reserves their memory (`tfdist.gpus.share` says which each takes). Variables that do not
    parse give None: `SlurmEnvironment` names what is wrong with them.
    """
    if "SLURM_STEP_ID" not in env or "SLURM_LOCALID" not in env:
        return None
    bind = env.get("SLURM_GPU_BIND", "").strip().lower()
    if env.get("SLURM_GPUS_PER_TASK") or (bind and "none" not in bind):
        return None
    try:
        counts = expand_tasks_per_node(
            env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
        )
        node, local = int(env.get("SLURM_NODEID", "0")), int(env["SLURM_LOCALID"])
        tasks = counts[node] if node < len(counts) else counts[-1]
    except (ClusterConfigError, ValueError):
        return None
    if tasks < 2 or not 0 <= local < tasks:
        return None
    return local, tasks


def _int_var(env: Mapping[str, str], name: str, fallback: Optional[str] = None) -> int:
    value = env.get(name)
    used = name
    if value is None and fallback:
        value, used = env.get(fallback), fallback
    if value is None:
        raise ClusterConfigError(
            f"{name} is not set. HINT: this must run as a task of an `srun` step."
        )
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ClusterConfigError(
            f"{used}={value!r} is not an integer. HINT: run the task under srun, which sets it."
        ) from None
    if number < 0:
        raise ClusterConfigError(
            f"{used}={value!r} must not be negative. HINT: run the task under srun, which sets it."
        )
    return number


def _setting(explicit, env: Mapping[str, str], setting: settings.Setting, arg: str) -> int:
    """The argument `arg` when given (a non-negative integer), else the variable, else default."""
    if explicit is None:
        try:
            return setting.get(env)
        except ValueError as err:
            raise ClusterConfigError(str(err)) from None
    try:
        number = int(explicit)
        if isinstance(explicit, bool) or number < 0 or str(number) != str(explicit).strip():
            raise ValueError
    except (TypeError, ValueError):
        raise ClusterConfigError(f"{arg}={explicit!r} must be a non-negative integer.") from None
    return number
