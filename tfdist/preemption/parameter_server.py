"""`tfdist.BackupAndRestore` on parameter_server: on SIGTERM the coordinator schedules no more
steps, saves once the scheduled ones have run, and a new job resumes at that step.

In a parameter-server job the chief (the coordinator) runs the training loop and the variables
live on the ps tasks; the workers and ps tasks only serve. So a preemption concerns one
process. On SIGTERM to the coordinator, it schedules no further group of steps, waits for the
scheduled ones (at most a few per worker), saves the backup (the variables, read from the ps:
model and optimizer; the epoch; the steps of that epoch that ran; `optimizer.iterations`) and
raises `Preempted` (exit code 143). Started again, the job restores the variables onto its ps
tasks from the coordinator, trains the remaining steps of that epoch, then the next epochs:
`optimizer.iterations` is the saved count right after the restore, and `epochs *
steps_per_epoch` at the end. If the scheduled groups have not run `agreement.STOP_DEADLINE`
seconds after the SIGTERM, the process ends as SIGTERM would end it, the last backup kept.

SIGTERM to a worker or a ps keeps its meaning, the process ends (tfdist.parameter_server: a
lost worker's groups run again on the others, each step applied once; a lost ps stops training
with a TaskUnavailableError).

No position in the input is restored (the state's "position" is None): each worker reads its
own repeated dataset, asynchronously, so no batch count says where the input stood; each
worker of the new job starts its dataset afresh.

Saves: `save_freq="epoch"` at the end of each epoch; `save_freq=N` after every N groups of
steps (calls of the training function, as on the other strategies), once the groups scheduled
so far have run (the workers wait for that save, then go on).

Two loops drive it. tfdist's own (Keras 3: tfdist.parameter_server.loop) through a duck-typed
protocol (this object, set on the model as `_tfdist_backup` during the fit: `callback`,
`initial_step()`, `stop_requested()`, `after_groups(epoch, steps_done)`, `close()`), so that it
reads no group's logs for the backup. tf_keras' own fit (which runs parameter-server training
natively) through the callback's hooks: `on_train_batch_end` comes when a group is scheduled,
with its logs as a RemoteValue that is never fetched.

Imports TensorFlow lazily.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from tfdist import flavour, signals
from tfdist.preemption import PREEMPTED_EXIT_CODE, Preempted
from tfdist.preemption.agreement import Agreement
from tfdist.preemption.backup import BackupStore, create_optimizer_variables

__all__ = ["ParameterServerBackup"]

# Groups in flight per worker under tf_keras' fit, as in tfdist's loop
# (tfdist.parameter_server.runner.IN_FLIGHT_PER_WORKER): a stop waits for no more than those.
_IN_FLIGHT_PER_WORKER = 4


class Resume:
    """Where tf_keras' fit starts (it asks `model._training_state` after on_train_begin), on
    every strategy: `epoch` and the steps of it already trained (`step`)."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        if steps_per_epoch and self.step >= steps_per_epoch:  # saved after the epoch's end
            return self.epoch + 1, 0
        return self.epoch, self.step


def _task(strategy) -> str:
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return "chief:0"
    return f"{task_type}:{getattr(resolver, 'task_id', 0) or 0}"


def say(message: str) -> None:
    """Writes one line to stderr at once (the messages of a stop, before the process exits)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class ParameterServerBackup:
    """One fit's backup on the coordinator of a parameter-server job.

    Made by `BackupAndRestore.on_train_begin`, which hands it its other hooks. Restores the
    last backup, if any, and listens for SIGTERM until the fit ends (`close`).
    """

    def __init__(self, callback, model, strategy):
        import tensorflow as tf

        self.callback, self.model, self._strategy = callback, model, strategy
        self.backup_dir = callback.backup_dir
        self._store = BackupStore(self.backup_dir, is_chief=True)
        self._store.check_writable()  # refused before training, not at the first save
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        save_freq = callback.save_freq
        self._every: Optional[int] = save_freq if isinstance(save_freq, int) else None
        self._groups = 0  # groups scheduled since the last save
        self._epoch, self._initial_step = 0, 0
        self._workers = max(int(getattr(strategy.extended, "_num_workers", 1) or 1), 1)
        self._legacy = flavour.uses_legacy_keras()
        self._start_attribute = "_training_state" if self._legacy else "_initial_epoch"
        self._previous_start = getattr(model, self._start_attribute, None)
        # One process stops: "stop now" at the next boundary, and the deadline from SIGTERM to
        # the stop (after which the process just ends) of the other strategies.
        self._agreement = Agreement(0, 1)
        self._listening = None
        self._task = _task(strategy)
        self._restore()
        if callback.save_before_preemption:
            self._listening = signals.listening(self._agreement.notice, self._task)
            self._listening.__enter__()
        # Past Keras' attribute tracking: no checkpoint sees it. tfdist's loop looks for it.
        object.__setattr__(model, "_tfdist_backup", self)

    # ------------------------------------------------- the protocol of tfdist's loop

    def initial_step(self) -> int:
        """Steps of the first epoch of this fit already trained (by the restored backup)."""
        return self._initial_step

    def stop_requested(self) -> bool:
        """Asked once after each group is scheduled: True when no more should be, for now."""
        self._groups += 1
        return self._signalled() or self._save_due()

    def after_groups(self, epoch: int, steps_done: int) -> None:
        """Every scheduled group has run, `steps_done` steps of `epoch`: saves when a save is
        due; after a SIGTERM, saves and raises `Preempted`."""
        if self._signalled():
            self._preempted(epoch, steps_done)
        if self._save_due():
            self._save("steps", epoch, steps_done)

    # --------------------------------------------------------- the callback's hooks

    def on_epoch_begin(self, epoch: int) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """tf_keras' fit: a group was just scheduled, `batch` its last step in the epoch.
        (Under Keras 3, tfdist's loop drives the backup through the protocol instead.)"""
        if not self._legacy:
            return
        coordinator = self.model._cluster_coordinator
        if not self._signalled():
            self._wait_for_room(coordinator)
        if self.stop_requested():
            coordinator.join()  # raises a group's error
            self.after_groups(self._epoch, batch + 1)

    def on_epoch_end(self, epoch: int) -> None:
        if self.callback.save_freq == "epoch":
            self._save("epoch", epoch + 1, 0)

    def on_train_end(self) -> None:
        self.close()
        if self.callback.delete_checkpoint:
            self._store.delete()

    # --------------------------------------------------------------------- internals

    def _wait_for_room(self, coordinator) -> None:
        """Waits until no more than a few groups per worker wait for one (tf_keras' fit
        schedules a whole epoch ahead), so that a stop waits for those only.

        Watches the queue of ClusterCoordinator (a worker runs one group at a time): waiting
        for a group's RemoteValue would keep it alive, and ClusterCoordinator then copies
        every group's logs to the coordinator. Where that queue changed, waits for nothing.
        """
        queue = getattr(getattr(coordinator, "_cluster", None), "closure_queue", None)
        waiting = getattr(getattr(queue, "_queue", None), "qsize", None)
        room = getattr(queue, "_queue_free_slot_condition", None)  # notified at each take
        if waiting is None or room is None:
            return
        limit = _IN_FLIGHT_PER_WORKER * self._workers
        with room:
            while waiting() > limit and not self._signalled():
                room.wait(1.0)

    def _signalled(self) -> bool:
        return self._agreement.signalled.is_set()

    def _save_due(self) -> bool:
        return self._every is not None and self._groups >= self._every

    def _iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _save(self, reason: str, epoch: int, step: int) -> None:
        self._groups = 0
        try:
            self._store.save(
                self._checkpoint,
                {
                    "epoch": epoch,
                    "step": step,
                    "position": None,  # each worker reads its own input: no position
                    "iterations": self._iterations(),
                    "reason": reason,
                    "workers": self._workers,
                    "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except BaseException:
            self.close()  # no on_train_end comes after an error (tf_keras' fit)
            raise

    def _restore(self) -> None:
        """Restores the newest backup that can be read, if any; refuses (ValueError) one that
        names no step of this fit or is another model's (tfdist.preemption.backup)."""
        epochs = (getattr(self.callback, "params", None) or {}).get("epochs")
        with self._store.refusing_restart():
            states = self._store.states(epochs=epochs if isinstance(epochs, int) else None)
            if not states:
                self._store.warn_unlisted()
                return
            # tf_keras' optimizer makes its slots at the first step; Keras 3's is built by now
            create_optimizer_variables(self.model, self._strategy)
            state = self._store.restore(self._checkpoint, states)
        epoch, step = state["epoch"], state["step"]
        self._initial_step = step
        start = Resume(epoch, step) if self._legacy else epoch
        setattr(self.model, self._start_attribute, start)
        where = f"epoch {epoch + 1}" + (f", step {step + 1}" if step else "")
        say(
            f"tfdist: restored the backup in {self.backup_dir} (optimizer step "
            f"{state.get('iterations')}); training resumes at {where}. On parameter_server "
            "each worker's input starts afresh (no input position is restored)."
        )

    def _preempted(self, epoch: int, step: int) -> None:
        self._agreement.reached()  # the scheduled groups have run: the save may take its time
        self._save("preemption", epoch, step)
        say(
            f"tfdist: SIGTERM to the coordinator ({self._task}): no group of steps was "
            f"scheduled after it, and training stopped once the scheduled ones had run, after "
            f"epoch {epoch + 1}, step {step} (optimizer step {self._iterations()}); the backup "
            f"is in {self.backup_dir}. Exiting with code {PREEMPTED_EXIT_CODE}: run the same "
            "command again to resume at the next step."
        )
        self.close()
        raise Preempted(epoch, step, self.backup_dir)

    def close(self) -> None:
        """The fit ended: SIGTERM ends the process again, the model forgets the backup."""
        if self._listening is not None:
            self._listening.__exit__(None, None, None)
            self._listening = None
        self._agreement.close()
        setattr(self.model, self._start_attribute, self._previous_start)
        if getattr(self.model, "_tfdist_backup", None) is self:
            object.__delattr__(self.model, "_tfdist_backup")
