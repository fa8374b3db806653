"""The demo (make demo / make sim) runs end to end and checks its own results."""

from pathlib import Path

from host import demo

PROGRAMS = Path(__file__).resolve().parent.parent / "firmware" / "programs"


def test_demo_outputs_match_reference(capsys):
    assert demo.main(["--inputs", "6", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "all outputs equal the numpy reference" in out
    assert "MISMATCH" not in out


def test_sim_runs_a_program(capsys):
    assert demo.main(["--program", str(PROGRAMS / "scalar.s"), "--args", "4"]) == 0
    out = capsys.readouterr().out
    assert "r2=0xa" in out  # 1+2+3+4


def test_sim_reports_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.s"
    bad.write_text("li r1, 1\n.word 0\n")
    assert demo.main(["--program", str(bad)]) == 1
    assert "ILLEGAL_INSTRUCTION at pc 1" in capsys.readouterr().out
