"""The demo (``make demo``) runs end to end and checks its own results.

Here on the golden backend; the same code on the RTL is tests/test_models_rtl.py.
"""

from host import demo


def test_demo_runs_the_gated_moe(capsys):
    assert demo.main(["--backend", "golden", "--digits", "6"]) == 0
    out = capsys.readouterr().out
    assert "moe on the golden NPU" in out
    assert "6/6 results equal the reference interpreter" in out
