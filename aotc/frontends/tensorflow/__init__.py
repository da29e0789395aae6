"""TensorFlow frontend: frozen GraphDefs (``.pb``, ``.pbtxt``) -> IR, without TensorFlow installed.

The protobuf messages come from the ``tensorboard`` package (``pip install 'aotc[tf]'``).
"""

from aotc.frontends.tensorflow.importer import import_graphdef, is_tensorflow_model
from aotc.frontends.tensorflow.proto import load_graphdef
from aotc.frontends.tensorflow.summary import GraphSummary, summarize

__all__ = ["GraphSummary", "import_graphdef", "is_tensorflow_model", "load_graphdef", "summarize"]
