"""The backup directory: the newest two TensorFlow checkpoints of the model and its optimizer,
and a small JSON file saying where training stood at each (epoch, step in the epoch, position
in the input).

Layout: `ckpt-N.index` and `ckpt-N.data-*` per checkpoint, and `tfdist-backup.json`, whose
top level is the state of the newest checkpoint ("checkpoint": "ckpt-N") and whose "previous"
is the state of the one before. A directory written before tfdist kept two (format 1: one
checkpoint, no "previous") restores as a backup with no earlier one.

Only the chief writes the directory. Every other worker writes the same checkpoint (saving may
read distributed variables, which all workers must take part in) into a private temporary
directory that is removed at once. A save writes the new checkpoint under a new name, then
replaces the JSON file in one rename (it lists the new checkpoint and the newest whole one
before it), then removes every other checkpoint: a task killed at any point of a save leaves
the state file listing at least one whole checkpoint. A save that fails (a full disk, lost
permissions) removes what it wrote and raises an OSError naming the directory and the cause;
the backups before it stay.

A restore refuses a backup that is not exactly this model's, with a ValueError naming the
checkpoint and the difference: every variable of the model and its optimizer must be in it,
with its shape, and nothing in it may be left unused. A checkpoint that cannot be read (its
data truncated or overwritten, its index missing) is not another model's: the restore warns
once, naming it, and falls back to the one before; when none can be read, it raises a
ValueError naming the directory. A state file that is not a tfdist backup's, or that names no
step of this training (a negative step, an epoch past the fit's `epochs`), is refused; the
backup of a training that finished (kept with delete_checkpoint=False) restores, with nothing
left to train.

Paths go through tf.io.gfile, so a backup directory may be on any filesystem TensorFlow writes
(gs://, s3:// with the plugins, HDFS). Imports TensorFlow lazily.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import shutil
import warnings
from typing import List, Optional

from tfdist import flavour, training_report
from tfdist import scratch as scratch_files
from tfdist.errors import is_count

__all__ = ["BackupStore", "STATE_FILE", "create_optimizer_variables"]

STATE_FILE = "tfdist-backup.json"
_FORMAT = 2  # 1: one checkpoint; 2: the newest two ("previous")
# The files of checkpoint N, and what TensorFlow leaves of a write that failed ("_temp").
_CHECKPOINT_FILE = re.compile(r"^ckpt-(\d+)(?:\.index|\.data-\d+-of-\d+|_temp)$")
_CHECKPOINT_NAME = re.compile(r"^ckpt-(\d+)$")
_SHOWN = 4  # variables named in a message, at most


class _SaverRetracing(logging.Filter):
    """TensorFlow's "N out of the last N calls to <function MultiDeviceSaver.save.<locals>.
    tf_function_save> triggered tf.function retracing" warning: a checkpoint of variables on
    several tasks (parameter servers) builds a new tf.function at each save and restore, on
    purpose (functional_saver.py says so), and warns from the fifth on, at every backup."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("retracing" in text and "MultiDeviceSaver." in text)


@contextlib.contextmanager
def _saver_retracing_unsaid():
    logger = logging.getLogger("tensorflow")
    quiet = _SaverRetracing()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if "://" in directory else os.path.join(directory, name)


def _basename(path: str) -> str:
    return posixpath.basename(path) if "://" in path else os.path.basename(path)


def _cause(err: BaseException) -> str:
    """`Type: first line` of an error, without TensorFlow's `{{function_node ...}}` prefix."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    first = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", first)
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def _few(names: List[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _unreadable():
    """The errors of reading a checkpoint that is damaged or gone, not another model's:
    TensorFlow's (DataLossError, NotFoundError, OutOfRangeError, or a plain OpError for a bad
    checksum or "not an sstable"), the IndexError of its reader for a data file cut short
    ("Read less bytes than requested"), an OSError, and protobuf's DecodeError."""
    import tensorflow as tf

    errors = [tf.errors.OpError, IndexError, OSError]
    try:
        from google.protobuf.message import DecodeError

        errors.append(DecodeError)
    except ImportError:  # pragma: no cover - TensorFlow requires protobuf
        pass
    return tuple(errors)


def create_optimizer_variables(model, strategy) -> None:
    """Creates the variables the model's optimizer would make at its first step (tf_keras makes
    its slots there; Keras 3 when it builds), so that a restore fills and checks every one.

    Raises:
        ValueError: the model has no variables yet (it is built at its first step).
    """
    if not getattr(model, "built", False):
        raise ValueError(
            "tfdist.BackupAndRestore cannot restore its backup into a model that is not built: "
            "its variables are made at the first step, after the backup must be restored and "
            "checked. HINT: start the model with keras.Input(shape=...), or call "
            "model.build(input_shape) before fit."
        )
    optimizer = model.optimizer
    variables = model.trainable_variables
    with strategy.scope():
        if not flavour.uses_legacy_keras():
            if not getattr(optimizer, "built", True):
                optimizer.build(variables)
        elif isinstance(optimizer, flavour.keras().optimizers.legacy.Optimizer):
            optimizer._create_all_weights(variables)  # pylint: disable=protected-access
        elif hasattr(optimizer, "build"):
            optimizer.build(variables)  # returns at once when built


def _difference(status):
    """(lacks, holds): the model's variables that the checkpoint read into `status` has no
    value for, and the checkpoint's values that no variable of the model took, by name; None
    where TensorFlow's load status is not as expected (then its own message is shown)."""
    try:
        from tensorflow.python.checkpoint import checkpoint as tf_checkpoint
        from tensorflow.python.util import object_identity

        coordinator = status._checkpoint  # pylint: disable=protected-access
        try:
            status.assert_existing_objects_matched()  # lists the model's objects
        except AssertionError:
            pass
        matched = object_identity.ObjectIdentitySet(coordinator.object_by_proto_id.values())
        lacks = sorted(
            {
                _variable_name(o)
                for o in tf_checkpoint._objects_with_attributes(  # pylint: disable=protected-access
                    coordinator.all_python_objects
                )
                if o not in matched
            }
        )
        holds = sorted(
            {
                attribute.full_name or attribute.checkpoint_key
                for node_id, node in enumerate(coordinator.object_graph_proto.nodes)
                if node.attributes and coordinator.object_by_proto_id.get(node_id) is None
                for attribute in node.attributes
            }
        )
    except Exception:  # pylint: disable=broad-except
        return None
    return (lacks, holds) if lacks or holds else None


def _number(state: Optional[dict]) -> Optional[int]:
    """N of a state's checkpoint "ckpt-N" (by name), or None."""
    match = _CHECKPOINT_NAME.match(str((state or {}).get("checkpoint", "")))
    return int(match.group(1)) if match else None


def _variable_name(variable) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", None)
    if not isinstance(name, str):
        return repr(variable)
    return name[:-2] if name.endswith(":0") else name


class BackupStore:
    """The backup directory of one training, as this task sees it."""

    def __init__(self, directory: str, is_chief: bool):
        self.directory, self.is_chief = directory, is_chief
        # The newest whole backup this store restored or saved (its state, "checkpoint" its
        # name): the "previous" of the next save.
        self._kept: Optional[dict] = None

    @property
    def state_path(self) -> str:
        return _join(self.directory, STATE_FILE)

    # -------------------------------------------------------------------- the state file

    def _not_a_backup(self, what: str) -> ValueError:
        return ValueError(
            f"The backup state {self.state_path} is not a tfdist backup ({what}). HINT: give "
            "BackupAndRestore a directory of its own, or remove that file to start from "
            "scratch."
        )

    def _record(self) -> Optional[dict]:
        """The state file as written (checkpoints by name), or None where there is none."""
        import tensorflow as tf

        try:
            if not tf.io.gfile.exists(self.state_path):
                return None
            with tf.io.gfile.GFile(self.state_path, "rb") as f:
                data = f.read()
        except tf.errors.OpError as err:
            raise OSError(
                f"The backup state {self.state_path} cannot be read ({_cause(err)}). HINT: "
                f"make {self.directory} readable by every task of the job."
            ) from err
        try:
            record = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
        except ValueError as err:  # UnicodeDecodeError too: random bytes
            raise self._not_a_backup(_cause(err)) from None
        if not isinstance(record, dict):
            raise self._not_a_backup(f"a JSON {type(record).__name__}, not an object")
        return record

    def _checked(self, entry, epochs: Optional[int]) -> dict:
        """`entry` of the state file as a state, "checkpoint" the path to restore."""
        if not isinstance(entry, dict):
            raise self._not_a_backup(f"an entry {entry!r}, not an object")
        name = entry.get("checkpoint")
        if not isinstance(name, str) or not re.fullmatch(r"[\w+-][\w.+-]*", name):
            raise self._not_a_backup(f"checkpoint={name!r}, not the name of a checkpoint")
        version = entry.get("format", 1)
        if is_count(version) and version > _FORMAT:
            raise ValueError(
                f"The backup state {self.state_path} says format={version}: it was written "
                f"by a newer tfdist, which this one (format {_FORMAT}) cannot read. HINT: run "
                "the tfdist that wrote it, or remove the directory to start from scratch."
            )
        fix = (
            f"this file was not written by tfdist as it is now: remove {self.directory} to "
            "start from scratch, or give BackupAndRestore a directory of its own."
        )
        for key, required in (
            ("epoch", True),
            ("step", True),
            ("position", False),
            ("iterations", False),
            ("saves", False),
        ):
            value = entry.get(key)
            if value is None and not required:
                continue
            if key not in entry:
                raise self._not_a_backup(f"it has no {key!r}")
            if not is_count(value):
                raise ValueError(
                    f"The backup state {self.state_path} says {key}={value!r}, not a whole "
                    f"number of 0 or more: it names no step of a training. HINT: {fix}"
                )
        epoch, step = entry["epoch"], entry["step"]
        # A training that finishes deletes its backup, unless delete_checkpoint=False (or the
        # task ended between the last save and the deletion): epoch == epochs, step 0, is the
        # backup of its last epoch's end, which leaves nothing to train. Past that, it is not.
        if epochs is not None and (epoch > epochs or (epoch == epochs and step > 0)):
            raise ValueError(
                f"The backup state {self.state_path} says epoch={epoch!r}, step={step!r} "
                f"(0-based), past the end of this fit (epochs={epochs}): it is no backup of "
                f"this training. HINT: to train on from it, give fit epochs={epoch + 1} or "
                f"more; to start from scratch, remove {self.directory}."
            )
        state = {k: v for k, v in entry.items() if k != "previous"}
        state["checkpoint"] = _join(self.directory, name)
        return state

    def states(self, epochs: Optional[int] = None) -> List[dict]:
        """The backups the state file lists, newest first (at most two), each a state with
        "checkpoint" the path to restore; [] without a state file.

        Args:
            epochs: the fit's `epochs`, when known: a backup's epoch must be below it.

        Raises:
            ValueError: the state file is not a tfdist backup's, or names no step of a
                training of `epochs` epochs.
        """
        record = self._record()
        if record is None:
            return []
        entries = [record] + ([record["previous"]] if record.get("previous") is not None else [])
        return [self._checked(entry, epochs) for entry in entries]

    def unlisted(self) -> List[str]:
        """The checkpoints of the directory when it has no state file (a first save cut short,
        or the state file removed), by the names of their index files; else []."""
        import tensorflow as tf

        try:
            if tf.io.gfile.exists(self.state_path):
                return []
            return sorted(
                _basename(path)
                for path in tf.io.gfile.glob(_join(self.directory, "ckpt-*.index"))
                if _CHECKPOINT_FILE.match(_basename(path))
            )
        except tf.errors.OpError:
            return []

    def warn_unlisted(self) -> None:
        """Warns, starting from scratch, about checkpoints no state file lists."""
        names = self.unlisted()
        if names:
            warnings.warn(
                f"tfdist: {self.directory} holds checkpoints ({_few(names)}) but no "
                f"{STATE_FILE}: a first save was cut short, or that file was removed. "
                "Training starts from scratch, and its first save removes them. HINT: if they "
                f"are a backup of this training, stop and put its {STATE_FILE} back.",
                RuntimeWarning,
                stacklevel=3,
            )

    def latest(self) -> Optional[dict]:
        """The newest backup's state (with "checkpoint", the path to restore), or None."""
        states = self.states()
        return states[0] if states else None

    # -------------------------------------------------------------------------- restore

    @contextlib.contextmanager
    def refusing_restart(self):
        """Around a restore: a backup refused (ValueError) is refused the same way by every
        run of the job, so the launcher is told not to restart it (`tfdist.training_report`)."""
        try:
            yield
        except ValueError:
            training_report.refuse_restart(f"the backup in {self.directory} was refused")
            raise

    def restore(self, checkpoint, states: List[dict]) -> dict:
        """Reads the newest backup of `states` that can be read into `checkpoint` (a
        tf.train.Checkpoint of every variable to restore, all of them made), and returns
        its state. Warns once, naming it, when it falls back past a damaged one.

        Raises:
            ValueError: a backup was written by another model (a variable of another shape,
                a variable it lacks, a value no variable takes), or none can be read.
        """
        damaged = []
        for state in states:
            path = state["checkpoint"]
            try:
                with _saver_retracing_unsaid():
                    status = checkpoint.read(path)
            except _unreadable() as err:
                damaged.append((path, err))
                continue
            except Exception as err:  # pylint: disable=broad-except
                raise ValueError(  # a variable of another shape: ValueError from TensorFlow
                    f"The backup {path} does not fit this model: {_cause(err)} HINT: give a "
                    "changed model a new backup_dir, or delete the old backup to start "
                    "from scratch."
                ) from err
            try:
                status.assert_consumed()
            except AssertionError as err:
                raise ValueError(self._mismatch(path, status, err)) from None
            if damaged:
                warnings.warn(self._fallback(damaged, state), RuntimeWarning, stacklevel=3)
            self._kept = dict(state, checkpoint=_basename(path))
            return state
        raise ValueError(
            f"No backup in {self.directory} can be read: "
            + "; ".join(f"{self._files(path)} ({_cause(err)})" for path, err in damaged)
            + f". HINT: remove {self.directory} to start from scratch (or put a copy of the "
            "backup back)."
        )

    def _mismatch(self, path: str, status, err: AssertionError) -> str:
        difference = _difference(status)
        if difference is None:
            text = str(err).strip()
            detail = text.splitlines()[0][:300] if text else type(err).__name__
        else:
            lacks, holds = difference
            parts = []
            if lacks:
                parts.append(f"it lacks {len(lacks)} variable(s) of the model ({_few(lacks)})")
            if holds:
                parts.append(f"it holds {len(holds)} value(s) of no variable ({_few(holds)})")
            detail = " and ".join(parts)
        return (
            f"The backup {path} does not fit this model: {detail}; it was written by another "
            "model (another layer, another optimizer), and restoring the rest would train on "
            "half-restored weights. HINT: give a changed model a new backup_dir, or delete "
            f"{self.directory} to start from scratch."
        )

    def _files(self, path: str) -> str:
        import tensorflow as tf

        try:
            names = sorted(_basename(p) for p in tf.io.gfile.glob(path + ".*"))
        except tf.errors.OpError:
            names = []
        index = _basename(path) + ".index"
        return ", ".join(names if index in names else [f"{index} (missing)"] + names)

    def _fallback(self, damaged, state) -> str:
        path, err = damaged[-1]
        where = f"epoch {state['epoch'] + 1}" + (f", step {state['step']}" if state["step"] else "")
        return (
            f"tfdist: the newest backup in {self.directory} cannot be read: "
            f"{self._files(path)} ({_cause(err)}); it restores the one before it, "
            f"{_basename(state['checkpoint'])} (after {where}, optimizer step "
            f"{state.get('iterations')}), instead. The damaged one is removed at the next save."
        )

    # ----------------------------------------------------------------------------- save

    def check_writable(self) -> None:
        """Refuses, before training, a directory the chief cannot create and write (a file,
        a path under a file, a directory of no write permission): else the first save would
        fail after an epoch of training. Leaves the directory made, and empty if it was."""
        import tensorflow as tf

        directory = self.directory
        try:
            is_file = tf.io.gfile.exists(directory) and not tf.io.gfile.isdir(directory)
        except tf.errors.OpError:
            is_file = False
        if is_file:
            raise ValueError(
                f"backup_dir={directory!r} is a file, not a directory. HINT: give a directory "
                "of its own for this training's backup."
            )
        probe = _join(directory, f".tfdist-write-check-{os.getpid()}")
        try:
            tf.io.gfile.makedirs(directory)
            with tf.io.gfile.GFile(probe, "w") as f:
                f.write("tfdist checks that it may write here\n")
            tf.io.gfile.remove(probe)
        except (tf.errors.OpError, OSError) as err:
            raise OSError(
                f"backup_dir={directory!r} cannot be written by this task ({_cause(err)}): "
                "the first backup would fail after training. HINT: give a directory that "
                "this task can create and write, on storage every task reads, or fix its "
                "permissions."
            ) from err

    def _numbers(self) -> dict:
        """Number -> paths of the checkpoint files in the directory (kept, damaged, left)."""
        import tensorflow as tf

        found = {}
        for path in tf.io.gfile.glob(_join(self.directory, "ckpt-*")):
            match = _CHECKPOINT_FILE.match(_basename(path))
            if match:
                found.setdefault(int(match.group(1)), []).append(path)
        return found

    def _remove(self, paths) -> None:
        import tensorflow as tf

        for path in paths:
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)

    def save(self, checkpoint, state: dict) -> Optional[str]:
        """Writes `checkpoint` (a tf.train.Checkpoint) and `state`; returns the chief's path.

        Raises:
            OSError: the checkpoint or the state could not be written (the directory and the
                cause named); the backups before it are kept whole.
        """
        import tensorflow as tf

        if not self.is_chief:
            scratch = scratch_files.make_dir("tfdist-backup-")
            try:
                with _saver_retracing_unsaid():
                    checkpoint.write(os.path.join(scratch, "ckpt"))
            except (tf.errors.OpError, OSError) as err:
                raise OSError(
                    f"tfdist.BackupAndRestore could not write this worker's copy of the backup "
                    f"in the temporary directory {scratch} ({_cause(err)}). HINT: point TMPDIR "
                    "at a filesystem with room for one checkpoint of the model."
                ) from err
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return None
        kept = self._kept
        if kept is None:  # none restored by this store: the state file's newest, if any
            try:
                states = self.states()
            except (ValueError, OSError):
                states = []
            if states:
                kept = dict(states[0], checkpoint=_basename(states[0]["checkpoint"]))
        partial = self.state_path + ".partial"
        kept_number = _number(kept)
        number = None
        try:
            tf.io.gfile.makedirs(self.directory)
            # a new name: none of a checkpoint kept, damaged or left by a save cut short
            number = max([kept_number or 0, *self._numbers()]) + 1
            name = f"ckpt-{number}"
            record = dict(state, checkpoint=name, saves=number, format=_FORMAT)
            if kept is not None:
                record["previous"] = kept
            with _saver_retracing_unsaid():
                path = checkpoint.write(_join(self.directory, name))
            with tf.io.gfile.GFile(partial, "w") as f:
                f.write(json.dumps(record, indent=1, sort_keys=True))
            tf.io.gfile.rename(partial, self.state_path, overwrite=True)
        except (tf.errors.OpError, OSError) as err:
            self._failed(number, partial)
            before = (
                f"The backup before it, {_join(self.directory, kept['checkpoint'])}, is kept whole."
                if kept is not None
                else "No backup was saved before it."
            )
            raise OSError(
                f"tfdist.BackupAndRestore could not save a backup in {self.directory}: "
                f"{_cause(err)}. {before} HINT: make room on that filesystem (or fix its "
                "permissions), then run the same command again: training resumes from the "
                "last backup."
            ) from err
        self._kept = {k: v for k, v in record.items() if k != "previous"}
        keep = {number, kept_number}
        for stale, paths in sorted(self._numbers().items()):
            if stale not in keep:
                self._remove(paths)
        return path

    def _failed(self, number: Optional[int], partial: str) -> None:
        """Removes what a save that failed wrote (best effort: the disk may be gone)."""
        import tensorflow as tf

        try:
            if number is not None:
                self._remove(self._numbers().get(number, []))
            if tf.io.gfile.exists(partial):
                tf.io.gfile.remove(partial)
        except (tf.errors.OpError, OSError):
            pass

    def delete(self) -> None:
        """Removes the backup (the chief, when training has finished): every checkpoint it
        kept, and any a save cut short left."""
        import tensorflow as tf

        if not self.is_chief or not tf.io.gfile.exists(self.directory):
            return
        for paths in self._numbers().values():
            self._remove(paths)
        for path in (self.state_path, self.state_path + ".partial"):
            if tf.io.gfile.exists(path):
                tf.io.gfile.remove(path)
        self._kept = None
        if not tf.io.gfile.listdir(self.directory):
            tf.io.gfile.rmtree(self.directory)
