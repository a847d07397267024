"""Parameter-server training (tfdist.parameter_server) without TensorFlow: the step plan, the
argument checks made before anything runs, and how the loop hands steps to a backup."""

import pytest

from tfdist.parameter_server import fit_parameter_server, plan_groups

from helpers.parameter_server import _dataset_fn

# --------------------------------------------------------------------------- step planning


@pytest.mark.parametrize(
    "steps, k, groups",
    [
        (1, 1, [(0, 0)]),
        (3, 1, [(0, 0), (1, 1), (2, 2)]),
        (6, 3, [(0, 2), (3, 5)]),
        (7, 3, [(0, 2), (3, 5), (6, 6)]),
        (10, 4, [(0, 3), (4, 7), (8, 9)]),
        (2, 5, [(0, 1)]),
    ],
)
def test_plan_groups_covers_every_step_once_with_a_shorter_last_group(steps, k, groups):
    assert plan_groups(steps, k) == groups
    covered = [s for begin, end in groups for s in range(begin, end + 1)]
    assert covered == list(range(steps))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(steps_per_epoch=0),
            r"`steps_per_epoch` must be a positive integer. Received: "
            r"steps_per_epoch=0",
        ),
        (dict(steps_per_epoch=True), r"Received: steps_per_epoch=True"),
        (
            dict(steps_per_epoch=5, epochs=-1),
            r"`epochs` must be an integer >= 0. Received: "
            r"epochs=-1",
        ),
        (dict(steps_per_epoch=5, steps_per_execution=0), r"Received: steps_per_execution=0"),
        (
            dict(steps_per_epoch=5, validation_dataset_fn=_dataset_fn),
            r"`validation_steps` is required with `validation_dataset_fn`",
        ),
    ],
)
def test_fit_rejects_bad_counts_naming_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fit_parameter_server(object(), object(), _dataset_fn, **kwargs)


# ------------------------------------------------- the loop and a backup (the duck protocol)


class _Runner:
    """Schedules like tfdist's runner (asking should_stop once per group), runs nothing."""

    window = 8

    def __init__(self):
        self.runs, self.scheduled = [], 0

    def run(self, mode, iterator, steps, k, on_begin, on_end, should_stop, **options):
        self.runs.append((steps, options))
        self.scheduled = 0
        for _, end in plan_groups(steps, k):
            self.scheduled = end + 1
            if should_stop():
                break
        return {}


class _Stopped(Exception):
    pass


class _Backup:
    """Asks for a stop every `every` groups (a save), and for good after `signal` groups."""

    def __init__(self, every=None, signal=None):
        self.callback = object()
        self.every, self.signal = every, signal
        self.groups = self.total = 0
        self.handed = []

    def initial_step(self):
        return 0

    def stop_requested(self):
        self.groups += 1
        self.total += 1
        signalled = self.signal is not None and self.total >= self.signal
        return signalled or (self.every is not None and self.groups >= self.every)

    def after_groups(self, epoch, steps_done):
        self.handed.append((epoch, steps_done))
        if self.signal is not None and self.total >= self.signal:
            raise _Stopped(epoch, steps_done)
        if self.every is not None and self.groups >= self.every:
            self.groups = 0


class _Model:
    stop_training = False


def _train(backup, step=4, steps=20, k=3):
    from tfdist.parameter_server.loop import _train_epoch

    runner = _Runner()
    _train_epoch(_Model(), runner, None, 1, step, steps, k, None, False, backup)
    return runner


def test_without_a_backup_an_epoch_is_one_run_scheduled_as_far_ahead_as_it_goes():
    runner = _train(None)
    assert runner.runs == [(16, {"batch_hooks": False, "ahead": None})]


def test_a_backup_gets_the_steps_done_at_each_stop_and_the_epoch_goes_on_from_there():
    backup = _Backup(every=2)
    runner = _train(backup)  # steps 4..19 in groups of 3: 3, 3 | 3, 3 | 3, 1
    assert [steps for steps, _ in runner.runs] == [16, 10, 4]
    assert all(options == {"batch_hooks": False, "ahead": 8} for _, options in runner.runs)
    assert backup.handed == [(1, 10), (1, 16), (1, 20)]


def test_a_backup_that_raises_ends_the_epoch_after_the_groups_scheduled():
    backup = _Backup(every=4, signal=3)
    with pytest.raises(_Stopped) as stopped:
        _train(backup)
    assert stopped.value.args == (1, 13)  # 3 groups of 3 after step 4
    assert backup.handed == [(1, 13)]


def test_a_backup_left_by_another_fit_is_ignored():
    from tfdist.parameter_server.loop import _backup_of

    class Callbacks:
        callbacks = []

    model, backup = _Model(), _Backup()
    object.__setattr__(model, "_tfdist_backup", backup)
    assert _backup_of(model, Callbacks()) is None
    Callbacks.callbacks = [backup.callback]
    assert _backup_of(model, Callbacks()) is backup


def test_tf_keras_resumes_inside_the_epoch_or_at_the_next_one_after_its_last_step():
    from tfdist.preemption.parameter_server import Resume

    assert Resume(1, 10).maybe_load_initial_counters_from_ckpt(40, 0) == (1, 10)
    assert Resume(1, 40).maybe_load_initial_counters_from_ckpt(40, 0) == (2, 0)


def test_a_fit_that_fails_closes_its_backup():
    from tfdist.parameter_server.loop import _closed_on_error

    closed = []
    backup = _Backup()
    backup.close = lambda: closed.append(True)
    with pytest.raises(_Stopped):
        with _closed_on_error(backup):
            raise _Stopped()
    with _closed_on_error(backup):
        pass
    with pytest.raises(_Stopped):
        with _closed_on_error(None):
            raise _Stopped()
    assert closed == [True]
