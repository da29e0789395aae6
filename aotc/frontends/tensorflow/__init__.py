"""TensorFlow frontend: frozen GraphDefs (``.pb``, ``.pbtxt``) -> IR, without TensorFlow installed.

The protobuf messages come from the ``tensorboard`` package (``pip install 'aotc[tf]'``).
"""

from aotc.frontends.tensorflow.importer import import_graphdef, is_tensorflow_model, list_ops
from aotc.frontends.tensorflow.proto import load_graphdef

__all__ = ["import_graphdef", "is_tensorflow_model", "list_ops", "load_graphdef"]
