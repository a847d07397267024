"""The backup directory: one TensorFlow checkpoint of the model and its optimizer, and a small
JSON file saying where training stood (epoch, step in the epoch, position in the input).

Only the chief writes the directory. Every other worker writes the same checkpoint (saving may
read distributed variables, which all workers must take part in) into a private temporary
directory that is removed at once. The chief writes the checkpoint under a new name, then
replaces the JSON file in one rename, then removes the older checkpoint: a task killed while it
saves leaves the previous backup whole. Paths go through tf.io.gfile, so a backup directory may
be on any filesystem TensorFlow writes (gs://, s3:// with the plugins, HDFS).

Imports TensorFlow lazily.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
from typing import Optional

__all__ = ["BackupStore", "STATE_FILE"]

STATE_FILE = "tfdist-backup.json"
_FORMAT = 1


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if "://" in directory else os.path.join(directory, name)


class BackupStore:
    """The backup directory of one training, as this task sees it."""

    def __init__(self, directory: str, is_chief: bool):
        self.directory, self.is_chief = directory, is_chief

    @property
    def state_path(self) -> str:
        return _join(self.directory, STATE_FILE)

    def latest(self) -> Optional[dict]:
        """The last backup's state (with "checkpoint", the path to restore), or None."""
        import tensorflow as tf

        if not tf.io.gfile.exists(self.state_path):
            return None
        with tf.io.gfile.GFile(self.state_path, "r") as f:
            text = f.read()
        try:
            state = json.loads(text)
            name = state["checkpoint"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"The backup state {self.state_path} is not a tfdist backup ({err!r}). HINT: "
                "give BackupAndRestore a directory of its own, or remove that file to start "
                "from scratch."
            ) from None
        state["checkpoint"] = _join(self.directory, name)
        return state

    def restore(self, checkpoint, state: dict) -> None:
        """Reads the backup `state` names into `checkpoint` (a tf.train.Checkpoint).

        Raises:
            ValueError: the backup was written by another model (a variable of another shape).
        """
        try:
            checkpoint.read(state["checkpoint"]).expect_partial()
        except Exception as err:  # pylint: disable=broad-except
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ValueError(
                f"The backup in {self.directory} does not fit this model: "
                f"{type(err).__name__}: {first} HINT: give a new backup_dir to a changed "
                "model, or delete the old backup to start from scratch."
            ) from err

    def save(self, checkpoint, state: dict) -> Optional[str]:
        """Writes `checkpoint` (a tf.train.Checkpoint) and `state`; returns the chief's path."""
        import tensorflow as tf

        if not self.is_chief:
            scratch = tempfile.mkdtemp(prefix="tfdist-backup-")
            try:
                checkpoint.write(os.path.join(scratch, "ckpt"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return None
        tf.io.gfile.makedirs(self.directory)
        previous = self.latest()
        number = int(previous.get("saves", 0)) + 1 if previous else 1
        name = f"ckpt-{number}"
        path = checkpoint.write(_join(self.directory, name))
        record = dict(state, checkpoint=name, saves=number, format=_FORMAT)
        partial = self.state_path + ".partial"
        with tf.io.gfile.GFile(partial, "w") as f:
            f.write(json.dumps(record, indent=1, sort_keys=True))
        tf.io.gfile.rename(partial, self.state_path, overwrite=True)
        if previous:
            for stale in tf.io.gfile.glob(previous["checkpoint"] + ".*"):
                tf.io.gfile.remove(stale)
        return path

    def delete(self) -> None:
        """Removes the backup (the chief, when training has finished)."""
        import tensorflow as tf

        if not self.is_chief or not tf.io.gfile.exists(self.directory):
            return
        latest = self.latest()
        if latest:
            for path in tf.io.gfile.glob(latest["checkpoint"] + ".*"):
                tf.io.gfile.remove(path)
            tf.io.gfile.remove(self.state_path)
        if not tf.io.gfile.listdir(self.directory):
            tf.io.gfile.rmtree(self.directory)
