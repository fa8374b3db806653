"""Fuzzing: ``npu`` and the assembler under random and mutated input.

Property, for every case: a clean error (a documented exit code with one line on
stderr, or the assembler's ``AsmError``) or a result equal to the reference
interpreter (``npu run`` checks every inference and fails otherwise), within the
per-case deadline (a hang fails the case; the figure is generous, it catches
hangs, not slowness). Inputs:

* ONNX models: the bundled ones mutated (shapes, initializers, attributes,
  operators, graph wiring, bytes) and small random graphs, run by ``npu run``;
* ``--inputs`` files: random arrays, dtypes, names, shapes, NaN and labels;
* ``npu`` argument lists drawn from its commands, options and hostile values;
* assembly text: the bundled programs mutated and random lines.

A Python warning on stderr (what the user would see) fails a case as a traceback
does.

Seeded from the session seed (``--seed N`` reproduces a run); ``make regress``
(``--regress``) tries ten times as many cases. Each test reports how many cases it
tried (the ``fuzz`` lines of the pytest summary).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from firmware import asm
from host import cli
from host.cli import ExitCode

CLEAN = {ExitCode.OK, ExitCode.USAGE, ExitCode.BAD_MODEL, ExitCode.UNSUPPORTED,
         ExitCode.DEVICE, ExitCode.LIMIT}
DEADLINE = timedelta(seconds=60)  # per case: a hang, not a slow case
MODELS = ["mlp", "cnn", "moe", "early_exit"]


def fuzz(test_seed: int, regress: bool, examples: int):
    """Hypothesis settings for a fuzz property: seeded, bounded, no example database."""
    def wrap(fn):
        fn = settings(max_examples=examples * (10 if regress else 1), deadline=DEADLINE,
                      database=None, derandomize=False,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                             HealthCheck.filter_too_much])(fn)
        return hypothesis_seed(test_seed)(fn)
    return wrap


class Tally:
    """How many cases a fuzz test tried, by outcome; reported in the pytest summary."""

    def __init__(self, name: str, record):
        self.name, self.record, self.counts = name, record, {}

    def add(self, outcome) -> None:
        key = outcome.name.lower() if isinstance(outcome, ExitCode) else str(outcome)
        self.counts[key] = self.counts.get(key, 0) + 1

    def report(self) -> None:
        total = sum(self.counts.values())
        detail = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        self.record("fuzz", f"{self.name}: {total} cases ({detail})")
        print(f"\nfuzz {self.name}: {total} cases ({detail})")


def npu(argv: list[str]) -> tuple[int, str, str]:
    """Run ``npu`` in-process: exit code, stdout, stderr (argparse's exits included)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else ExitCode.INTERNAL
    for w in caught:  # what Python would print on the user's terminal
        if not issubclass(w.category, SILENT_WARNINGS):
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    return code, out.getvalue(), err.getvalue()


# Warning classes Python does not show outside __main__ by default (ResourceWarning
# is pytest's own business).
SILENT_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                   ResourceWarning)


def assert_clean(argv, code, out, err):
    assert code in CLEAN, f"npu {argv}: exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err and "Traceback" not in out, f"npu {argv}:\n{err}"
    assert "Warning: " not in err, f"npu {argv}: a Python warning on stderr:\n{err}"
    if code != ExitCode.OK and "usage:" not in err:
        assert len(err.strip().splitlines()) == 1, f"npu {argv}: not one line:\n{err}"


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A cache directory and working directory of the test's own."""
    monkeypatch.setenv("NPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@contextlib.contextmanager
def hermetic(sandbox: Path):
    """A fresh working directory and cache directory for one case, removed after it:
    no case sees what another wrote (``npu compile -o mlp`` leaves a file ``mlp``
    that ``npu run mlp`` would read, ``--cache small`` a database)."""
    case = Path(tempfile.mkdtemp(dir=sandbox, prefix="case"))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(case)
            mp.setenv("NPU_CACHE_DIR", str(case / "cache"))
            yield case
    finally:
        shutil.rmtree(case, ignore_errors=True)


def warm_up(sandbox: Path) -> None:
    """Pay the one-time costs before the timed cases: the first case would otherwise
    import onnxruntime, the compiler and the runtime and load the digits inside its
    deadline, and on a loaded machine fail it only once (a ``FlakyFailure``)."""
    import onnx.reference  # noqa: F401 - the CPU fallback's evaluators
    import onnxruntime  # noqa: F401

    with hermetic(sandbox):
        code, out, err = npu(["run", "mlp", "--digits", "2", "--no-cache"])
    assert code == ExitCode.OK, err


def test_a_case_never_sees_what_another_left(sandbox):
    with hermetic(sandbox):
        code, out, err = npu(["compile", "mlp", "-o", "mlp"])  # a file named like the model
        assert code == ExitCode.OK and Path("mlp").is_file(), err
    with hermetic(sandbox):
        code, out, err = npu(["run", "mlp", "--digits", "2", "--no-cache"])
        assert code == ExitCode.OK, err  # the bundled model, not the program file
    assert [p.name for p in sandbox.iterdir() if p.name.startswith("case")] == []


# ---- ONNX models: mutated and random ------------------------------------------------------

ODD_DIMS = [0, 1, 2, 3, 7, 8, 64, 65, 1000, 4097, 10**6, 10**12]
ODD_FLOATS = [0.0, -1.0, 1e-30, 1e30, float("nan"), float("inf")]
OP_TYPES = ["Relu", "Gemm", "MatMul", "Add", "Conv", "MaxPool", "Flatten", "Reshape",
            "QuantizeLinear", "DequantizeLinear", "Sigmoid", "Clip", "ArgMax", "Erf",
            "QLinearMatMul", "Identity", "Softmax", "NotAnOp"]


@st.composite
def mutated_model(draw) -> bytes:
    """A bundled model with one to three mutations."""
    model = onnx.load(str(cli.MODELS / f"{draw(st.sampled_from(MODELS))}.onnx"))
    g = model.graph
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["batch", "batch", "dim", "init_value", "init_dims",
                                     "attr", "op", "drop_node", "drop_init", "rewire",
                                     "elem_type", "bytes"]))
        if kind == "batch":  # consistent: the model stays valid, its work grows
            rows = draw(st.sampled_from([2, 3, 7, 300, 1025, 4097, 10**6]))
            for v in (*g.input, *g.output):
                v.type.tensor_type.shape.dim[0].dim_value = rows
        elif kind == "dim":
            v = draw(st.sampled_from([*g.input, *g.output]))
            dims = v.type.tensor_type.shape.dim
            if dims:
                dims[draw(st.integers(0, len(dims) - 1))].dim_value = draw(
                    st.sampled_from(ODD_DIMS))
        elif kind == "init_value" and g.initializer:
            i = draw(st.integers(0, len(g.initializer) - 1))
            arr = numpy_helper.to_array(g.initializer[i]).copy()
            if arr.size:
                flat = arr.reshape(-1)
                j = draw(st.integers(0, flat.size - 1))
                if arr.dtype.kind == "f":
                    flat[j] = draw(st.sampled_from(ODD_FLOATS))
                else:
                    info = np.iinfo(arr.dtype)
                    flat[j] = draw(st.sampled_from([info.min, info.max, 0]))
                g.initializer[i].CopyFrom(numpy_helper.from_array(arr, g.initializer[i].name))
        elif kind == "init_dims" and g.initializer:
            init = g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
            arr = numpy_helper.to_array(init)
            if arr.size > 1:
                init.CopyFrom(numpy_helper.from_array(arr.reshape(-1)[:-1].copy(), init.name))
        elif kind == "attr":
            attrs = [a for n in g.node for a in n.attribute
                     if a.type in (onnx.AttributeProto.INT, onnx.AttributeProto.INTS,
                                   onnx.AttributeProto.FLOAT)]
            if attrs:
                a = draw(st.sampled_from(attrs))
                if a.type == onnx.AttributeProto.INT:
                    a.i = draw(st.sampled_from([-1, 0, 1, 2, 3, 100]))
                elif a.type == onnx.AttributeProto.FLOAT:
                    a.f = draw(st.sampled_from(ODD_FLOATS))
                elif a.ints:
                    a.ints[draw(st.integers(0, len(a.ints) - 1))] = draw(
                        st.sampled_from([-1, 0, 1, 2, 5, 100]))
        elif kind == "op" and g.node:
            g.node[draw(st.integers(0, len(g.node) - 1))].op_type = draw(
                st.sampled_from(OP_TYPES))
        elif kind == "drop_node" and len(g.node) > 1:
            del g.node[draw(st.integers(0, len(g.node) - 1))]
        elif kind == "drop_init" and g.initializer:
            del g.initializer[draw(st.integers(0, len(g.initializer) - 1))]
        elif kind == "rewire" and len(g.node) > 1:
            a, b = (g.node[draw(st.integers(0, len(g.node) - 1))] for _ in range(2))
            if a.input and b.output:
                a.input[draw(st.integers(0, len(a.input) - 1))] = b.output[0]
        elif kind == "elem_type":
            g.input[0].type.tensor_type.elem_type = draw(st.sampled_from(
                [TensorProto.UINT8, TensorProto.INT8, TensorProto.DOUBLE, TensorProto.STRING]))
        elif kind == "bytes":
            data = bytearray(model.SerializeToString())
            for _ in range(draw(st.integers(1, 8))):
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            cut = draw(st.sampled_from([len(data), len(data) // 2, 40]))
            return bytes(data[:cut])
    return model.SerializeToString()


@st.composite
def random_model(draw) -> bytes:
    """A small chain of float or quantize/dequantize operators on one input."""
    width = first = draw(st.sampled_from([64, 64, 8]))  # 64: the digits feed it
    nodes, inits, cur = [], [], "x"
    rng = np.random.default_rng(draw(st.integers(0, 1 << 16)))
    for i in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["Relu", "Gemm", "MatMul", "Add", "QDQ", "Sigmoid", "Clip"]))
        out = f"t{i}"
        if op in ("Gemm", "MatMul"):
            n_out = draw(st.sampled_from([1, 3, 8]))
            w = f"w{i}"
            inits.append(numpy_helper.from_array(rng.normal(size=(width, n_out))
                                                 .astype(np.float32), w))
            nodes.append(helper.make_node(op, [cur, w], [out], name=f"n{i}"))
            width = n_out
        elif op == "Add":
            b = f"b{i}"
            inits.append(numpy_helper.from_array(rng.normal(size=(width,)).astype(np.float32), b))
            nodes.append(helper.make_node("Add", [cur, b], [out], name=f"n{i}"))
        elif op == "QDQ":
            s, z, q = f"s{i}", f"z{i}", f"q{i}"
            inits.append(numpy_helper.from_array(np.float32(draw(st.sampled_from(
                [0.05, 0.1, 1.0]))), s))
            inits.append(numpy_helper.from_array(np.int8(draw(st.integers(-128, 127))), z))
            nodes.append(helper.make_node("QuantizeLinear", [cur, s, z], [q], name=f"q{i}"))
            nodes.append(helper.make_node("DequantizeLinear", [q, s, z], [out], name=f"n{i}"))
        else:
            nodes.append(helper.make_node(op, [cur], [out], name=f"n{i}"))
        cur = out
    graph = helper.make_graph(
        nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, first])],
        [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


CPU_OPS = {  # float operators only the CPU fallback runs, with their integer attributes
    "Conv": ("strides", "dilations", "kernel_shape", "group", "pads"),
    "ConvTranspose": ("strides", "dilations", "kernel_shape", "group", "output_padding"),
    "MaxPool": ("strides", "dilations", "kernel_shape", "pads"),
    "AveragePool": ("strides", "kernel_shape", "pads"),
    "LpPool": ("strides", "kernel_shape", "p"),
    "SpaceToDepth": ("blocksize",),
    "DepthToSpace": ("blocksize",),
}
ODD_INTS = [-1, 0, 0, 1, 1, 2, 3, 9]


@st.composite
def cpu_op_model(draw) -> bytes:
    """One float operator on an 8x8 image with hostile integer attributes: what the
    CPU fallback hands to onnx's shape inference and onnxruntime (a zero stride
    there was a floating-point exception that killed the process)."""
    op = draw(st.sampled_from(sorted(CPU_OPS)))
    attrs = {}
    for name in draw(st.lists(st.sampled_from(CPU_OPS[op]), unique=True, max_size=3)):
        size = {"pads": 4, "group": 0, "blocksize": 0, "p": 0}.get(name, 2)
        value = [draw(st.sampled_from(ODD_INTS)) for _ in range(size)]
        attrs[name] = value if size else value[0] if value else draw(st.sampled_from(ODD_INTS))
    if op.endswith("Pool") and "kernel_shape" not in attrs:
        attrs["kernel_shape"] = [2, 2]
    inputs, inits = ["x"], []
    if op.startswith("Conv"):
        w = np.ones((1, 1, 3, 3), np.float32)
        inits.append(numpy_helper.from_array(w, "w"))
        inputs.append("w")
    node = helper.make_node(op, inputs, ["y"], name="n0", **attrs)
    graph = helper.make_graph(
        [node], "cpu_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()


def matching_inputs(model: Path, npz: Path, fallback: bool, seed: int) -> list[str] | None:
    """``--inputs`` with two random samples of every graph input, when the model
    imports and its inputs are small; else None."""
    from host.onnx_import import load_onnx

    try:
        graph = load_onnx(model, allow_cpu_fallback=fallback)
    except Exception:  # noqa: BLE001 - npu reports it; this only picks the inputs
        return None
    shapes = {k: graph.tensors[k].shape for k in graph.inputs}
    if not shapes or any(np.prod(s) > 1 << 16 for s in shapes.values()):
        return None
    rng = np.random.default_rng(seed)
    np.savez(npz, **{k: rng.normal(scale=4, size=(2, *s)).astype(np.float32)
                     for k, s in shapes.items()})
    return ["--inputs", str(npz)]


def test_fuzz_onnx_models(sandbox, seed, regress, record_property):
    tally = Tally("onnx models", record_property)
    warm_up(sandbox)

    @fuzz(seed, regress, examples=40)
    @given(data=st.one_of(mutated_model(), random_model(), cpu_op_model()),
           fallback=st.booleans(),
           feed=st.booleans(), input_seed=st.integers(0, 1 << 16))
    def prop(data, fallback, feed, input_seed):
        with hermetic(sandbox) as case:
            path = case / "fuzz.onnx"
            path.write_bytes(data)
            flags = ["--cpu-fallback"] if fallback else []
            inputs = ["--digits", "2"]
            if feed:  # inputs of the model's own shapes: past the digits' 64 values
                inputs = matching_inputs(path, case / "in.npz", fallback, input_seed) or inputs
            argv = ["run", str(path), *inputs, "--no-cache", *flags]
            code, out, err = npu(argv)
        assert_clean(argv, code, out, err)
        if code == ExitCode.OK:
            assert "2/2 results equal the reference" in out, out
        tally.add(ExitCode(code))

    prop()
    tally.report()


# ---- --inputs files -------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.int8, np.uint8, np.int64, np.bool_, np.complex64,
          np.float16]


@st.composite
def npz_arrays(draw) -> dict:
    count = draw(st.integers(0, 4))
    arrays = {}
    for name in draw(st.lists(st.sampled_from(["input", "labels", "x", "input "]), min_size=0,
                              max_size=3, unique=True)):
        dtype = draw(st.sampled_from(DTYPES))
        n = count if draw(st.booleans()) else draw(st.integers(0, 5))
        shape = draw(st.sampled_from([(n, 64), (n, 1, 64), (n, 63), (n,), (), (n, 8, 8)]))
        if name == "labels":
            shape = draw(st.sampled_from([(n,), (max(0, n - 1),), ()]))
        values = draw(st.sampled_from(["normal", "huge", "nan", "zero"]))
        rng = np.random.default_rng(draw(st.integers(0, 1 << 16)))
        a = rng.normal(scale=8, size=shape)
        if values == "huge":
            a = a * 1e30
        elif values == "nan":
            a.reshape(-1)[:1] = np.nan
        elif values == "zero":
            a = np.zeros(shape)
        with np.errstate(invalid="ignore", over="ignore"):
            arrays[name] = a.astype(dtype)
    return arrays


@st.composite
def plausible_npz(draw) -> dict:
    """What a user means to pass: samples of the right size, in some dtype and shape."""
    n = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 1 << 16)))
    shape = draw(st.sampled_from([(n, 64), (n, 1, 64), (n, 8, 8), (n, 1, 1, 8, 8)]))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int8, np.uint8, np.int64]))
    scale = draw(st.sampled_from([1.0, 16.0, 1e6]))
    with np.errstate(invalid="ignore", over="ignore"):
        arrays = {"input": (rng.normal(size=shape) * scale).astype(dtype)}
    if draw(st.booleans()):
        arrays["labels"] = rng.integers(0, 10, n)
    return arrays


def test_fuzz_input_files(sandbox, seed, regress, record_property):
    tally = Tally("npz inputs", record_property)
    warm_up(sandbox)

    @fuzz(seed, regress, examples=40)
    @given(arrays=st.one_of(plausible_npz(), npz_arrays()),
           raw=st.one_of(st.none(), st.none(), st.binary(max_size=64)),
           model=st.sampled_from(["mlp", "cnn"]))
    def prop(arrays, raw, model):
        with hermetic(sandbox) as case:
            path = case / "in.npz"
            if raw is not None:
                path.write_bytes(raw)
            else:
                np.savez(path, **arrays)
            argv = ["run", model, "--inputs", str(path), "--no-cache"]
            code, out, err = npu(argv)
        assert_clean(argv, code, out, err)
        assert code in (ExitCode.OK, ExitCode.USAGE), (argv, err)
        if code == ExitCode.OK:
            assert "results equal the reference" in out, out
        tally.add(ExitCode(code))

    prop()
    tally.report()


# ---- argument lists -------------------------------------------------------------------------

VALUES = ["0", "1", "2", "-1", "abc", "", "1e9", "nan", "inf", "0.5", "012|789", "|", "99999",
          "4294967296", "mlp", "nope.onnx", ".", "/", "small", "default"]
OPTIONS = {
    "run": ["--digits", "--inputs", "--no-check", "--cpu-fallback", "--adaptive", "--phases",
            "--seed", "--batch", "--cache", "--no-cache", "--inline-compile", "--fresh",
            "--config", "--backend", "--port", "--baud", "--cycle-budget", "--timeout",
            "--debug"],
    "report": ["--config"],
    "info": ["--config", "--backend", "--port"],
    "compile": ["-o", "--config", "--cpu-fallback"],
    "disasm": ["--config", "--cpu-fallback"],
    "cache": ["--cache", "--model"],
}
FLAGS = {"--no-check", "--cpu-fallback", "--adaptive", "--no-cache", "--inline-compile",
         "--fresh", "--debug"}
SMALL_NUMBERS = {"--digits": ["1", "2", "3"], "--batch": ["1", "2", "0", "-3"],
                 "--seed": ["0", "7"]}


@st.composite
def argv(draw) -> list[str]:
    command = draw(st.sampled_from([*OPTIONS, "", "bogus"]))
    args = [command] if command else []
    if command in ("run", "report", "compile", "disasm"):
        args.append(draw(st.sampled_from([*MODELS, "nope", ".", "", "model.onnx"])))
    if command == "cache":
        args.append(draw(st.sampled_from(["info", "verify", "clear", "bogus"])))
    for _ in range(draw(st.integers(0, 4))):
        opt = draw(st.sampled_from(OPTIONS.get(command, ["--help", "--debug", "-x"])))
        args.append(opt)
        if opt not in FLAGS:
            pool = SMALL_NUMBERS.get(opt, VALUES)
            if opt == "--backend":
                pool = ["golden", "serial", "bogus"]  # verilator builds the RTL: not here
            if opt == "--model":
                pool = ["mlp", "nope"]
            args.append(draw(st.sampled_from(pool)))
    if "--digits" not in args and "--inputs" not in args and command == "run":
        args += ["--digits", "2"]
    return args


def test_fuzz_arguments(sandbox, seed, regress, record_property):
    tally = Tally("npu arguments", record_property)
    warm_up(sandbox)

    @fuzz(seed, regress, examples=40)
    @given(args=argv())
    def prop(args):
        with hermetic(sandbox) as case:
            (case / "model.onnx").write_bytes(b"\x08\x07garbage")
            code, out, err = npu(args)
        if "--debug" not in args:  # --debug shows tracebacks on purpose
            assert_clean(args, code, out, err)
        else:
            assert code in CLEAN, (args, err[-3000:])
        tally.add(ExitCode(code))

    prop()
    tally.report()


# ---- assembly text --------------------------------------------------------------------------

PROGRAMS = sorted((Path(__file__).resolve().parents[1] / "firmware" / "programs").glob("*.s"))
ASM_WORDS = ["li", "addi", "add", "br.always", "br.eq", "loop", "end", "load", "store",
             "gemm.overwrite", "wload", "vreq", "region.begin", ".equ", ".reg", ".word", "jmp",
             "mov", "r0", "r1", "r15", "r99", "p0", "p9", "pop=next", "push=prev", "x:", ","]
EXPRESSIONS = ["1", "-1", "0x7fffffff", "1<<40", "1<<(1<<40)", "5//0", "5%0", "2**3",
               "(" * 300 + "1" + ")" * 300, "-" * 3000 + "1", "a", "1+", "1 if 1 else 0",
               "9" * 5000, "~0", "(1<<4000)*(1<<4000)"]


@st.composite
def assembly(draw) -> str:
    if draw(st.booleans()):
        lines = draw(st.sampled_from(PROGRAMS)).read_text().splitlines()
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, max(0, len(lines) - 1)))
            kind = draw(st.sampled_from(["replace_number", "insert", "delete", "tab", "junk"]))
            line = lines[i] if lines else ""
            if kind == "replace_number":
                words = line.split(",")
                words[-1] = " " + draw(st.sampled_from(EXPRESSIONS))
                lines[i:i + 1] = [",".join(words)]
            elif kind == "insert":
                lines.insert(i, " ".join(draw(st.lists(st.sampled_from(ASM_WORDS + EXPRESSIONS),
                                                       max_size=6))))
            elif kind == "delete" and lines:
                del lines[i]
            elif kind == "tab":
                lines[i:i + 1] = [line.replace(" ", "\t", 1)]
            else:
                lines.insert(i, draw(st.text(max_size=40)))
        return "\n".join(lines)
    return "\n".join(" ".join(draw(st.lists(st.sampled_from(ASM_WORDS + EXPRESSIONS),
                                            max_size=6)))
                     for _ in range(draw(st.integers(0, 6))))


def test_fuzz_assembly_text(seed, regress, record_property):
    tally = Tally("assembly text", record_property)

    @fuzz(seed, regress, examples=300)
    @given(source=assembly())
    def prop(source):
        try:
            program = asm.assemble(source)
        except asm.AsmError as err:
            assert str(err), source
            tally.add("asm error")
            return
        assert all(0 <= w < 1 << 64 for w in program.words)
        tally.add("assembled")

    prop()
    tally.report()


@pytest.mark.parametrize("expr", ["5//0", "5%0", "1<<(1<<40)", "(1<<4000)*(1<<4000)",
                                  "-" * 3000 + "1", "1<<-1"])
def test_hostile_expressions_are_assembler_errors(expr):
    """Found by the assembly fuzzing: these raised ZeroDivisionError, MemoryError,
    RecursionError or ValueError instead of an ``AsmError`` naming the line."""
    for source in (f"li r1, {expr}\nend", f".equ X, {expr}\nli r1, X\nend"):
        with pytest.raises(asm.AsmError, match="line 1"):
            asm.assemble(source)


def test_a_tab_separates_the_mnemonic():
    assert asm.assemble("li\tr1, 5\n\tend").words == asm.assemble("li r1, 5\nend").words


def bundled_with(sandbox: Path, model: str, name: str, value) -> Path:
    """A bundled model with its initializer ``name`` replaced by ``value``, saved in
    the sandbox."""
    proto = onnx.load(str(cli.MODELS / f"{model}.onnx"))
    init = next(i for i in proto.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(value, init.name))
    path = sandbox / f"{model}_{name}.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


@pytest.mark.parametrize("k", [2**32, 2**32 + 1, 1 - 2**32, -2**63])
def test_a_branch_constant_beyond_32_bits_equals_no_index(sandbox, k):
    """Found by the model fuzzing: ``Equal(ArgMax(x), k)`` with a ``k`` whose low 32
    bits are an index took the branch on the NPU (its registers are 32 bits wide),
    where the reference compares all 64."""
    path = bundled_with(sandbox, "early_exit", "is_exit_k", np.int64(k))
    argv = ["run", str(path), "--digits", "8", "--no-cache"]
    code, out, err = npu(argv)
    assert code == ExitCode.OK and "8/8 results equal the reference" in out, err


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan")])
def test_a_weight_scale_that_is_not_positive_is_named(sandbox, scale):
    """Found by the model fuzzing: a zero or NaN weight scale divided by zero in the
    bias (a RuntimeWarning on stderr) and was refused as a bias or requantization
    problem; it is the weight scale's, and the line says so."""
    path = bundled_with(sandbox, "mlp", "fc1_W_scale", np.float32(scale))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, out, err = npu(["run", str(path), "--digits", "2", "--no-cache"])
    assert code == ExitCode.BAD_MODEL and f"weight scale {scale} must be positive" in err, err


def run_one_float_node(sandbox: Path, node, inits=()) -> tuple[int, str, str]:
    """``npu run --cpu-fallback`` of a model of ``node`` alone on an 8x8 float image."""
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])],
        list(inits))
    path = sandbox / "one.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return npu(["run", str(path), "--digits", "2", "--no-cache", "--cpu-fallback"])


@pytest.mark.parametrize("op, attr", [("Conv", "strides"), ("MaxPool", "strides"),
                                      ("AveragePool", "strides"), ("Conv", "dilations"),
                                      ("Conv", "group")])
def test_an_attribute_onnx_divides_by_is_a_bad_model(sandbox, op, attr):
    """Found by the model fuzzing: a float Conv or pooling with a zero stride, run
    by the CPU fallback, reached onnx's C++ shape inference, which divided by it (a
    floating-point exception: the process died without a word). It is refused on
    import, naming the node and the attribute."""
    attrs = {"kernel_shape": [2, 2], attr: [1, 0] if attr != "group" else 0}
    inputs = ["x", "w"] if op == "Conv" else ["x"]
    inits = [numpy_helper.from_array(np.ones((1, 1, 2, 2), np.float32), "w")]
    code, out, err = run_one_float_node(
        sandbox, helper.make_node(op, inputs, ["y"], name="n0", **attrs),
        inits if op == "Conv" else [])
    assert code == ExitCode.BAD_MODEL, err
    assert f"node 'n0' (#0, {op}, domain ai.onnx): attribute {attr} is" in err, err


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_pooling_padded_over_a_whole_window_is_a_bad_model(sandbox, op):
    """Found by the model fuzzing (``--regress``): an AveragePool padded by 2 after a
    2x2 kernel averaged windows of padding alone, NaN in onnx's reference evaluator
    (with a RuntimeWarning on stderr), and the NaN then failed the comparison with
    the reference; onnxruntime refuses such padding, and so does the import."""
    code, out, err = run_one_float_node(sandbox, helper.make_node(
        op, ["x"], ["y"], name="n0", kernel_shape=[2, 2], pads=[0, 0, 0, 2]))
    assert code == ExitCode.BAD_MODEL and "pads [0, 0, 0, 2] reach a whole [2, 2]" in err, err


def test_an_empty_output_is_a_bad_model(sandbox):
    """Found by the model fuzzing: an AveragePool whose kernel is wider than its
    input, run by the CPU fallback, gave an empty output, and the report's argmax
    of it was an internal error; an empty CPU result is refused on import."""
    code, out, err = run_one_float_node(sandbox, helper.make_node(
        "AveragePool", ["x"], ["y"], name="n0", kernel_shape=[1, 9]))
    assert code == ExitCode.BAD_MODEL and "output 'y' is empty: shape [1, 1, 8, 0]" in err, err


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_bias_scale_that_is_not_finite_is_named(sandbox, value):
    """Found by the model fuzzing: a NaN bias scale made a NaN bias, whose cast to
    int32 printed a RuntimeWarning before the import refused the model for another
    reason; the line names the bias, with no warning."""
    path = bundled_with(sandbox, "moe", "gate_B_quantized_scale", np.float32(value))
    argv = ["run", str(path), "--digits", "2", "--no-cache"]
    code, out, err = npu(argv)
    assert_clean(argv, code, out, err)
    assert code == ExitCode.BAD_MODEL and "node 'gate'" in err, err
    assert "the bias is NaN or infinite" in err, err


def test_an_empty_input_is_a_bad_model(sandbox):
    """Found by the model fuzzing: the MLP declared with 0 rows, fed an empty array by
    ``--inputs``, reached the compiler, which wrote a GEMM of 0 rows (an internal
    error); an input of size 0 is refused on import."""
    model = onnx.load(str(cli.MODELS / "mlp.onnx"))
    for v in (*model.graph.input, *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 0
    path = sandbox / "mlp_empty.onnx"
    path.write_bytes(model.SerializeToString())
    np.savez(sandbox / "empty.npz", input=np.zeros((2, 0, 64), np.float32))
    for inputs in (["--inputs", str(sandbox / "empty.npz")], ["--digits", "2"]):
        code, out, err = npu(["run", str(path), *inputs, "--no-cache"])
        assert code == ExitCode.BAD_MODEL and "size 0 at axis 0" in err, err
