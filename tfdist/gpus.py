"""Which GPUs each task of a local job sees: one task per GPU, or K GPUs per task.

The GPUs a launcher hands out are the ones it was given: `CUDA_VISIBLE_DEVICES` when set (a
scheduler's choice is kept, in its order; ids, UUIDs or MIG names), else every GPU that
`nvidia-smi` lists; TFDIST_GPUS=N stands for N GPUs (0 to N-1), so that a CPU host plans a job
as a GPU host would. The tasks that train (the workers, and the chief where it trains: not in
a parameter-server job, where it coordinates) each get their own GPUs, in task order, as their
`CUDA_VISIBLE_DEVICES`; ps tasks, a parameter-server job's chief and the evaluator get none
(an empty `CUDA_VISIBLE_DEVICES`), unless the evaluator is given some.

How many per task (`--gpus-per-worker`): "auto" (the default) shares the GPUs out evenly, and
refuses a job with more training tasks than GPUs; a number K gives each K; "shared" lets every
training task see every GPU, each then taking only the memory it uses
(`TF_FORCE_GPU_ALLOW_GROWTH=true`, unless TFDIST_GPU_MEMORY_GROWTH=0) and all-reducing on the
ring (`TFDIST_COMMUNICATION=ring`: NCCL refuses two ranks on one GPU). On a host without GPUs
nothing is set. `--workers gpu` starts one training task per K GPUs. `PINNED`, not a value
users give, is `tfdist horovodrun`'s: every process sees every GPU (with memory growth) and
pins one itself, by its local rank, so it keeps NCCL, and more processes than GPUs are refused.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfdist import settings

__all__ = [
    "AUTO",
    "PINNED",
    "SHARED",
    "GpuError",
    "assign",
    "check_one_per_gpu",
    "describe",
    "per_worker",
    "plan",
    "share",
    "visible",
    "worker_count",
]

AUTO, SHARED = "auto", "shared"


class _Pinned:
    """`PINNED`: each process sees every GPU and pins one itself, by its local rank."""

    def __repr__(self) -> str:
        return "tfdist.gpus.PINNED"


# Not a `--gpus-per-worker` spelling (a task that pins nothing would replicate over every
# GPU): the mode `tfdist horovodrun` passes, whose processes pin their GPU in `hvd.init()`.
PINNED = _Pinned()
PerWorker = Union[int, str, _Pinned]  # K >= 1, AUTO, SHARED or PINNED
_PROBE_SECONDS = 20


class GpuError(ValueError):
    """A job whose tasks cannot get the GPUs asked for; raised before any task starts."""


def visible(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The GPUs this launcher may hand out, as `CUDA_VISIBLE_DEVICES` entries, in order."""
    env = os.environ if env is None else env
    simulated = settings.GPUS.get(env)
    if simulated is not None:
        return [str(i) for i in range(simulated)]
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        entries = [entry.strip() for entry in given.split(",") if entry.strip()]
        # CUDA stops at the first invalid entry; -1 (any negative id) hides every GPU
        cut = next((i for i, e in enumerate(entries) if e.startswith("-")), len(entries))
        return entries[:cut]
    return _nvidia_smi()


def _nvidia_smi() -> List[str]:
    return [row[0] for row in _query("index") if row[0].isdigit()]


def _query(fields: str) -> List[List[str]]:
    """nvidia-smi's rows for `fields` (CSV, no header, no units); [] without a working one."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        listed = subprocess.run(
            [tool, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=_PROBE_SECONDS,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []  # a driver that does not answer: no GPU the tasks could use either
    return [[cell.strip() for cell in line.split(",")] for line in listed.splitlines() if line]


def describe() -> List[Dict[str, object]]:
    """The GPUs the driver lists (nvidia-smi), for `tfdist env`: index, name, compute
    capability ("8.0"; None where the driver does not say) and memory in MiB."""
    rows = _query("index,name,memory.total,compute_cap")
    if not rows:  # drivers before 510 do not know compute_cap
        rows = [row + ["[N/A]"] for row in _query("index,name,memory.total")]
    out = []
    for row in rows:
        if len(row) != 4 or not row[0].isdigit():
            continue
        index, name, memory, capability = row
        out.append(
            {
                "index": int(index),
                "name": name,
                "memory_mib": int(memory) if memory.isdigit() else None,
                "compute_capability": capability if capability[:1].isdigit() else None,
            }
        )
    return out


def per_worker(value) -> PerWorker:
    """`--gpus-per-worker`: "auto", "shared" or a whole number >= 1 (int or text); `PINNED`
    passes as it is."""
    if value is PINNED:
        return PINNED
    if isinstance(value, str) and value.strip().lower() in (AUTO, SHARED):
        return value.strip().lower()
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise GpuError(
            f"gpus per worker must be a whole number >= 1, 'auto' or 'shared'. Received: "
            f"{value!r}. HINT: 1 gives each worker its own GPU; 'shared' lets the workers share "
            "every GPU, each with the memory it uses."
        )
    return int(text)


def worker_count(gpus: Sequence[str], per: PerWorker = AUTO, evaluator_gpus: int = 0) -> int:
    """The workers of `--workers gpu`: one per `per` GPUs (1 for "auto")."""
    each = 1 if per in (AUTO, SHARED, PINNED) else int(per)
    usable = len(gpus) - evaluator_gpus
    if usable < each:
        raise GpuError(
            f"--workers gpu starts one worker per {each} GPU(s), and this launcher was given "
            f"{_seen(gpus)}{_after_evaluator(evaluator_gpus)}. HINT: run it where GPUs are "
            "visible (nvidia-smi lists them; CUDA_VISIBLE_DEVICES, when set, names them), or "
            "give a number of workers, e.g. --workers 2."
        )
    return usable // each


def trainers(tasks: Sequence[Tuple[str, int]], ps: int) -> List[str]:
    """The tasks that train on GPUs: the workers, and the chief outside a ps job."""
    return [
        f"{job}:{index}" for job, index in tasks if job == "worker" or (job == "chief" and not ps)
    ]


def assign(
    tasks: Sequence[Tuple[str, int]],
    ps: int,
    gpus: Sequence[str],
    per: PerWorker = AUTO,
    evaluator_gpus: int = 0,
) -> Dict[str, Optional[str]]:
    """Each task's CUDA_VISIBLE_DEVICES ("" for none; None: leave it as the launcher's).

    Raises:
        GpuError: more GPUs asked for than the launcher was given, or (with "auto") more
            training tasks than GPUs.
    """
    training = trainers(tasks, ps)
    names = [f"{job}:{index}" for job, index in tasks]
    if not gpus:
        if evaluator_gpus or per not in (AUTO, SHARED, PINNED):
            raise GpuError(_too_few(len(training), per, evaluator_gpus, gpus))
        return {name: None for name in names}  # a CPU host: nothing to hand out
    every = ",".join(gpus)
    if per is PINNED:
        check_one_per_gpu(len(training), gpus)
    if per in (SHARED, PINNED):
        out = {name: (every if name in training else "") for name in names}
        if "evaluator:0" in out and evaluator_gpus:
            out["evaluator:0"] = ",".join(gpus[:evaluator_gpus])
        return out
    usable = len(gpus) - evaluator_gpus
    each = usable // max(len(training), 1) if per == AUTO else int(per)
    if each < 1 or each * len(training) > usable:
        raise GpuError(_too_few(len(training), per, evaluator_gpus, gpus))
    out = {name: "" for name in names}
    for i, name in enumerate(training):
        out[name] = ",".join(gpus[i * each : (i + 1) * each])
    if "evaluator:0" in out:
        out["evaluator:0"] = ",".join(gpus[len(gpus) - evaluator_gpus :])
    return out


def plan(
    tasks: Sequence[Tuple[str, int]],
    ps: int,
    per: PerWorker = AUTO,
    evaluator_gpus: int = 0,
    gpus: Optional[Sequence[str]] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Dict[str, Dict[str, str]]:
    """Each task's GPU variables: CUDA_VISIBLE_DEVICES (from `assign`, over `gpus`, default
    `visible(env)`); where a task sees the GPUs of another (SHARED, PINNED),
    TF_FORCE_GPU_ALLOW_GROWTH (memory; not with TFDIST_GPU_MEMORY_GROWTH=0); where it also
    replicates over all of them (SHARED), TFDIST_COMMUNICATION=ring (NCCL fails with "Duplicate
    GPU detected" when two ranks use one GPU; PINNED tasks each use their own, so they keep
    NCCL); a value of the caller's own of either variable is kept; CUDA_DEVICE_ORDER=PCI_BUS_ID
    where the ids are nvidia-smi's (CUDA's own order differs).

    Raises:
        GpuError: as `assign`.
    """
    env = os.environ if env is None else env
    found = visible(env) if gpus is None else list(gpus)
    together = per in (SHARED, PINNED) and len(trainers(tasks, ps)) > 1
    growth = together and settings.GPU_MEMORY_GROWTH.get(env)
    shared = together and per == SHARED
    from_smi = gpus is None and "CUDA_VISIBLE_DEVICES" not in env and settings.GPUS.get(env) is None
    out = {}
    for name, devices in assign(tasks, ps, found, per, evaluator_gpus).items():
        variables = {} if devices is None else {"CUDA_VISIBLE_DEVICES": devices}
        if devices and growth:
            variables["TF_FORCE_GPU_ALLOW_GROWTH"] = env.get("TF_FORCE_GPU_ALLOW_GROWTH", "true")
        if devices and shared:
            variables[settings.COMMUNICATION.name] = env.get(settings.COMMUNICATION.name, "ring")
        if devices and from_smi and "CUDA_DEVICE_ORDER" not in env:
            variables["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        out[name] = variables
    return out


def share(seen: int, tasks: int, local: int) -> Tuple[List[int], bool]:
    """The GPUs the task of local rank `local` of `tasks` tasks on a node takes of the `seen`
    GPUs they all see, and whether it shares them with another task: the local-th tasks-th of
    them, in order; with fewer GPUs than tasks, every task takes all and shares them (it then
    grows its memory, unless TFDIST_GPU_MEMORY_GROWTH=0, and all-reduces on the ring where
    communication is "auto": `tfdist.strategy.devices.slurm_tasks_share_gpus`).

    For tasks that a scheduler started seeing the same GPUs (`tfdist.cluster.slurm.
    unbound_gpu_tasks`); tfdist launch hands each task its own CUDA_VISIBLE_DEVICES instead.
    """
    if seen < tasks:
        return list(range(seen)), True
    each = seen // tasks
    return list(range(local * each, (local + 1) * each)), False


def check_one_per_gpu(processes: int, gpus: Sequence[str]) -> None:
    """Refuses more processes than `gpus` where each pins one GPU by its local rank (PINNED;
    a host without GPUs runs any number on its CPUs).

    Raises:
        GpuError: naming the GPUs seen and the fix.
    """
    if gpus and processes > len(gpus):
        raise GpuError(
            f"{processes} processes each pin one GPU (the one of their local rank), and this "
            f"launcher was given {_seen(gpus)}. HINT: start one process per GPU (tfdist "
            f"horovodrun -np gpu, here -np {len(gpus)}); CUDA_VISIBLE_DEVICES= (empty) runs "
            "them all on the CPUs."
        )


def _seen(gpus: Sequence[str]) -> str:
    if not gpus:
        return "no GPU"
    return f"{len(gpus)} GPU(s) ({','.join(gpus)})"


def _after_evaluator(evaluator_gpus: int) -> str:
    return f", {evaluator_gpus} of them for the evaluator" if evaluator_gpus else ""


def _too_few(training: int, per: PerWorker, evaluator_gpus: int, gpus: Sequence[str]) -> str:
    each = 1 if per == AUTO else per
    need = training * int(each) + evaluator_gpus
    return (
        f"{training} training task(s) with {each} GPU(s) each"
        f"{f' and {evaluator_gpus} for the evaluator' if evaluator_gpus else ''} need {need} "
        f"GPU(s), and this launcher was given {_seen(gpus)}. HINT: --workers gpu starts one "
        "worker per GPU; --gpus-per-worker shared lets the workers share the GPUs (each with "
        "the memory it uses); CUDA_VISIBLE_DEVICES= (empty) trains on CPUs."
    )
