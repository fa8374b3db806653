"""The demo (``make demo``) runs end to end and checks its own results.

Here on the golden backend; the same loop on the RTL is tests/test_adaptive_rtl.py.
Plans compile inline: on the golden backend inferences are so fast that, on a loaded
machine, 40 of them can end before a worker thread's compile does (the test then saw
no swap; the worker-thread path is tested in tests/test_adaptive.py).
"""

from firmware.config import CONFIGS
from host import cli, demo
from host.adaptive.saved import report_path


def test_demo_serves_the_gated_moe_adaptively(capsys, tmp_path, monkeypatch):
    """Batches of 8 (the default): routed batch variants, and the speedup line."""
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path))
    assert demo.main(["--backend", "golden", "--digits", "40", "--inline-compile"]) == 0
    out = capsys.readouterr().out
    assert "moe on the golden NPU with the adaptive runtime" in out
    assert "40/40 results equal the reference interpreter" in out
    assert "specialized" in out and "route8[" in out and "speedup:" in out
    assert report_path(cli.MODELS / "moe.onnx", CONFIGS["default"]).exists()


def test_demo_one_at_a_time_fuses_and_swaps(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path))
    assert demo.main(["--backend", "golden", "--digits", "40", "--batch", "1",
                      "--inline-compile"]) == 0
    out = capsys.readouterr().out
    assert "40/40 results equal the reference interpreter" in out
    assert "swapped-in" in out and "validated" in out
