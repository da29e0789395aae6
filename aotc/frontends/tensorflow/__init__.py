"""TensorFlow frontend: frozen GraphDefs (``.pb``, ``.pbtxt``) and SavedModel directories -> IR, without
TensorFlow installed.

The protobuf messages come from the ``tensorboard`` package (``pip install 'aotc[tf]'``).
"""

from __future__ import annotations

from pathlib import Path

from aotc.config import Config
from aotc.errors import AotcError
from aotc.frontends.tensorflow.importer import import_graphdef
from aotc.frontends.tensorflow.proto import load_graphdef
from aotc.frontends.tensorflow.savedmodel import (
    DEFAULT_SIGNATURE,
    DEFAULT_TAG_SET,
    import_saved_model,
    is_saved_model,
    model_files,
)
from aotc.frontends.tensorflow.summary import GraphSummary, summarize
from aotc.ir.graph import Graph

__all__ = ["GraphSummary", "import_graphdef", "import_saved_model", "import_tensorflow", "is_saved_model",
           "is_tensorflow_model", "load_graphdef", "summarize", "tensorflow_model_files"]


def is_tensorflow_model(path: str | Path) -> bool:
    """Whether ``path`` names a TensorFlow GraphDef (by its suffix, as ``.onnx`` names ONNX) or a
    SavedModel directory."""
    return Path(path).suffix in (".pb", ".pbtxt") or is_saved_model(path)


def tensorflow_model_files(path: str | Path) -> list[Path]:
    """The files compiling ``path`` reads (a SavedModel is a directory)."""
    return model_files(Path(path)) if is_saved_model(path) else [Path(path)]


def import_tensorflow(path: str | Path, shapes: dict[str, tuple[int, ...]] | None = None, name: str = "model",
                      config: Config | None = None, tag_set: str | None = None, signature: str | None = None,
                      variables_to_feed: list[str] | None = None) -> Graph:
    """A GraphDef file or a SavedModel directory as a Graph; ``tag_set``, ``signature`` and
    ``variables_to_feed`` choose what of a SavedModel (see import_saved_model)."""
    if is_saved_model(path):
        return import_saved_model(path, shapes, name, config, tag_set or DEFAULT_TAG_SET,
                                  signature or DEFAULT_SIGNATURE, variables_to_feed)
    check_graph_options(path, tag_set, signature, variables_to_feed)
    return import_graphdef(path, shapes, name, config)


def check_graph_options(path: str | Path, tag_set: str | None, signature: str | None,
                        variables_to_feed: list[str] | None) -> None:
    """Refuse the SavedModel options for a model that is not a SavedModel directory."""
    given = [o for o, v in (("--tag-set", tag_set), ("--signature", signature),
                            ("--variables-to-feed", variables_to_feed)) if v]
    if given:
        raise AotcError(f"{', '.join(given)}: only for SavedModel directories, and {path} is not one")
