"""The host reaches the NPU only through a Device and never imports hdl or verif, the
Verilator backend included (it builds its library in a subprocess)."""

import subprocess
import sys


def test_host_imports_neither_hdl_nor_verif():
    code = ("import sys, host.cli, host.verilator_device, host.demo, host.runtime; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('hdl', 'verif')); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
