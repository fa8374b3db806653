"""The Verilator backend's host side, without building the RTL (tests/test_fastsim.py
runs it): the host never imports hdl or verif, and a build that cannot happen is one
line and an exit code."""

import subprocess
import sys

import pytest

from host import cli, verilator_device
from host.verilator_device import SimBuildError


def test_host_imports_neither_hdl_nor_verif():
    code = ("import sys, host.cli, host.verilator_device, host.demo, host.runtime; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('hdl', 'verif')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("missing_tools, code", [(True, cli.ExitCode.USAGE),
                                                 (False, cli.ExitCode.INTERNAL)])
def test_a_failed_build_is_one_line(monkeypatch, capsys, missing_tools, code):
    def fail(config, on_status=None, profiled=False):
        raise SimBuildError("the Verilator build failed (log: build.log)", missing_tools)

    monkeypatch.setattr(verilator_device, "build_library", fail)
    assert cli.main(["info", "--backend", "verilator"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("npu: the Verilator build failed")


def test_missing_build_tools_name_the_way_out(monkeypatch):
    def no_module(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 2, "", "verilator is not installed\n")

    monkeypatch.setattr(subprocess, "run", no_module)
    with pytest.raises(SimBuildError, match="make setup") as info:
        verilator_device.build_library(cli.CONFIGS["default"])
    assert info.value.missing_tools
