"""Parameter-server training of Keras models through a `ClusterCoordinator`.

Keras 3's own `fit` has no ParameterServerStrategy support (keras-team/keras#18624), so tfdist
drives a compiled Keras 3 model itself, from the coordinator (the chief): the model's, its
metrics' and its optimizer's variables live on the ps tasks, every worker makes its own dataset
from a dataset function, and scheduled functions each run `steps_per_execution` of the model's
own `train_step` / `test_step` on whichever worker is free. Under tf_keras the same calls go to
tf_keras's `fit` with a `DatasetCreator`, which supports parameter-server training natively.

Exact step counts and metrics need the Keras fixes of `tfdist.fixes` (atomic assign_add on ps
variables); sharded variables (a `variable_partitioner`) need the sharding fixes there too.
`tfdist.make_strategy` and `tfdist.fit` apply them.

Faults: a worker that dies costs nothing but its share of the work (its unfinished group of
steps runs again on another worker, each step applied once); a ps that dies takes the model's
variables with it, and fit / evaluate raise `TaskUnavailableError` naming it: restart the job
from its last checkpoint.

The modules, each importing only modules below it in this list:

- `keras_arguments`: Keras' `model.fit(x, y, batch_size, ...)` / `model.evaluate` arguments
  turned into a dataset function (`keras_fit`, `keras_evaluate`, which tfdist's Keras fixes
  install as the model's `fit` / `evaluate`).
- `loop`: `fit_parameter_server`, `evaluate_parameter_server`: the Keras 3 epoch loop, its
  callbacks and logs; under tf_keras it dispatches to `tf_keras`.
- `model`: `build_for_parameter_server`: a given compiled model's variables built on the ps.
- `tf_keras`: fit / evaluate under tf_keras, through its own `fit` / `evaluate`.
- `runner`: `coordinator_for`, and the exactly-once runner: groups of steps (`plan_groups`)
  scheduled on the workers, each step applied once even when a worker dies.
- `watchdog`: probes the ps and worker tasks; a lost ps becomes a `TaskUnavailableError`.
- `datasets`: dataset functions repeated and made once per worker; one local batch.
- `checks`: the argument checks every entry point shares.

Nothing here imports TensorFlow at import time.
"""

from tfdist.errors import TaskUnavailableError
from tfdist.parameter_server.keras_arguments import keras_evaluate, keras_fit
from tfdist.parameter_server.loop import evaluate_parameter_server, fit_parameter_server
from tfdist.parameter_server.model import build_for_parameter_server
from tfdist.parameter_server.runner import coordinator_for, plan_groups

__all__ = [
    "TaskUnavailableError",
    "build_for_parameter_server",
    "coordinator_for",
    "evaluate_parameter_server",
    "fit_parameter_server",
    "keras_evaluate",
    "keras_fit",
    "plan_groups",
]
