"""Preemption: a SIGTERM ends training at a step every worker agrees on, after one backup.

Schedulers end a task with SIGTERM and a grace period (spot VMs, SLURM preemption, Kubernetes
evictions). With `tfdist.BackupAndRestore` among the callbacks of `model.fit` (or `tfdist.fit`),
a SIGTERM to any task of a job makes every worker stop after the same step, the chief write one
backup (weights, optimizer, epoch, step in the epoch, position in the input), and every task
exit with `PREEMPTED_EXIT_CODE`. Started again, the same command resumes at the next step.
On parameter_server the chief (the coordinator) alone stops, saves and exits on SIGTERM
(`parameter_server`); the worker and ps tasks end on SIGTERM, as on a kill.

This package's `__init__` imports nothing of TensorFlow: the launcher reads the exit code here.
"""

from __future__ import annotations

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted"]

# 128 + SIGTERM: what schedulers already treat as "ended by SIGTERM, may be retried" (Kubeflow's
# restartPolicy ExitCode retries 128-255; TensorFlow's PreemptionCheckpointHandler exits with
# it too). A process that died of the signal itself reports -15 to its parent (Popen), never
# 143, so the local launcher tells "saved, restart me" from "killed".
PREEMPTED_EXIT_CODE = 143


class Preempted(SystemExit):
    """Raised by `tfdist.BackupAndRestore` once the backup is saved after a SIGTERM: training
    stopped at a step every worker agreed on. Uncaught, the process exits with
    PREEMPTED_EXIT_CODE and no traceback (it is a SystemExit).

    Attributes:
        epoch: int. The interrupted epoch (0-based, as Keras counts).
        step: int. Steps of that epoch trained before the stop.
        backup_dir: str. Where the backup is.
    """

    def __init__(self, epoch: int, step: int, backup_dir: str):
        super().__init__(PREEMPTED_EXIT_CODE)
        self.epoch, self.step, self.backup_dir = epoch, step, backup_dir
