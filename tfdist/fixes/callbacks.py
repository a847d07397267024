"""Fixes of Keras 3 callbacks under multi_worker_mirrored: checkpoints and TensorBoard logs
written once, by the chief.

Nothing here imports TensorFlow or Keras at import time.
"""

import os

from tfdist.fixes.record import Fix, Target


def _multi_worker_role(model):
    """(is_chief, task_id) when `model` trains under a multi-worker strategy, else None."""
    strategy = getattr(model, "_distribute_strategy", None)
    extended = getattr(strategy, "extended", None)
    in_multi_worker = getattr(extended, "_in_multi_worker_mode", None)
    if in_multi_worker is None or not in_multi_worker():
        return None
    resolver = getattr(strategy, "cluster_resolver", None)
    return bool(extended.should_checkpoint), getattr(resolver, "task_id", 0) or 0


MULTI_WORKER_CHECKPOINTS = Fix(
    name="multi_worker_checkpoint_callbacks",
    summary=(
        "ModelCheckpoint and BackupAndRestore let every worker write and delete the same paths."
    ),
    upstream="keras-team/keras#20585",
    strategies=("multi_worker_mirrored",),
    consequence=(
        "ModelCheckpoint / BackupAndRestore on multi_worker_mirrored race on the same files "
        '("unable to lock file", "FileExistsError") and the job aborts.'
    ),
)


@MULTI_WORKER_CHECKPOINTS.variant(
    "3.3",
    targets=[
        Target(
            "keras.src.callbacks.model_checkpoint:ModelCheckpoint._get_file_path",
            ("self", "epoch", "batch", "logs"),
        ),
        Target(
            "keras.src.callbacks.model_checkpoint:ModelCheckpoint._save_model",
            ("self", "epoch", "batch", "logs"),
        ),
        Target("keras.src.callbacks.backup_and_restore:BackupAndRestore._save_model", ("self",)),
        Target(
            "keras.src.callbacks.backup_and_restore:BackupAndRestore.on_train_end", ("self", "logs")
        ),
    ],
)
def _fix_multi_worker_checkpoints():
    # keras-team/keras#20585 (multi-worker support in general); tf_keras handled this in
    # distribute/distributed_file_utils.py and worker_training_state.py. Keras 3's
    # ModelCheckpoint._save_model and BackupAndRestore._save_model / on_train_end
    # (keras/src/callbacks/) let every worker write and delete the same paths: "BlockingIOError:
    # Unable to synchronously create file (unable to lock file)", "FileExistsError: ... backup",
    # then the peers' collectives abort. As in tf_keras: every worker still saves (saving may
    # read distributed variables collectively), non-chief workers into a private temporary
    # directory removed right after (not inside the chief's directory, which the chief may
    # delete while a slower peer still writes); only the chief writes the real path and
    # deletes the backup at the end. All workers restore from the chief's backup (a shared
    # filesystem, as in tf_keras).
    import shutil

    from keras.src.callbacks import backup_and_restore, model_checkpoint

    from tfdist import scratch as scratch_files

    def temp_dir(task_id):
        return scratch_files.make_dir(f"tfdist-worker{task_id}-")

    checkpoint_cls = model_checkpoint.ModelCheckpoint
    original_path, original_save = checkpoint_cls._get_file_path, checkpoint_cls._save_model

    def _get_file_path(self, epoch, batch, logs):
        path = original_path(self, epoch, batch, logs)
        role = _multi_worker_role(self.model)
        if role is None or role[0]:
            return path
        directory = temp_dir(role[1])
        self._tfdist_temp_dir = directory
        return os.path.join(directory, os.path.basename(path))

    def _save_model(self, epoch, batch, logs):
        try:
            return original_save(self, epoch, batch, logs)
        finally:
            directory = getattr(self, "_tfdist_temp_dir", None)
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
                self._tfdist_temp_dir = None

    checkpoint_cls._get_file_path, checkpoint_cls._save_model = _get_file_path, _save_model

    backup_cls = backup_and_restore.BackupAndRestore
    original_backup, original_end = backup_cls._save_model, backup_cls.on_train_end
    paths = (
        "_weights_path",
        "_training_metadata_path",
        "_prev_weights_path",
        "_prev_training_metadata_path",
    )

    def save_backup(self):
        role = _multi_worker_role(self.model)
        if role is None:
            return original_backup(self)
        if role[0]:
            os.makedirs(self.backup_dir, exist_ok=True)  # before peers can race for it
            return original_backup(self)
        here = tuple(name for name in paths if hasattr(self, name))  # _prev_*: Keras 3.8 on
        saved = {name: getattr(self, name) for name in ("backup_dir",) + here}
        directory = temp_dir(role[1])
        try:
            self.backup_dir = directory
            for name in here:
                setattr(self, name, os.path.join(directory, os.path.basename(saved[name])))
            return original_backup(self)
        finally:
            for name, value in saved.items():
                setattr(self, name, value)
            shutil.rmtree(directory, ignore_errors=True)

    def on_train_end(self, logs=None):
        role = _multi_worker_role(self.model)
        if role is not None and not role[0]:
            return  # only the chief removes the shared backup
        return original_end(self, logs)

    backup_cls._save_model, backup_cls.on_train_end = save_backup, on_train_end


MULTI_WORKER_TENSORBOARD = Fix(
    name="multi_worker_tensorboard_written_by_the_chief",
    summary=("The TensorBoard callback writes its logs from every worker into the same directory."),
    upstream="keras-team/keras#20585",
    strategies=("multi_worker_mirrored",),
    consequence=(
        "a multi_worker_mirrored job's TensorBoard directory holds one event file per worker, "
        "each with every step: TensorBoard shows each scalar once per worker (no error)."
    ),
)


@MULTI_WORKER_TENSORBOARD.variant(
    "3.3",
    targets=[
        Target("keras.src.callbacks.tensorboard:TensorBoard.set_model", ("self", "model")),
        Target("keras.src.callbacks.tensorboard:TensorBoard.on_train_end", ("self", "logs")),
    ],
)
def _fix_multi_worker_tensorboard():
    # keras-team/keras#20585 (multi-worker support in general). Keras 3's TensorBoard
    # (keras/src/callbacks/tensorboard.py) sets its directories from log_dir in set_model and
    # writes there on every worker: two workers leave two event files in log_dir/train, each
    # with the same steps, and TensorBoard draws every point twice. tf_keras has non-chief
    # workers write into a temporary directory (distributed_file_utils.write_dirpath) that
    # on_train_end removes; the fix does the same (the writes still run on every worker: a
    # histogram or an image reads the same values everywhere, and no worker waits for another).
    import shutil

    from keras.src.callbacks import tensorboard

    from tfdist import scratch as scratch_files

    board = tensorboard.TensorBoard
    original_set_model, original_end = board.set_model, board.on_train_end

    def set_model(self, model):
        role = _multi_worker_role(model)
        if role is None or role[0]:
            return original_set_model(self, model)
        directory = getattr(self, "_tfdist_temp_dir", None)  # set once a fit (evaluate again)
        if not directory:
            directory = scratch_files.make_dir(f"tfdist-worker{role[1]}-")
            self._tfdist_temp_dir = directory
        log_dir, self.log_dir = self.log_dir, directory
        try:
            return original_set_model(self, model)
        finally:
            self.log_dir = log_dir

    def on_train_end(self, logs=None):
        try:
            return original_end(self, logs)
        finally:
            directory = getattr(self, "_tfdist_temp_dir", None)
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
                self._tfdist_temp_dir = None

    board.set_model, board.on_train_end = set_model, on_train_end


FIXES = (MULTI_WORKER_CHECKPOINTS, MULTI_WORKER_TENSORBOARD)
