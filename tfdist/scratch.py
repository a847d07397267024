"""A task's scratch files: where tfdist writes what only this process reads, and for how long.

Non-chief workers write their copy of every checkpoint and backup (saving reads distributed
variables collectively, so every worker saves) into a temporary directory that they remove
right after. A worker killed during that save (a fault, `kill -9`, the out-of-memory killer)
cannot remove it, and a checkpoint the size of the model would be left in TMPDIR at every
such death. Under `tfdist launch` each task's keeper (`tfdist.launcher.keeper`) therefore
makes a directory of the task's own, names it in TFDIST_TASK_TMPDIR, and removes it with all
it holds once the task and everything it started have ended, however they ended. Outside the
launcher (a scheduler's TF_CONFIG job) scratch directories go to TMPDIR itself.

Imports the settings only; never TensorFlow.
"""

from __future__ import annotations

import os
import tempfile

from tfdist import settings

__all__ = ["make_dir"]


def make_dir(prefix: str) -> str:
    """A new directory for this process's scratch files (in the task's own directory, where
    its keeper gave it one); the caller removes it when done."""
    task_dir = settings.TASK_TMPDIR.get()
    if task_dir and os.path.isdir(task_dir):
        return tempfile.mkdtemp(prefix=prefix, dir=task_dir)
    return tempfile.mkdtemp(prefix=prefix)
