"""The counters by cause (firmware.regs.CAUSE_COUNTERS): a program per counter makes
it count in the golden model, exactly, and the RTL counts the same."""

import pytest

from firmware import asm, isa
from firmware.golden import CostModel, Machine
from firmware.regs import CAUSE_COUNTERS, TRACE_FIELDS
from verif.scenarios import CAUSE_PROGRAMS, COST_ARGS, COST_PROGRAMS, TABLE


def _run(source: str) -> Machine:
    machine = Machine()
    result = machine.load_and_run(asm.assemble(source + "end\n"), TABLE, args=COST_ARGS)
    assert result.ok and result.cycles_exact
    return machine


def test_a_program_per_counter():
    assert set(CAUSE_PROGRAMS) == set(CAUSE_COUNTERS)


@pytest.mark.parametrize("name", CAUSE_COUNTERS)
def test_program_makes_its_counter_count(name):
    assert _run(CAUSE_PROGRAMS[name]).counters[name] > 0


def test_sequencer_stalls_split_by_cause():
    """stall_cycles is the sum of its two causes, and each is the one that made it."""
    for body in CAUSE_PROGRAMS.values():
        c = _run(body).counters
        assert c["stall_cycles"] == c["stall_in_seq"] + c["stall_out_seq"]
    # a full queue stalls the dispatch, a register being written waits for it
    full, reg = (_run(CAUSE_PROGRAMS[n]).counters for n in ("stall_out_seq", "stall_in_seq"))
    assert full["stall_out_seq"] > 0 and reg["stall_in_seq"] > 0 and reg["stall_out_seq"] == 0


STRAIGHT = {name: body for name, body in {**COST_PROGRAMS, **CAUSE_PROGRAMS}.items()
            if not any(op in body for op in ("vargmax", "br.", "loop"))}


@pytest.mark.parametrize("name", sorted(STRAIGHT))
def test_sequencer_stalls_are_its_idle_cycles(name):
    """Measured apart from the counters: in a straight-line program the sequencer
    spends its dispatch cycles and stalls for the rest, until its end fires."""
    cost = CostModel()
    program = asm.assemble(STRAIGHT[name] + "end\n")
    machine = Machine()
    result = machine.load_and_run(program, TABLE, args=COST_ARGS)
    dispatch = sum(cost.dispatch if isa.decode(w).spec.queue is isa.Queue.SEQ
                   else cost.dispatch_queue for w in program.words)
    idle = result.cycles - cost.end_cycle - dispatch
    assert machine.counters["stall_cycles"] == idle


def test_idle_program_counts_nothing():
    c = _run("nop\n").counters
    assert all(c[name] == 0 for name in CAUSE_COUNTERS)


def test_region_records_carry_busy_cycles_and_conflicts():
    """A region's record holds the engines' busy cycles and the conflicts inside it,
    and the run's counters add them up."""
    body = ("region.begin 1\n" + CAUSE_PROGRAMS["busy_array"] + "region.end 1\n"
            "region.begin 2\n" + CAUSE_PROGRAMS["sp_conflicts"] + "region.end 2\n"
            "region.begin 3\n" + CAUSE_PROGRAMS["stall_out_store"] + "region.end 3\n")
    m = _run(body)
    first, second, third = m.trace
    assert first.busy_array > 0 and first.busy_vector == 0 and first.sp_conflicts == 0
    assert second.busy_vector > 0 and second.sp_conflicts > 0 and second.busy_array == 0
    assert third.busy_store > 0 and third.busy_load == 0
    for f in ("busy_array", "busy_vector", "sp_conflicts", "busy_store"):
        assert sum(getattr(r, f) for r in m.trace) == m.counters[f]
    assert TRACE_FIELDS[-5:] == ("busy_load", "busy_store", "busy_array", "busy_vector",
                                 "sp_conflicts")


@pytest.mark.rtl
def test_rtl_counts_the_same(seed):
    """On the fast Verilator library: each program makes its counter count, and every
    counter by cause equals the golden model's (verif.scenarios.cause_counters)."""
    from verif.fastsim import run_scenario
    run_scenario("verif.scenarios:cause_counters", "default", seed=seed)
