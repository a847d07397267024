"""The start-up module of every task `tfdist launch` starts: `sitecustomize.py` in this folder.

The launcher puts this folder first on each task's PYTHONPATH. Python imports `sitecustomize`
at start-up, before the script, so an unmodified script gets what `import tfdist` gives (Keras
3's `keras.distribution` carried by tf.distribute; no TensorFlow is imported here). Then the
`sitecustomize` this one hides, if the environment has one, runs as it would have.
"""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))
