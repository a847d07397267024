"""`tfdist.BackupAndRestore`: Keras' BackupAndRestore that also survives preemption, resumes at
the exact step, and works the same on Keras 3 and tf_keras.

    model.fit(dataset, epochs=10, callbacks=[tfdist.BackupAndRestore("/shared/run1/backup")])

What it does in a `fit`:

- at the start, restores the last backup, if any: weights and optimizer state (a
  tf.train.Checkpoint), then skips what was already trained: the finished epochs (as Keras'
  own callback) and, inside the interrupted epoch, the batches already trained, by drawing them
  from the input without training on them. So the next batch trained is the one that followed
  the last batch trained before the interruption, with a deterministic input order.
- saves a backup at the end of each epoch (`save_freq="epoch"`) or every `save_freq` steps.
- on SIGTERM to any task of the job (with `save_before_preemption`, the default): every worker
  stops after the same step (`tfdist.preemption.agreement`), the chief saves, and every task
  exits with `PREEMPTED_EXIT_CODE` (143) by raising `Preempted`. Run the same command again to
  resume.
- at the end of training, the chief deletes the backup (`delete_checkpoint`).

On parameter_server the chief, which runs the training loop, does all of this alone
(`tfdist.preemption.parameter_server`).

The input position is counted in batches drawn from the iterator Keras trains on: Keras makes
a new iterator at every epoch (one pass over finite data) or keeps one across epochs (with
`steps_per_epoch` on repeated data); both are followed. Imports TensorFlow and Keras lazily.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Optional

from tfdist import flavour, signals
from tfdist.preemption import PREEMPTED_EXIT_CODE, Preempted
from tfdist.preemption.agreement import Agreement
from tfdist.preemption.backup import BackupStore, create_optimizer_variables
from tfdist.preemption.parameter_server import ParameterServerBackup, Resume, say

__all__ = ["BackupAndRestore"]


def _role(strategy):
    """(is_chief, worker index, number of workers in lockstep, task name) of this process."""
    try:
        multi = strategy.extended._in_multi_worker_mode()  # pylint: disable=protected-access
    except AttributeError:
        multi = False
    resolver = getattr(strategy, "cluster_resolver", None)
    if not multi or resolver is None:
        return True, 0, 1, None
    from tensorflow.python.distribute import multi_worker_util

    spec, task_type, task_id = resolver.cluster_spec(), resolver.task_type, resolver.task_id
    return (
        multi_worker_util.is_chief(spec, task_type, task_id),
        multi_worker_util.id_in_cluster(spec, task_type, task_id),
        multi_worker_util.worker_count(spec, task_type),
        f"{task_type}:{task_id}",
    )


def _is_parameter_server(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


class BackupAndRestore:
    """Backs up training, restores it at the exact step, and saves before preemption.

    A Keras callback (for the Keras in use: Keras 3 or tf_keras) for `model.fit` and
    `tfdist.fit`, on every strategy; the arguments are those of tf_keras' BackupAndRestore.

    Args:
        backup_dir: str. Where the backup lives: a directory that every task of the job can
            read (shared storage on a cluster) and that only this training uses. Only the
            chief writes it.
        save_freq: "epoch" (the default) or a positive int: save every that many steps
            (counted in calls of the training function, i.e. `steps_per_execution` batches),
            and at no epoch end.
        delete_checkpoint: bool. Delete the backup when training finishes. Defaults to True.
        save_before_preemption: bool. On SIGTERM, stop every worker after the same step,
            save, and exit with `tfdist.PREEMPTED_EXIT_CODE`. Defaults to True.

    With `steps_per_execution` > 1, give a `steps_per_epoch` that is a multiple of it.
    """

    _supports_tf_logs = True  # tf_keras: hand the step's logs over as they are, no copy

    def __new__(cls, *args, **kwargs):
        if cls is BackupAndRestore:  # a subclass of the Keras in use's Callback
            cls = _implementation()
        return object.__new__(cls)

    def __init__(
        self,
        backup_dir,
        save_freq="epoch",
        delete_checkpoint: bool = True,
        save_before_preemption: bool = True,
    ):
        super().__init__()
        # tf_keras' Callback.__init__ resets it; its fit refuses, on parameter_server, a
        # callback with batch hooks that does not take the logs as they are (RemoteValues).
        self._supports_tf_logs = True
        if isinstance(backup_dir, os.PathLike):
            backup_dir = os.fspath(backup_dir)
        if not isinstance(backup_dir, str) or not backup_dir:
            raise ValueError(
                f"backup_dir must be a directory path. Received: backup_dir={backup_dir!r}. "
                "HINT: e.g. BackupAndRestore('/shared/run1/backup'), on storage every task "
                "can read."
            )
        if save_freq != "epoch" and (
            isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1
        ):
            raise ValueError(
                f"save_freq must be 'epoch' or a positive number of steps. Received: "
                f"save_freq={save_freq!r}. HINT: save_freq=100 saves every 100 steps."
            )
        if os.path.isfile(backup_dir):
            raise ValueError(
                f"backup_dir={backup_dir!r} is a file, not a directory. HINT: give a directory "
                "of its own for this training's backup."
            )
        self.backup_dir = backup_dir
        self.save_freq = save_freq
        self.delete_checkpoint = bool(delete_checkpoint)
        self.save_before_preemption = bool(save_before_preemption)
        self._agreement: Optional[Agreement] = None
        self._ps: Optional[ParameterServerBackup] = None  # on parameter_server: does the work

    # ------------------------------------------------------------------- Keras hooks

    def on_train_begin(self, logs=None):
        if self._agreement is not None:  # a fit of this callback that ended in an error
            self._close()
        model = self.model
        strategy = model.distribute_strategy
        if self._ps is not None:  # a fit of this callback that ended in an error
            self._ps.close()
        self._ps = None
        if _is_parameter_server(strategy):  # the coordinator's loop (tfdist's, or tf_keras')
            self._ps = ParameterServerBackup(self, model, strategy)
            return
        self._is_chief, worker, workers, self._task = _role(strategy)
        self._store = BackupStore(self.backup_dir, self._is_chief)
        if self._is_chief:  # a directory the first save cannot write: refused before training
            self._store.check_writable()
        self._checkpoint = _checkpoint_of(model, strategy)
        self._steps_per_execution = _steps_per_execution(model)
        self._epoch, self._step, self._calls, self._since_save = 0, 0, 0, 0
        self._iterator, self._position, self._persistent = None, 0, None
        self._skip_steps, self._skip_batches, self._skipped = 0, 0, False
        self._first_call_of_epoch = True
        self._previous_initial = _initial_epoch(model)
        self._restore(model, strategy)
        self._train_function = model.train_function
        model.train_function = self._train_step
        if self.save_before_preemption:
            self._agreement = Agreement(worker, workers)
            self._listening = signals.listening(self._agreement.notice, self._task)
            if not self._listening.__enter__():
                warnings.warn(
                    "tfdist.BackupAndRestore(save_before_preemption=True) cannot save before a "
                    "preemption: this program installed a SIGTERM handler of its own, which "
                    "tfdist leaves in place. HINT: remove that handler, or save from it.",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _tfdist_accepts_steps_per_call(self, k: int) -> bool:
        """Whether fit may run `k` steps per call of the training function where compile left
        one (tfdist.fixes.executions asks before fit): saving once an epoch, any `k` that the
        steps of a backup taken inside an epoch are a multiple of (it resumes on a call's
        boundary); saving every `save_freq` calls, only one step per call."""
        if self.save_freq != "epoch":
            return k == 1
        try:  # the newest backup, or the one before if the newest cannot be read
            states = BackupStore(self.backup_dir, is_chief=False).states()
            return all(state["step"] % k == 0 for state in states)
        except (ValueError, OSError):
            return k == 1  # a state that is not a backup: on_train_begin names it

    def on_epoch_begin(self, epoch, logs=None):
        if self._ps is not None:
            return self._ps.on_epoch_begin(epoch)
        self._epoch, self._step, self._first_call_of_epoch = epoch, 0, True

    def on_train_batch_end(self, batch, logs=None):
        if self._ps is not None:
            return self._ps.on_train_batch_end(batch, logs)
        if isinstance(self.save_freq, int) and not self._skipped:
            # steps skipped on resume are not trained: a save among them would pair the
            # restored weights with an earlier step
            self._since_save += 1
            if self._since_save >= self.save_freq:
                self._save("steps", self._epoch, self._step, self._position)
        if self._agreement is not None and self._agreement.at_boundary(self._calls):
            self._preempted()

    def on_epoch_end(self, epoch, logs=None):
        if self._ps is not None:
            return self._ps.on_epoch_end(epoch)
        if self.save_freq == "epoch":
            # The next epoch starts on a new iterator, or (steps_per_epoch over repeated data)
            # on this one: known once one epoch boundary was seen in this fit.
            position = {True: self._position, False: 0, None: None}[self._persistent]
            self._save("epoch", epoch + 1, 0, position)

    def on_train_end(self, logs=None):
        if self._ps is not None:
            return self._ps.on_train_end()
        self._close()
        if self.delete_checkpoint:
            self._store.delete()

    # ------------------------------------------------------------------------ steps

    def _train_step(self, iterator):
        """Keras' training function, counting the batches drawn from `iterator`; while batches
        of an interrupted epoch are left to skip, draws them without training."""
        if self._first_call_of_epoch:
            self._first_call_of_epoch = False
            if self._iterator is not None:
                self._persistent = iterator is self._iterator
        if iterator is not self._iterator:
            self._iterator, self._position = iterator, 0
        while self._skip_batches > 0:  # batches of earlier epochs, on a kept iterator
            next(iterator)
            self._skip_batches -= 1
            self._position += 1
        self._calls += 1
        self._step += self._steps_per_execution
        self._position += self._steps_per_execution
        self._skipped = self._skip_steps > 0
        if self._skipped:  # steps of this epoch trained before the interruption
            self._skip_steps -= 1
            for _ in range(self._steps_per_execution):
                next(iterator)
            return {}
        try:
            return self._train_function(iterator)
        except BaseException:
            self._close()  # Keras calls no on_train_end after an error: SIGTERM ends us again
            raise

    # ------------------------------------------------------------------ save, restore

    def _save(self, reason: str, epoch: int, step: int, position: Optional[int]) -> None:
        self._since_save = 0
        try:
            self._store.save(
                self._checkpoint,
                {
                    "epoch": epoch,
                    "step": step,
                    "position": position,
                    "iterations": int(self.model.optimizer.iterations.numpy()),
                    "reason": reason,
                    "workers": self._agreement.num_workers if self._agreement else None,
                    "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except BaseException:
            self._close()  # Keras calls no on_train_end after an error: SIGTERM ends us again
            raise

    def _restore(self, model, strategy) -> None:
        """Restores the newest backup that can be read, if any, and sets where fit resumes.
        Refuses (ValueError) a backup that names no step of this fit or is another model's."""
        with self._store.refusing_restart():
            self._restore_from(model, strategy, self._store.states(epochs=_epochs(self)))

    def _restore_from(self, model, strategy, states) -> None:
        if not states:
            if self._is_chief:
                self._store.warn_unlisted()
            if flavour.uses_legacy_keras() and not getattr(model, "built", False):
                warnings.warn(
                    "tfdist.BackupAndRestore: the model is not built before fit (tf_keras "
                    "builds it at the first step), so the fit that resumes from its backup "
                    "cannot check and restore it, and will refuse it. HINT: start the model "
                    "with tf_keras.Input(shape=...), or call model.build(input_shape) before "
                    "fit.",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return
        if flavour.uses_legacy_keras():  # its optimizer makes its slots at the first step
            create_optimizer_variables(model, strategy)
        state = self._store.restore(self._checkpoint, states)
        epoch, step, position = state["epoch"], state["step"], state.get("position")
        _set_initial_epoch(model, epoch)
        # Keras calls the training function `step / steps_per_execution` times before the next
        # batch to train; a kept iterator first passes the batches of the earlier epochs.
        self._skip_steps = step // self._steps_per_execution
        self._skip_batches = max(int(position) - step, 0) if position is not None else 0
        if self._is_chief:
            where = f"epoch {epoch + 1}" + (f", step {step + 1}" if step else "")
            if epoch >= (_epochs(self) or epoch + 1):  # kept by delete_checkpoint=False
                where = f"the end: that training finished its {epoch} epochs, none is left"
            say(
                f"tfdist: restored the backup in {self.backup_dir} "
                f"(optimizer step {state.get('iterations')}); training resumes at {where}."
            )

    def _preempted(self) -> None:
        agreement = self._agreement
        agreement.reached()
        self._save("preemption", self._epoch, self._step, self._position)
        who = "this task" if agreement.claimed_by == agreement.worker else "another task"
        where = f"epoch {self._epoch + 1}, step {self._step}"
        if self._is_chief:
            stopped = "every worker stopped" if agreement.multi_worker else "training stopped"
            say(
                f"tfdist: SIGTERM (to {who}): {stopped} after {where}; the backup "
                f"is in {self.backup_dir}. Exiting with code {PREEMPTED_EXIT_CODE}: run the "
                "same command again to resume at the next step."
            )
        else:
            say(f"tfdist: SIGTERM (to {who}): stopped after {where}; exiting.")
        self._close()
        raise Preempted(self._epoch, self._step, self.backup_dir)

    def _close(self) -> None:
        model = self.model
        if getattr(self, "_train_function", None) is not None:
            model.train_function = self._train_function
            self._train_function = None
        _set_initial_epoch(model, self._previous_initial, restoring=True)
        if self._agreement is not None:
            self._listening.__exit__(None, None, None)
            self._agreement.close()
            self._agreement = None


def _checkpoint_of(model, strategy):
    import tensorflow as tf

    optimizer = model.optimizer
    if not flavour.uses_legacy_keras() and not getattr(optimizer, "built", True):
        if not model.built:
            raise ValueError(
                "tfdist.BackupAndRestore needs a built model: this Keras builds it only at the "
                "first step, after the backup must be restored. HINT: start the model with "
                "keras.Input(shape=...), or call model.build(input_shape) before fit."
            )
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    return tf.train.Checkpoint(model=model, optimizer=optimizer)


def _epochs(callback) -> Optional[int]:
    """The fit's `epochs` (Keras hands it to callbacks in `params`), or None."""
    epochs = (getattr(callback, "params", None) or {}).get("epochs")
    return epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None


def _steps_per_execution(model) -> int:
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", 1)
    if hasattr(value, "numpy"):
        value = value.numpy()
    return max(int(value), 1)


def _initial_epoch(model):
    if flavour.uses_legacy_keras():
        return getattr(model, "_training_state", None)
    return getattr(model, "_initial_epoch", None)


def _set_initial_epoch(model, value, restoring: bool = False) -> None:
    """Where Keras' fit starts: Keras 3 reads `model._initial_epoch`, tf_keras asks
    `model._training_state`, both after on_train_begin."""
    if flavour.uses_legacy_keras():
        model._training_state = value if restoring else Resume(value, 0)
    else:
        model._initial_epoch = value


_IMPLEMENTATION = {}


def _implementation():
    keras = flavour.keras()
    key = id(keras)
    if key not in _IMPLEMENTATION:
        _IMPLEMENTATION[key] = type(
            "BackupAndRestore",
            (BackupAndRestore, keras.callbacks.Callback),
            {"__module__": "tfdist", "__doc__": BackupAndRestore.__doc__},
        )
    return _IMPLEMENTATION[key]
