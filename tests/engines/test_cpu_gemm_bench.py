"""bench/cpu_gemm.py leans on torch's internal oneDNN ops (``_reorder_linear_weight``,
``_linear_pointwise``): they still exist in the installed torch, and their float32 products equal
MKL's up to rounding, at the bench's shapes made small."""

import importlib.util

import pytest

from tests.helpers import ROOT


def load():
    spec = importlib.util.spec_from_file_location("cpu_gemm", ROOT / "bench" / "cpu_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_onednn_ops_exist_and_agree_with_mkl():
    bench = load()
    ops = bench.onednn_ops()
    assert ops is not None, "torch.ops.mkldnn._linear_pointwise / _reorder_linear_weight are gone"
    mkl, dnn, diff = bench.square(64, 1, ops)
    assert mkl > 0 and dnn > 0 and diff < 1e-5
    bench.LAYERS = 1  # one layer and the head: the step's every shape, once
    t_mkl, t_dnn, gflop, diff = bench.decode_products(3, 1, ops)
    assert t_mkl > 0 and t_dnn > 0 and diff < 1e-5
    shapes = [*bench.DECODE, ("head", bench.HIDDEN, bench.VOCAB)]
    assert gflop == pytest.approx(2 * 3 * sum(i * o for _, i, o in shapes) / 1e9)
