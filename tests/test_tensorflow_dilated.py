"""Dilated convolutions as TensorFlow writes them (SpaceToBatchND -> Conv2D or DepthwiseConv2dNative
-> BatchToSpaceND; aotc/frontends/tensorflow/dilated.py) import as one dilated conv each and match
TensorFlow (fixtures: tests/tf_small_fixtures.py)."""

from __future__ import annotations

import numpy as np
from tf_small_fixtures import small_fixtures_dir

import aotc
from aotc.compiler import compile_model
from aotc.frontends.tensorflow import import_graphdef

OUTPUTS = ["y_same", "y_valid", "y_depthwise"]


def test_space_to_batch_convs_are_one_dilated_conv(tmp_path):
    fx = small_fixtures_dir()
    data = np.load(fx / "dilated.npz")
    graph = import_graphdef(fx / "dilated.pb", outputs=OUTPUTS)
    convs = [(n.attrs["dilations"], n.attrs["pads"], n.attrs["group"]) for n in graph.nodes if n.op == "Conv"]
    # SAME at rates (2, 3) on a 3x3 kernel pads 2 and 3; VALID pads nothing; the depthwise 3x2 kernel
    # at rate 2 pads 2 rows and 1 column on each side.
    assert convs == [([2, 3], [2, 3, 2, 3], 1), ([3, 2], [0, 0, 0, 0], 1), ([2, 2], [2, 1, 2, 1], 4)]
    assert {n.op for n in graph.nodes} == {"Conv", "Transpose"}  # no pad, reshape or slice left
    model = aotc.load(compile_model(graph, tmp_path, "dilated").prefix)
    for name, got in zip(OUTPUTS, model.run({"x": data["x"]}), strict=True):
        np.testing.assert_allclose(got, data[name], rtol=1e-4, atol=1e-4, err_msg=name)
