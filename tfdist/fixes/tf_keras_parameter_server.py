"""A fix of tf_keras' own parameter-server fit: each step applied once when a worker is lost.

Nothing here imports TensorFlow or tf_keras at import time; tfdist.parameter_server is imported
when a train function is made.
"""

from tfdist.fixes.record import Fix, Target

TF_KERAS_PS_STEP_ONCE = Fix(
    name="tf_keras_parameter_server_step_applied_once",
    summary=(
        "tf_keras' fit schedules each call of its train function (steps_per_execution steps) "
        "as one ClusterCoordinator closure, which runs again from its first step on another "
        "worker when its worker is lost after it applied some of them."
    ),
    upstream=(
        "none found (ClusterCoordinator.schedule documents it: executed at least once, more "
        "than once if its worker fails in the middle)"
    ),
    strategies=("parameter_server",),
    consequence=(
        "a worker lost in the middle of a step applies that step (or that call's steps) twice: "
        "optimizer.iterations ends above the steps fit ran, and learning-rate schedules run "
        "ahead."
    ),
    library="tf_keras",
)
_TF_KERAS_MODEL = "tf_keras.src.engine.training:Model"


@TF_KERAS_PS_STEP_ONCE.variant(
    "2.16",
    targets=[
        Target(f"{_TF_KERAS_MODEL}.make_train_function", ("self", "force")),
        Target(f"{_TF_KERAS_MODEL}.train_step", ("self", "data")),
        Target(f"{_TF_KERAS_MODEL}.get_metrics_result", ("self",)),
    ],
)
def _fix_tf_keras_ps_step_once():
    # tf_keras' Model.make_train_function (tf_keras/src/engine/training.py) makes, under a
    # ClusterCoordinator, `lambda it: coordinator.schedule(train_function, args=(it, ...))`:
    # steps_per_execution steps of train_step in one closure. When the closure's worker fails
    # (killed, preempted, cut off) after some of those steps updated the variables on the ps,
    # ClusterCoordinator puts the closure back and runs it whole on another worker, so those
    # steps are applied twice (a worker killed in a 30-step fit left optimizer.iterations at
    # 31). The fix schedules the same steps through tfdist's exactly-once runner
    # (tfdist.parameter_server.runner, as tfdist's Keras 3 loop does): each call counts its
    # steps in a slot of a progress variable on the ps, right after the optimizer counted
    # them, and a run after a failure applies only the steps its slot has not counted. Its
    # logs are those of its last step, as upstream's; the model's _train_counter counts each
    # step, as upstream's. Only where the model keeps tf_keras' own make_train_function, under
    # a ClusterCoordinator, traced (not run_eagerly, jit_compile or an autotuned
    # steps_per_execution).
    import tensorflow as tf
    from tf_keras.src.engine import training

    original = training.Model.make_train_function

    def eligible(model) -> bool:
        return (
            getattr(model, "_cluster_coordinator", None) is not None
            # the model keeps tf_keras' own (this fix's, or another fix's over it)
            and type(model).make_train_function is training.Model.make_train_function
            and not model.run_eagerly
            and not model.jit_compile
            and not model.autotune_steps_per_execution
        )

    def train_step_counted(model):
        def step(data):
            outputs = model.train_step(data)
            with tf.control_dependencies(tf.nest.flatten(outputs)[:1]):
                model._train_counter.assign_add(1)
            return outputs

        return step

    def runner_of(model):
        from tfdist.parameter_server import runner as runners

        token = (model.distribute_strategy, model.optimizer, model.compiled_loss)
        cached = model.__dict__.get("_tfdist_ps_step_once")  # past tf_keras' tracking
        if cached is None or any(a is not b for a, b in zip(cached[0], token)):
            runner = runners._Runner(
                model,
                model.distribute_strategy,
                model._cluster_coordinator,
                train_step=train_step_counted(model),
            )
            cached = model.__dict__["_tfdist_ps_step_once"] = (token, runner)
        return cached[1]

    def make_train_function(self, force=False):
        cached = self.train_function
        if cached is not None and not force and getattr(cached, "_tfdist_once", False):
            cached.begin()
            return cached
        function = original(self, force)
        if not eligible(self):
            return function
        from tfdist.parameter_server import runner as runners

        runner = runner_of(self)
        setting = self._steps_per_execution
        fixed = None if setting is None or int(setting.numpy()) != 1 else 1
        state = {}

        def train_function(iterator):
            # upstream reads the setting at each call too: fit lowers it for an epoch's last,
            # shorter call
            size = fixed or int(setting.numpy())
            return runner.schedule_one("train", iterator, size, state["flight"])

        def begin():  # each fit: its own groups in flight; the slots read again from the ps
            state["flight"] = runners.InFlight()
            runner.forget_slots()

        train_function._tfdist_once = True
        train_function.begin = begin
        begin()
        self.train_function = train_function
        return train_function

    training.Model.make_train_function = make_train_function


FIXES = (TF_KERAS_PS_STEP_ONCE,)
