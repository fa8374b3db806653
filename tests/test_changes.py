"""The plan change's state machine: the legal moves, and the runtime walking them."""

from concurrent.futures import Future

import numpy as np
import pytest

from firmware.config import CONFIGS
from host.adaptive import AdaptiveConfig, AdaptiveRuntime
from host.adaptive.changes import MOVES, ChangeKind, PlanChange, PlanChanges, PlanState, Validation
from host.cli import model_path
from host.datasets import class_mix_stream
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx


def _change(kind=ChangeKind.MERGE):
    return PlanChange(kind, unit=None, plan=[], reason="test")


def test_a_change_walks_serving_to_validating_and_back():
    c = PlanChanges()
    change = _change()
    c.plan(change)
    assert c.state is PlanState.COMPILING and c.planned(ChangeKind.MERGE)
    assert not c.planned(ChangeKind.SPLIT)
    c.compiled()
    c.stage()
    assert c.state is PlanState.STAGED and c.waiting_to_land()
    v = Validation(change, previous=None, left=3)
    c.land(v)
    assert c.state is PlanState.VALIDATING and c.change is None and c.validation is v
    assert c.validated() is v
    assert c.state is PlanState.SERVING and c.validation is None
    assert not c.waiting_to_land()


def test_refusals_trust_and_rollback_return_to_serving():
    c = PlanChanges()
    c.plan(_change())
    c.refused()
    assert c.state is PlanState.SERVING and c.change is None
    c.plan(_change(ChangeKind.SPLIT))
    c.compiled()
    c.stage()
    c.land(None)  # validate_runs == 0: trusted at once
    assert c.state is PlanState.SERVING
    c.plan(_change())
    c.compiled()
    c.stage()
    c.land(Validation(_change(), previous=None, left=1))
    c.rolled_back()
    assert c.state is PlanState.SERVING


@pytest.mark.parametrize("state", list(PlanState))
def test_every_other_move_is_refused(state):
    moves = {"plan": lambda c: c.plan(_change()), "compiled": PlanChanges.compiled,
             "refused": PlanChanges.refused, "stage": PlanChanges.stage,
             "land": lambda c: c.land(Validation(_change(), None, 1)),
             "trust": lambda c: c.land(None), "validated": PlanChanges.validated,
             "rollback": PlanChanges.rolled_back}
    for event, move in moves.items():
        c = PlanChanges()
        c.state = state
        if (state, event) in MOVES:
            continue
        with pytest.raises(RuntimeError, match=f"cannot {event} while {state.value}"):
            move(c)


def test_a_compile_still_running_is_not_waiting_to_land():
    c = PlanChanges()
    change = _change()
    change.future = Future()
    c.plan(change)
    assert not c.waiting_to_land()
    change.future.set_result(None)
    assert c.waiting_to_land()  # finished, not yet collected: it lands next


def test_the_runtime_passes_through_each_state(seed):
    drv = NPUDriver(GoldenDevice(CONFIGS["default"]))
    rt = AdaptiveRuntime(drv, load_onnx(model_path("mlp")), AdaptiveConfig(async_compile=False))
    rt.load()
    inp = rt.graph.inputs[0]
    shape = rt.graph.tensors[inp].shape
    seen = []
    for s in class_mix_stream(16, [{c: 1.0 for c in range(10)}], seed):
        rt.run({inp: s.x.reshape(shape).astype(np.float32)})
        if not seen or seen[-1] is not rt.changes.state:
            seen.append(rt.changes.state)
    # Compiled inline, a merge is ready right after the decision; it lands (staged
    # during the next run) and is validated for validate_runs inferences.
    assert seen == [PlanState.SERVING, PlanState.READY, PlanState.VALIDATING,
                    PlanState.SERVING], seen
