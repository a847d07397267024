"""Local jobs: run a script as a multi-process TensorFlow job on loopback.

- `job`: one attempt of a job: `plan_job` (pure: the cluster and each task's command and
  TF_CONFIG), `run_job` (the processes, their output, stopping them all).
- `outcome`: what became of a job: `TaskResult`, `JobResult`, `JobFailed`, the summary, the
  exit code of `tfdist launch` and the failure and preemption messages.
- `restarts`: `launch` (both, with restarts after a failure or a preemption, and elastic jobs).
- `noise`: which lines of a task are TensorFlow's start-up noise, hidden from the terminal.
- `smoke_job`: the 2-process job `tfdist doctor` runs.
- `run_function`: the child side of `tfdist.testing.run_cluster` and `notebook_launch` (one
  function in one task).
- `nodes`: `launch_nodes`, one node's part of a job across machines (`tfdist launch --nodes`);
  `rendezvous`: where the nodes agree on the cluster and on every stop and restart.
- `notebook`: `notebook_launch`, a function defined in a notebook cell run as a local job.

Which GPUs each task sees is `tfdist.gpus`. The tasks run in a private network namespace
(`tfdist.netns`) where the system allows it.
Nothing here imports TensorFlow at import time.
"""

from tfdist.launcher.job import TaskPlan, plan_job, run_job
from tfdist.launcher.outcome import JobFailed, JobResult, TaskResult
from tfdist.launcher.restarts import launch

__all__ = ["JobFailed", "JobResult", "TaskPlan", "TaskResult", "launch", "plan_job", "run_job"]
