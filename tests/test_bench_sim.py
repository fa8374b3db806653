"""``make bench-sim``'s inputs: the model's samples first, then seeded ones like them."""

import numpy as np

from bench.sim import bench_inputs
from host.cli import model_path
from host.onnx_import import load_onnx
from verif.model_scenarios import model_inputs


def test_inputs_start_with_the_samples_and_are_seeded():
    graph = load_onnx(model_path("resnet8"), allow_cpu_fallback=True)
    name, shape = graph.inputs[0], graph.tensors[graph.inputs[0]].shape
    samples = model_inputs("resnet8", graph)
    got = bench_inputs("resnet8", graph, 10, seed=3)
    assert len(got) == 10 and all(x[name].shape == tuple(shape) for x in got)
    assert all(x[name].dtype == np.float32 for x in got)
    for a, b in zip(got, samples, strict=False):
        np.testing.assert_array_equal(a[name], b[name])
    again = bench_inputs("resnet8", graph, 10, seed=3)
    other = bench_inputs("resnet8", graph, 10, seed=4)
    np.testing.assert_array_equal(got[-1][name], again[-1][name])
    assert not np.array_equal(got[-1][name], other[-1][name])
    # like the samples: the same range per channel, not their copies
    extra = np.stack([x[name] for x in got[len(samples):]])
    sample = np.stack([x[name] for x in samples])
    assert abs(extra.mean() - sample.mean()) < 0.5 * sample.std()
    assert bench_inputs("resnet8", graph, 2, seed=3)[1][name].tolist() == samples[1][name].tolist()
