"""The board co-simulation: the ULX3S board SoC (NPU, RAM, UART bridge) under
Verilator, driven through its UART pins by the real serial host stack
(SerialDevice -> NPUDriver -> compiler -> Session), running the bundled mlp. Every
inference equals the reference interpreter and the golden model (outputs, exact
counters, trace); a garbled frame is rejected unexecuted and the board keeps working
(``verif.board_cosim.board_runs_model``).

It runs in ``make regress``: building the SoC costs about 3 minutes on a fresh
machine and simulating it about a minute (the UART traffic), which ``make test``
cannot afford on 2 cores; the bridge's own tests (tests/test_bridge.py) run there.
"""

import pytest

from verif.board_cosim import run_board_cosim

pytestmark = pytest.mark.rtl  # runs the RTL under Verilator


@pytest.mark.slow
def test_board_runs_mlp_over_uart(seed):
    run_board_cosim("mlp", inputs=1, seed=seed)
