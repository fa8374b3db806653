"""Units compiled on their own, linked; the unit cache; the pool of compile processes.

* a plan linked from units compiled on their own equals the plan lowered in place
  as relocatable units: program words, source text, constants, result registers
  (every precompile plan of the bundled models on two profiles, and of the MLPerf
  Tiny models);
* linked programs differ from the default compile (each unit sets up its own
  ``cfg`` and registers): they compute what the reference interpreter does, on the
  golden model, for every bundled and MLPerf Tiny model the NPU runs;
* a plan change compiles only the units the cache lacks (counted);
* evicting a plan that failed validation evicts the units it links;
* the pool fills a cache file with the same entries as the serial loop;
* a precompile killed (SIGKILL) or interrupted (SIGINT) leaves a usable cache;
* the driver writes only the changed runs of a program into the shadow bank.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pytest

from bench.precompile import contents, same_entries
from firmware import asm
from host.adaptive.cache import CompileCache, precompile, precompile_plans, speculative_plans
from host.adaptive.pool import compile_pool, stop
from host.cli import ExitCode, main, model_path
from host.compiler import CompileError, compile_model, initial_units, simplify
from host.compiler.compile import ProgramTooLong
from host.compiler.units import (
    TARGET_LIMIT,
    UnitMemo,
    assemble_unit,
    relocatable,
    stand_in,
    symbol_spacing,
)
from host.device import GoldenDevice
from host.driver import NPUDriver
from host.onnx_import import load_onnx
from host.profiles import PROFILES
from host.runtime import Session

BUNDLED = ["mlp", "cnn", "moe", "early_exit"]
ZOO = ["resnet8", "ds_cnn", "fc_autoencoder", "mobilenet_v1_025"]


def graph_of(name):
    return simplify(load_onnx(model_path(name), allow_cpu_fallback=True))[0]


def plans_of(graph, limit):
    return [(graph, p) for _, p in precompile_plans(graph, limit)] + \
        [(h, p) for _, h, p in speculative_plans(graph, limit)]


def assert_linked_equals_in_place(graph, plan, config, store):
    try:
        whole = compile_model(graph, config, plan, simplified=True, relocatable=True)
    except CompileError as err:
        with pytest.raises(CompileError) as linked_err:
            compile_model(graph, config, plan, simplified=True, unit_store=store)
        assert str(linked_err.value) == str(err)
        return False
    linked = compile_model(graph, config, plan, simplified=True, unit_store=store)
    assert linked.program.words == whole.program.words
    assert linked.source == whole.source and linked.program.lines == whole.program.lines
    assert linked.program.symbols == whole.program.symbols
    assert asm.assemble(linked.source).words == linked.program.words
    assert linked.const_image() == whole.const_image()
    assert linked.partitions == whole.partitions and linked.result_regs == whole.result_regs
    assert linked.spans == whole.spans
    assert [(u.id, u.instructions, u.resources) for u in linked.units] == \
        [(u.id, u.instructions, u.resources) for u in whole.units]
    return True


@pytest.mark.parametrize("profile", ["default", "small"])
@pytest.mark.parametrize("name", BUNDLED)
def test_linking_equals_the_whole_compile(name, profile):
    graph, config, store = graph_of(name), PROFILES[profile], UnitMemo()
    jobs = plans_of(graph, 64)
    linked = sum(assert_linked_equals_in_place(g, p, config, store) for g, p in jobs)
    assert linked >= 1
    # A unit in several plans is lowered once.
    total = sum(len(p) for _, p in jobs)
    distinct = len({frozenset(getattr(u, "nodes", u)) for _, p in jobs for u in p})
    assert store.compiled <= total and (distinct == total or store.compiled < total)


@pytest.mark.parametrize("name", ZOO)
def test_linking_equals_the_whole_compile_on_the_zoo(name, regress):
    graph, store = graph_of(name), UnitMemo()
    jobs = plans_of(graph, 16 if regress else 3)
    for g, p in jobs:
        assert_linked_equals_in_place(g, p, PROFILES["default"], store)


@pytest.mark.parametrize("name", BUNDLED + ZOO)
def test_linked_programs_equal_the_reference(name):
    graph = graph_of(name)
    config = PROFILES["default"]
    try:
        compile_model(graph, config, simplified=True)
    except CompileError as err:  # the state of the compiler (README, bench.models)
        pytest.skip(f"does not compile for the default config: {err}")
    try:
        linked = compile_model(graph, config, simplified=True, unit_store=UnitMemo())
    except ProgramTooLong:
        # ResNet-8 fills the bank lowered in place; linked it does not fit, and the
        # cache serves the program lowered in place.
        served, _ = CompileCache(None).get_or_compile(graph, None, config)
        assert served.program.words == compile_model(graph, config,
                                                      simplified=True).program.words
        return
    session = Session(NPUDriver(GoldenDevice(config)), linked, check=True)
    session.load()
    rng = np.random.default_rng(0)
    for _ in range(2 if name in BUNDLED else 1):  # the zoo's runs are long
        inputs = {}
        for t in graph.inputs:
            tensor = graph.tensors[t]
            dtype = np.dtype(tensor.io_dtype or tensor.dtype)
            if dtype.kind == "f":
                inputs[t] = rng.uniform(-1, 1, tensor.shape).astype(dtype)
            else:
                info = np.iinfo(dtype)
                inputs[t] = rng.integers(info.min, info.max + 1, tensor.shape, dtype=dtype)
        assert session.run(inputs).checked  # raises MismatchError on any difference


def test_spans_locate_each_unit():
    model = compile_model(graph_of("cnn"), PROFILES["default"])
    ends = 0
    for u in model.units:
        a, b = model.spans[u.id]
        assert a >= ends and b > a
        first, last = (asm.format_instr(asm.isa.decode(model.program.words[i])).split()
                       for i in (a, b - 1))
        assert first == ["region.begin", str(u.id)] and last[:2] == ["region.end", str(u.id)]
        ends = b


def test_a_changed_plan_compiles_only_its_new_units():
    graph = graph_of("cnn")
    cache = CompileCache(None)
    units = initial_units(graph)
    cache.get_or_compile(graph, units, PROFILES["default"])
    assert cache.unit_compiles == len(units) and cache.unit_hits == 0
    merged = units[:1] + [units[1] + units[2]] + units[3:]
    cache.get_or_compile(graph, merged, PROFILES["default"])
    # one new unit (the merge); every other unit of the plan came from the cache
    assert cache.unit_compiles == len(units) + 1
    assert cache.unit_hits == len(merged) - 1
    # the same merged unit in another plan (it has another region id there): only
    # the other new merge is lowered
    both = units[:1] + [units[1] + units[2]] + units[3:-2] + [units[-2] + units[-1]]
    before = cache.unit_compiles
    cache.get_or_compile(graph, both, PROFILES["default"])
    assert cache.unit_compiles == before + 1
    # another profile is another unit
    cache.get_or_compile(graph, units, PROFILES["small"])
    assert cache.unit_compiles == before + 1 + len(units)


def test_evicting_a_plan_evicts_its_units():
    graph = graph_of("mlp")
    cache = CompileCache(None)
    units = initial_units(graph)
    merged = [units[0] + units[1]]
    cache.get_or_compile(graph, units, PROFILES["default"])
    cache.get_or_compile(graph, merged, PROFILES["default"])
    assert cache.stats()["units"] == 3
    assert cache.evict(graph, merged, PROFILES["default"])
    assert cache.stats()["units"] == 2  # the merged unit went; fc1 and fc2 stay
    cache.get_or_compile(graph, merged, PROFILES["default"])
    assert cache.stats()["units"] == 3


def test_the_pool_fills_the_cache_as_the_serial_loop_does(tmp_path):
    graph = graph_of("moe")
    results, units = {}, {}
    for workers in (1, 2):
        path = tmp_path / f"{workers}.sqlite"
        with CompileCache(path) as cache:
            res = precompile(cache, graph, PROFILES["default"], workers=workers)
        results[workers] = (res.plans, res.compiled, res.cached, res.refused)
        units[workers] = res.units
        assert res.compiled == res.plans == 48
    assert contents(tmp_path / "1.sqlite") == contents(tmp_path / "2.sqlite")
    assert results[1] == results[2]
    # two processes may both lower a unit neither found in the cache
    assert units[1] == 26 <= units[2]
    with CompileCache(tmp_path / "2.sqlite") as cache:  # all there: nothing to do
        res = precompile(cache, graph, PROFILES["default"], workers=2)
        assert (res.cached, res.compiled, res.units) == (48, 0, 0)


def npu(*args, env):
    return subprocess.run([sys.executable, "-m", "host.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


PRECOMPILE = ["precompile", "--profile", "default", "--model", "moe", "cnn",
              "early_exit", "--jobs", "2"]


@pytest.mark.parametrize("how", ["kill", "interrupt"])
def test_a_stopped_parallel_precompile_leaves_a_usable_cache(how, tmp_path, seed):
    env = {**os.environ, "NPU_CACHE_DIR": str(tmp_path)}
    path = tmp_path / "compile.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "host.cli", *PRECOMPILE,
                             "--cache", str(path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the imports are done once the cache file is open
    delay = random.Random(seed).uniform(0.2, 2.0)  # while compiling
    time.sleep(delay)
    if how == "kill":
        os.killpg(proc.pid, signal.SIGKILL)  # the parent and its compile processes
    else:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    out, err = proc.communicate(timeout=120)
    print(f"\nstopped {delay:.2f} s after the cache opened: exit status {proc.returncode}")
    if how == "interrupt" and proc.returncode == -signal.SIGINT:
        # The signal met the interpreter on its way out (a window of ~80 ms after
        # the summary): the work was done and nothing was said on stderr.
        assert "compiles," in out and not err, (out, err)
    elif how == "interrupt" and proc.returncode != 0:
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "precompile interrupted" in err, err
    verify = npu("cache", "verify", "--model", "moe", "cnn", "early_exit", "--cache",
                 str(path), env=env)
    assert verify.returncode == 0 and "evicted 0" in verify.stdout, verify
    again = npu(*PRECOMPILE, "--cache", str(path), env=env)
    assert again.returncode == 0, again.stderr
    fresh = tmp_path / "fresh.sqlite"
    assert npu(*PRECOMPILE, "--cache", str(fresh), env=env).returncode == 0
    assert same_entries(contents(fresh), contents(path))


def test_stopping_the_pool_survives_a_half_sent_result():
    """A compile process ended while sending its result leaves half a message in the
    result pipe; stopping the pool must not wait forever for the rest (what a
    Ctrl-C of a parallel precompile under load once met)."""
    pool = compile_pool(2)
    pool.submit(time.sleep, 60)  # starts the processes; the manager waits on the pipe
    time.sleep(0.5)
    # the length prefix of a 1000-byte message, and 3 of its bytes
    os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1000) + b"abc")
    stopper = threading.Thread(target=stop, args=(pool,), daemon=True)
    stopper.start()
    stopper.join(60)
    assert not stopper.is_alive(), "stopping the pool hangs on a half-sent result"


def test_a_swap_writes_only_the_changed_runs():
    config = PROFILES["default"]
    graph = graph_of("cnn")
    units = initial_units(graph)
    a = compile_model(graph, config, units, simplified=True)
    merged = units[:-2] + [units[-2] + units[-1]]  # only the end of the program changes
    b = compile_model(graph, config, merged, simplified=True)
    drv = NPUDriver(GoldenDevice(config))
    for model in (a, b):  # a whole program into each bank
        drv.write_program(model.program, changed_only=True)
        drv.swap()
    written = drv.imem_words_written
    drv.write_program(a.program, changed_only=True)  # the bank holds a: nothing changes
    assert drv.imem_words_written == written
    drv.swap()
    drv.write_program(a.program, changed_only=True)  # the bank holds b
    moved = drv.imem_words_written - written
    first = next(i for i, (x, y) in enumerate(zip(a.program.words, b.program.words,
                                                   strict=False)) if x != y)
    assert first >= a.spans[1][1]  # the first unit is the same words at the same place
    assert 0 < moved <= len(a.program) + 1 - first
    drv.forget_programs()
    before = drv.imem_words_written
    drv.write_program(b.program, changed_only=True)
    assert drv.imem_words_written - before == len(b.program) + 1


def test_verify_evicts_a_poisoned_unit(tmp_path, capsys):
    """A unit entry with a wrong word but a valid digest: the plans linked from it
    differ from a fresh compile, so ``npu cache verify`` evicts it."""
    import hashlib
    import pickle
    import sqlite3

    from host.cli import main as npu_main

    path = tmp_path / "c.sqlite"
    assert npu_main(["precompile", "--profile", "default", "--model", "mlp", "--jobs", "1",
                     "--cache", str(path)]) == 0
    with sqlite3.connect(path) as db:
        rowid, blob = db.execute("SELECT rowid, blob FROM units WHERE kind='unit' "
                                 "ORDER BY rowid LIMIT 1").fetchone()
        code = pickle.loads(blob)
        code.words[-2] ^= 1 << 40  # a field of the second-to-last instruction
        blob = pickle.dumps(code)
        db.execute("UPDATE units SET blob=?, digest=? WHERE rowid=?",
                   (blob, hashlib.sha256(blob).hexdigest()[:32], rowid))
    db.close()
    capsys.readouterr()
    assert npu_main(["cache", "verify", "--model", "mlp", "--cache", str(path)]) == 0
    out = capsys.readouterr().out
    assert "evicted 0;" in out and "0 evicted" not in out, out  # the plans were right
    assert npu_main(["cache", "verify", "--model", "mlp", "--cache", str(path)]) == 0
    assert "0 evicted" in capsys.readouterr().out


@pytest.mark.parametrize("largest", [1, 9 << 20, 100 << 20])
def test_stand_ins_relocate_addresses_anywhere_in_a_large_tensor(largest):
    """Every byte of a tensor of ``largest`` bytes (and just before it) maps back
    to its own symbol, however far from its stand-in."""
    spacing = symbol_spacing(largest)
    lines = [f"addi r13, r2, {stand_in(n, spacing) + d}"
             for n in range(2) for d in (-64, 0, largest - 1)]
    out, _ = relocatable(lines, 1, 2, 0, spacing=spacing)
    assert out == [f"addi r13, r2, @a{n}{d:+d}" for n in range(2) for d in (-64, 0, largest - 1)]


def test_too_many_stand_ins_of_a_huge_tensor_are_refused():
    spacing = symbol_spacing(100 << 20)
    stand_in(1, spacing)
    with pytest.raises(CompileError, match="more than 2 DRAM tensors or weight blobs"):
        stand_in(2, spacing)


def test_a_unit_beyond_what_its_targets_address_is_refused():
    lines = ["    end"] * (TARGET_LIMIT + 1)
    with pytest.raises(CompileError, match=f"a unit of {TARGET_LIMIT + 1} instructions"):
        assemble_unit(lines, lines, [], {}, {})


@pytest.mark.slow
def test_a_unit_with_a_tensor_beyond_8_mib_compiles_alone(tmp_path, capsys):
    """The bundled MLP declared with 330,000 rows (a 21 MB input) lowers unit by
    unit and is refused for its length, not for its relocation (~33 s CPU)."""
    m = onnx.load(model_path("mlp"))
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 330_000
    onnx.save(m, tmp_path / "mlp.onnx")
    code = main(["compile", str(tmp_path / "mlp.onnx")])
    line, = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.UNSUPPORTED, line
    assert "instructions; an instruction bank holds" in line
