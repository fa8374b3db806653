"""The ``npu`` command: run, compile, disassemble models; show the device profile.

::

    npu run MODEL.onnx [--backend golden|verilator|serial [--port PATH --baud N]]
            [--config NAME | --profile NAME]
            [--digits N | --inputs FILE.npz] [--cpu-fallback] [--dim NAME=SIZE ...]
            [--cycle-budget N] [--timeout S]
            [--adaptive [--phases 012|789] [--batch B] [--cache PATH | --no-cache]]
    npu report MODEL [--config NAME]
    npu compile MODEL.onnx [-o PROGRAM.bin] [--config NAME] [--cpu-fallback] [--dim NAME=SIZE]
    npu disasm MODEL.onnx [--config NAME] [--cpu-fallback] [--dim NAME=SIZE]
    npu info [--backend golden|verilator|serial] [--config NAME | --profile NAME]
    npu precompile --profile NAME [--model M ...] [--cache PATH] [--jobs N] [--cpu-fallback]
    npu cache info|verify|clear [--cache PATH] [--model M ...]

The golden backend runs the golden model in-process. The verilator backend
builds the RTL into a simulation library (the first time, a minute or two; cached
under build/sim/fast_*) and drives it in-process over the NPU's real AXI ports
(host/verilator_device.py). The serial backend drives an FPGA board through its
UART bridge (docs/bridge.md). ``--profile NAME`` runs a named hardware profile of
host/profiles.py on a simulated backend: its build, behind its memory (``slowmem``: the
default build behind a slow DRAM; programs are compiled for the build alone).
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import sys
import traceback
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from firmware.config import CONFIGS

MODELS = Path(__file__).resolve().parent / "models"
MLPERF = MODELS / "mlperf"  # host.models.MLPERF_DIR (not imported: it loads onnx)


class ExitCode(enum.IntEnum):
    """``npu``'s exit status: one per class of failure, so a script can tell them apart."""

    OK = 0
    INTERNAL = 1     # a bug in npu itself (or a check that did not pass)
    USAGE = 2        # bad arguments or input files (argparse's own code)
    BAD_MODEL = 3    # a model file that is missing, unreadable or malformed
    UNSUPPORTED = 4  # a well-formed model with an operator nothing here can run, or
                     # one the compiler cannot map onto this NPU
    DEVICE = 5       # the NPU, its bus or its serial port reported an error
    MISMATCH = 6     # a result differs from the reference interpreter
    LIMIT = 7        # a run went past its cycle budget or wall-clock timeout
    INTERRUPTED = 130  # stopped by Ctrl-C (what a shell reports for SIGINT)


EXIT_CODES_HELP = "exit codes: " + ", ".join(
    f"{c.value} {c.name.lower().replace('_', ' ')}" for c in ExitCode) + \
    "; --debug shows the traceback of a failure"


DIGITS = 20  # held-out digits ``npu run`` runs by default
DIGIT_PIXELS = 64  # one 8x8 held-out digit


class UsageError(Exception):
    """An argument or input file ``npu`` cannot use; the message says which and why."""


def bundled_names() -> list[str]:
    return sorted(f.stem for d in (MODELS, MLPERF) for f in d.glob("*.onnx"))


def model_path(name: str) -> Path:
    """A model file, or the name of a bundled model (``moe`` -> host/models/moe.onnx,
    ``resnet8`` -> host/models/mlperf/resnet8.onnx)."""
    from .errors import ModelError

    p = Path(name)
    if p.is_file():
        return p
    for folder in (MODELS, MLPERF):
        bundled = folder / f"{name}.onnx"
        if bundled.is_file():  # a directory named like a bundled model does not shadow it
            return bundled
    what = "is a directory, not an .onnx file" if p.is_dir() else "does not exist"
    raise ModelError(f"model {name!r} {what} (bundled models: {', '.join(bundled_names())})")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def dim_arg(text: str) -> tuple[str, int]:
    """``--dim NAME=SIZE``: a size for a symbolic input dimension of the model."""
    name, sep, size = text.partition("=")
    if not sep or not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SIZE with a positive SIZE, "
                                         "e.g. 'batch=4'")
    return name, int(size)


def load_model(opts):
    """The IR graph of ``opts.model`` with the command's import options."""
    from .onnx_import import load_onnx

    return load_onnx(model_path(opts.model), allow_cpu_fallback=opts.cpu_fallback,
                     dims=dict(opts.dim or ()))


def cycle_budget_arg(text: str) -> int:
    from .limits import MAX_BUDGET

    value = int(text)
    if not 0 <= value <= MAX_BUDGET:
        raise argparse.ArgumentTypeError(f"must be 0 (no budget) to {MAX_BUDGET}, not {value}")
    return value


def timeout_arg(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 for none, not {text}")
    return value


def phases_arg(text: str) -> str:
    """``--phases``: groups of digit classes separated by ``|``; checked before any run."""
    if not all(ph and ph.isdigit() and ph.isascii() for ph in text.split("|")):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not groups of digits 0-9 separated by '|', e.g. '012|789'")
    return text


def load_npz(path: str, graph) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The arrays of an ``--inputs`` file, one per graph input, and its labels if any.

    Raises :class:`UsageError` for a file that is missing, not an .npz, lacks an
    input, holds no samples, has NaN or infinity, or has fewer labels than samples.
    """
    import zipfile

    try:
        data = np.load(path, allow_pickle=False)
    except OSError as err:
        raise UsageError(f"--inputs {path}: cannot read it ({err.strerror or err})") from None
    except (ValueError, EOFError, zipfile.BadZipFile):  # EOFError: an empty file
        raise UsageError(f"--inputs {path}: not an .npz file (numpy.savez writes one)") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise UsageError(f"--inputs {path}: a single array, not an .npz with one array "
                         f"per graph input ({', '.join(graph.inputs)})")
    missing = [k for k in graph.inputs if k not in data.files]
    if missing:
        raise UsageError(f"--inputs {path}: no array named {', '.join(missing)} (it has "
                         f"{', '.join(data.files) or 'none'}; the model's inputs are "
                         f"{', '.join(graph.inputs)})")
    arrays = {k: data[k] for k in graph.inputs}
    labels = data["labels"] if "labels" in data.files else None
    check_arrays(path, arrays, labels, graph)
    return arrays, labels


def check_arrays(path, arrays: dict[str, np.ndarray], labels, graph) -> None:
    """Refuse input arrays that would crash the run or give a meaningless result."""
    counts = {len(a) if a.ndim else 0 for a in arrays.values()}
    if counts == {0} or len(counts) > 1:
        raise UsageError(f"--inputs {path}: the arrays need the same, non-zero number of "
                         f"samples along their first axis (they have {sorted(counts)})")
    count = counts.pop()
    for k, a in arrays.items():
        size = int(np.prod(graph.tensors[k].shape))
        if a[0].size != size:
            raise UsageError(f"--inputs {path}: a sample of {k!r} has {a[0].size} values, "
                             f"the model's input has {size} (shape {graph.tensors[k].shape})")
        if a.dtype.kind not in "biuf":
            raise UsageError(f"--inputs {path}: {k!r} holds {a.dtype}, not numbers")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            # the reference interpreter would quantize NaN to an arbitrary integer and
            # the run would still "equal the reference"
            raise UsageError(f"--inputs {path}: {k!r} contains NaN or infinity")
    if labels is not None and (labels.ndim != 1 or labels.dtype.kind not in "biuf"):
        raise UsageError(f"--inputs {path}: 'labels' must be one class number per sample "
                         f"(it holds {labels.dtype}, shape {labels.shape})")
    if labels is not None and len(labels) < count:
        # accuracy over the missing labels would silently read 0 %
        raise UsageError(f"--inputs {path}: {len(labels)} labels for {count} samples")


def sample_inputs(model: str) -> Path | None:
    """The sample inputs shipped with a bundled MLPerf model (named, not a path)."""
    path = MLPERF / f"{model}.expected.npz"
    return path if not Path(model).is_file() and path.is_file() else None


def load_inputs(graph, opts) -> tuple[list[dict], np.ndarray | None]:
    """The inputs to run: arrays from an .npz (``--inputs``, or a bundled MLPerf
    model's samples unless ``--digits`` is given), or digits from the held-out split."""
    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    samples = sample_inputs(opts.model) if opts.digits is None else None
    if opts.inputs or samples:
        arrays, labels = load_npz(opts.inputs or str(samples), graph)
        count = len(next(iter(arrays.values())))
        return [{k: v[i].reshape(graph.tensors[k].shape) for k, v in arrays.items()}
                for i in range(count)], labels
    check_digits_fit(graph, DIGIT_PIXELS)
    from .datasets import load_digits_split

    split = load_digits_split(seed=0)
    n = min(opts.digits or DIGITS, len(split.x_test))
    xs = [{name: split.x_test[i].reshape(shape).astype(np.float32)} for i in range(n)]
    return xs, split.y_test[:n]


def check_digits_fit(graph, pixels: int) -> None:
    """Refuse a model the held-out digits cannot feed (one input of ``pixels`` values)."""
    shapes = {k: graph.tensors[k].shape for k in graph.inputs}
    sizes = [int(np.prod(s)) for s in shapes.values()]
    if sizes != [pixels]:
        inputs = ", ".join(f"{k!r} {s}" for k, s in shapes.items()) or "none"
        raise UsageError(f"the model's input is {inputs}, not an 8x8 digit ({pixels} values "
                         "as one input): pass --inputs FILE.npz")


# ---- commands on a device -------------------------------------------------------------------


def run_on_device(device, opts, console: Console | None = None) -> bool:
    """``npu run`` against ``device`` (any backend). Returns True when every check passed."""
    from .adaptive.timeline import attach_timeline
    from .compiler import compile_model
    from .driver import NPUDriver
    from .limits import RunLimits
    from .runtime import Session

    console = console or Console()
    drv = NPUDriver(device)
    drv.limits = RunLimits(opts.cycle_budget, opts.timeout)
    graph = load_model(opts)
    for note in graph.notes:
        console.print(f"note: {note}", highlight=False)
    if opts.adaptive:
        return run_adaptive(drv, graph, opts, console)
    batch, labels = load_inputs(graph, opts)  # bad inputs are refused before compiling
    # the "predicted" column
    model = attach_timeline(compile_model(graph, drv.config, fuse=not opts.per_layer,
                                          paging=True))
    session = Session(drv, model, check=not opts.no_check)
    session.load()
    console.print(f"[bold]{graph.name}[/] on the {opts.backend} NPU "
                  f"({drv.config.rows}x{drv.config.cols} array, {drv.config.bus_bytes * 8}-bit "
                  f"bus): {len(model.program)} instructions"
                  f"{f' in {len(model.pages)} pages' if model.pages else ''}, "
                  f"{len(model.units)} units, "
                  f"{len(batch)} inputs")
    results = []
    with Progress(console=console, transient=True, disable=len(batch) < 8) as bar:
        task = bar.add_task("inference", total=len(batch))
        for inputs in batch:
            results.append(session.run(inputs))
            bar.advance(task)
    report(model, results, labels, console)
    if results:
        from .costgraph_report import run_costgraph

        run_costgraph(model, results[-1], batch[-1], device, console)
    return all(r.checked for r in results) or opts.no_check


def phase_inputs(graph, opts) -> tuple[list[dict], np.ndarray]:
    """``--phases 012|789``: held-out digits whose class mix shifts phase by phase."""
    from .datasets import class_mix_stream

    name = graph.inputs[0]
    shape = graph.tensors[name].shape
    phases = [{int(c): 1.0 for c in ph} for ph in opts.phases.split("|")]
    samples = list(class_mix_stream(opts.digits or DIGITS, phases, seed=opts.seed))
    check_digits_fit(graph, DIGIT_PIXELS)
    return ([{name: s.x.reshape(shape).astype(np.float32)} for s in samples],
            np.array([s.label for s in samples]))


def run_adaptive(drv, graph, opts, console: Console) -> bool:
    """``npu run --adaptive``: serve the inputs with the adaptive runtime, print its
    events live and its report at the end (saved for ``npu report``)."""
    from .adaptive import AdaptiveConfig, AdaptiveRuntime
    from .adaptive.cache import CompileCache, default_cache_path
    from .adaptive.report import print_report, stream_figures
    from .adaptive.saved import load_state, model_digest, report_path, save_json, state_path
    from .compiler.compile import ProgramTooLong

    model_file = model_path(opts.model)
    state = None if opts.fresh or opts.no_cache else load_state(model_file, drv.config)
    cache = CompileCache(None if opts.no_cache else (opts.cache or default_cache_path()),
                         fresh=opts.fresh)
    if cache.read_only:
        console.print(f"note: the compile cache {cache.path} is read-only: read as it is, "
                      "what this run compiles is not kept", highlight=False, soft_wrap=True)
    from .adaptive.sparsity import SparsityConfig
    from .adaptive.specialize_units import SpecializeConfig

    try:
        rt = AdaptiveRuntime(drv, graph, AdaptiveConfig(
                                 check=not opts.no_check,
                                 async_compile=not opts.inline_compile,
                                 specialize=SpecializeConfig() if opts.specialize else None,
                                 sparsity=SparsityConfig() if opts.sparsity else None,
                                 start_fused=opts.start_fused),
                             cache=cache, state=state, dram_latency=_hardware(opts)[1],
                             on_event=lambda e: console.print(
                                 f"[cyan]{escape(str(e))}", highlight=False, soft_wrap=True))
        rt.load()
    except ProgramTooLong as err:
        raise UsageError(f"--adaptive hot-swaps plans through the shadow instruction bank, "
                         f"and {graph.name}'s program does not fit one bank ({err}): it runs "
                         "only paged through that bank; run it without --adaptive, or with "
                         "--adaptive on a configuration with deeper banks "
                         "(--config default)") from None
    batch, labels = phase_inputs(rt.graph, opts) if opts.phases else load_inputs(rt.graph, opts)
    console.print(f"[bold]{graph.name}[/] on the {opts.backend} NPU with the adaptive "
                  f"runtime: {len(batch)} inputs, initial plan {rt.report()['plan']}")
    if opts.batch > 1:
        results = [r for i in range(0, len(batch), opts.batch)
                   for r in rt.run_batch(batch[i:i + opts.batch])]
    else:
        results = rt.run_many(batch)
    rt.close()
    report(rt.model, results, labels, console)
    rep = rt.report()
    rep["stream"] = stream_figures(results)
    rep["model_digest"] = model_digest(model_file)
    from .costgraph_report import adaptive_costgraph

    rep["costgraph"] = adaptive_costgraph(results, batch, drv.device)
    print_report(rep, console)
    path = save_json(rep, report_path(model_file, drv.config))
    if not opts.no_cache:
        save_json(rt.state(), state_path(model_file, drv.config))
    cache.close()  # checkpoints the WAL into the file
    console.print(f"report saved to {path} (npu report {opts.model})", highlight=False)
    return all(r.checked for r in results) or opts.no_check


def report(model, results, labels, console: Console):
    """Predictions, accuracy, cycles, utilization and the per-unit table."""
    from .adaptive.bottleneck import CAUSE_FIELDS, classify
    from .compiler.cost import CostModel

    out_name = model.graph.outputs[0]
    preds = [int(np.argmax(r.outputs[out_name])) for r in results]
    if len(results) <= 20:
        console.print("predictions: " + " ".join(map(str, preds)))
    if labels is not None:
        acc = float(np.mean(np.array(preds) == np.asarray(labels)[:len(preds)]))
        console.print(f"accuracy: {100 * acc:.2f}% on {len(preds)} held-out digits")
    cycles = [r.cycles for r in results]
    macs = sum(r.counters["macs"] for r in results)
    peak = model.config.peak_macs_per_cycle * max(sum(cycles), 1)
    console.print(f"cycles per inference: mean {np.mean(cycles):.0f}, min {min(cycles)}, "
                  f"max {max(cycles)}; MAC utilization {100 * macs / peak:.1f}%; DRAM "
                  f"{np.mean([r.counters['dram_read_bytes'] for r in results]):.0f} B read, "
                  f"{np.mean([r.counters['dram_write_bytes'] for r in results]):.0f} B written "
                  "per inference")
    checked = sum(r.checked for r in results)
    if checked:
        console.print(f"[green]{checked}/{len(results)} results equal the reference "
                      "interpreter bit for bit")
    cost = CostModel(model.config)
    cost.calibrate(model)
    runs: dict[int, list] = {}
    for r in results:
        if any(isinstance(p, str) for p in getattr(r, "plan", ())):
            continue  # a batch variant's run: its regions are not the plan's units
        for t in r.trace:
            runs.setdefault(t.region, []).append(t)
    table = Table("unit", "nodes", "runs", "cycles", "predicted", "MACs", "DRAM rd", "DRAM wr",
                  "tag hits", "misses", "bound by", title="per unit (mean per run)")
    regions = model.regions
    for uid in sorted(regions):
        u, recs = regions[uid], runs.get(uid, [])
        for t in recs:
            cost.observe(u.resources["work"], t.cycles, cold=bool(t.tag_misses))
        if not recs:
            table.add_row(str(uid), ", ".join(u.nodes), "0", "", "", "", "", "", "", "", "")
            continue
        def mean(f, recs=recs):
            return np.mean([getattr(t, f) for t in recs])

        table.add_row(str(uid), ", ".join(u.nodes), str(len(recs)), f"{mean('cycles'):.0f}",
                      f"{cost.predict(u.resources['work']):.0f}", f"{mean('macs'):.0f}",
                      f"{mean('dram_read_bytes'):.0f}", f"{mean('dram_write_bytes'):.0f}",
                      f"{mean('tag_hits'):.1f}", f"{mean('tag_misses'):.1f}",
                      classify(mean("cycles"), {f: mean(f) for f in CAUSE_FIELDS}).describe(1))
    console.print(table)
    before = cost.error()
    err = cost.fit()
    console.print(f"cost model: mean error {100 * before:.1f}% before measuring (golden "
                  "timeline), "
                  f"{100 * err:.1f}% after refitting on {len(cost.samples)} region runs")


def info_on_device(device, opts, console: Console | None = None) -> bool:
    from .driver import NPUDriver

    console = console or Console()
    drv = NPUDriver(device)
    table = Table("parameter", "value", title=f"NPU hardware profile ({opts.backend}, from CAPS)")
    for k, v in drv.config.as_dict().items():
        table.add_row(k, str(v))
    table.add_row("peak MACs/cycle", str(drv.config.peak_macs_per_cycle))
    table.add_row("active bank", str(drv.active_bank))
    console.print(table)
    return True


COMMANDS = {"run": run_on_device, "info": info_on_device}


def _passed(ok: bool) -> ExitCode:
    """A command that ran to its end but whose results were not all checked is a failure."""
    return ExitCode.OK if ok else ExitCode.INTERNAL


def _hardware(opts):
    """The build and the simulated memory latency that ``--config``/``--profile`` name."""
    from firmware.bursts import DramLatency

    from .profiles import dram_latency, profile

    if not opts.profile:
        return CONFIGS[opts.config], DramLatency()
    latency = dram_latency(opts.profile)
    if latency and opts.backend == "serial":
        raise UsageError(f"--profile {opts.profile}: a board's memory is its own; the "
                         "profile's DRAM latency is simulated (--backend golden or verilator)")
    return profile(opts.profile), latency


def _on_backend(opts, argv) -> int:
    config, latency = _hardware(opts)
    if opts.backend == "golden":
        from .device import GoldenDevice

        device = GoldenDevice(config, dram_latency=latency)
        return _passed(COMMANDS[opts.command](device, opts))
    if opts.backend == "serial":
        if not opts.port:
            print("npu: --backend serial needs --port PATH", file=sys.stderr)
            return ExitCode.USAGE
        try:
            import serial
        except ImportError:
            print("npu: --backend serial needs pyserial: pip install 'adaptive-npu[fpga]'",
                  file=sys.stderr)
            return ExitCode.USAGE

        from .serial_device import SerialDevice

        try:
            port = serial.Serial(opts.port, opts.baud, timeout=2.0)
        except serial.SerialException as err:
            from .driver import DeviceError

            raise DeviceError(f"cannot open the serial port {opts.port} ({err}): check "
                              "--port, the cable and the port's permissions") from None
        device = SerialDevice(port)
        try:
            return _passed(COMMANDS[opts.command](device, opts))
        finally:
            device.close()
    from .verilator_device import SimBuildError, VerilatorDevice

    try:
        device = VerilatorDevice.open(
            config, on_status=lambda line: print(f"npu: {line}", flush=True),
            dram_latency=latency)
    except SimBuildError as err:
        print(f"npu: {err}", file=sys.stderr)
        return ExitCode.USAGE if err.missing_tools else ExitCode.INTERNAL
    try:
        return _passed(COMMANDS[opts.command](device, opts))
    finally:
        device.close()


# ---- offline commands -----------------------------------------------------------------------


def compile_cmd(opts) -> int:
    from .compiler import compile_model

    model = compile_model(load_model(opts), CONFIGS[opts.config], fuse=not opts.per_layer)
    console = Console()
    if opts.variants:
        return print_variants(model, console)
    table = Table("unit", "nodes", "inputs", "outputs", "instructions", "scratchpad B",
                  title=f"{model.graph.name} for the {opts.config} config")
    for u in model.units:
        table.add_row(str(u.id), ", ".join(u.nodes), ", ".join(u.inputs), ", ".join(u.outputs),
                      str(u.resources["instructions"]), str(u.resources["scratchpad_bytes"]))
    console.print(table)
    console.print(model.resources())
    for line in model.log:
        console.print(f"simplified: {line}")
    for line in model.fusion:
        console.print(line, highlight=False)
    if opts.output:
        program = Path(opts.output)
        if program.is_dir() or program.name in ("", ".", ".."):
            raise UsageError(f"-o {opts.output}: is a directory; name the program file "
                             "(e.g. -o out/prog.bin)")
        if program.exists() and not program.is_file():
            # a device or a pipe: its PROGRAM.const would land beside it (/dev/null.const)
            raise UsageError(f"-o {opts.output}: is not a regular file; the program and "
                             "its PROGRAM.const need a file path (e.g. -o out/prog.bin)")
        consts = program.with_suffix(".const")
        if program == consts:  # the constants would overwrite the program
            raise UsageError(f"-o {opts.output}: the constants go to PROGRAM.const; name "
                             "the program otherwise (e.g. prog.bin)")
        from .adaptive.saved import write_whole

        for path, data in ((program, model.program.to_bytes()), (consts, model.const_image())):
            try:
                if path.exists() and not path.is_file():  # a device or a pipe: as it is
                    path.write_bytes(data)
                else:  # whole: a kill or a full disk leaves the old file, not half of one
                    write_whole(path, lambda f, data=data: f.write(data))
            except OSError as err:
                raise UsageError(f"-o {opts.output}: cannot write {path} "
                                 f"({err.strerror or err})") from None
        console.print(f"wrote {program} ({len(model.program) * 8} bytes) and its "
                      f"constants {consts}")
    return 0


def print_variants(model, console: Console) -> int:
    """``npu compile --variants``: each unit's legal variants, ranked by the cost model."""
    from .compiler.variants import enumerate_variants

    table = Table("unit", "variant", "predicted cycles", "instructions",
                  title=f"{model.graph.name}: the variants of each unit, fastest predicted "
                  "first (* the compiler's own choice)")
    for u in model.units:
        for i, o in enumerate(enumerate_variants(model, u)):
            table.add_row(str(u.id) if i == 0 else "", ("* " if o.variant.is_default else "  ")
                          + o.variant.describe(), f"{o.predicted:.0f}", str(o.instructions))
    console.print(table)
    return 0


def disasm_cmd(opts) -> int:
    from .compiler import compile_model

    model = compile_model(load_model(opts), CONFIGS[opts.config], fuse=not opts.per_layer)
    sys.stdout.write(model.disasm())
    return 0


def precompile_cmd(opts) -> int:
    """Fill the compiled-unit cache for a hardware profile ahead of time."""
    from .adaptive.cache import CompileCache, default_cache_path
    from .adaptive.pool import cores
    from .profiles import profile

    config = profile(opts.profile)
    names = opts.model or bundled_quantized()
    jobs = cores() if opts.jobs is None else opts.jobs
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: give at least 1 compile process")
    path = Path(opts.cache) if opts.cache else default_cache_path()
    console = Console()
    table = Table("model", "plans", "compiled", "cached already", "refused", "units compiled",
                  title=f"precompiled for the {opts.profile} profile")
    with CompileCache(path) as cache:
        _refuse_read_only(cache, "precompile")
        try:
            done = _precompile_models(cache, names, config, jobs, opts, console, table)
        except KeyboardInterrupt:
            print(f"npu: precompile interrupted; {path} keeps every unit and plan compiled "
                  "so far (run it again to finish)", file=sys.stderr)
            return ExitCode.INTERRUPTED
        console.print(table)
        st = cache.stats()
    console.print(f"{done['compiled']} compiles, {done['cached']} cache hits, {done['units']} "
                  f"units compiled ({jobs} process{'es' if jobs > 1 else ''}); cache {path} "
                  f"({st['entries']} entries, {st['units']} compiled units, "
                  f"{st['bytes'] + st['unit_bytes']} bytes)", soft_wrap=True, highlight=False)
    return 0


def _precompile_models(cache, names, config, jobs, opts, console, table):
    """Precompile the models into ``cache`` (all of them through one pool of ``jobs``
    processes), a row of ``table`` each; returns the plans compiled, found cached,
    and the units compiled, over all models."""
    from .adaptive.cache import precompile_models
    from .compiler import simplify
    from .onnx_import import load_onnx

    graphs = [simplify(load_onnx(model_path(name), allow_cpu_fallback=opts.cpu_fallback))[0]
              for name in names]
    results = precompile_models(cache, graphs, config, jobs)
    done = dict.fromkeys(("compiled", "cached", "units"), 0)
    for name, res in zip(names, results, strict=True):
        if isinstance(res, Exception):
            console.print(f"note: {name} skipped: {res}", soft_wrap=True, highlight=False)
            table.add_row(name, "-", "-", "-", "-", "-")
            continue
        for note in res.notes:
            console.print(f"note: {note}", soft_wrap=True, highlight=False)
        table.add_row(name, str(res.plans), str(res.compiled), str(res.cached),
                      str(res.refused), str(res.units))
        for k in done:
            done[k] += getattr(res, k)
    return done


def bundled_quantized() -> list[str]:
    return sorted(f.stem for f in MODELS.glob("*.onnx") if not f.stem.endswith("_float"))


def cache_cmd(opts) -> int:
    """``npu cache info|verify|clear`` on one cache file (never created by info)."""
    from .adaptive.cache import CompileCache, default_cache_path

    path = Path(opts.cache) if opts.cache else default_cache_path()
    if not path.exists():
        raise UsageError(f"no compile cache at {path} (pass --cache PATH)")
    with CompileCache(path) as cache:
        if opts.action == "info":
            return cache_info(cache)
        _refuse_read_only(cache, f"cache {opts.action}")
        if opts.action == "clear":
            print(f"removed {cache.clear()} entries from {path}")
            return ExitCode.OK
        return cache_verify(cache, opts.model or bundled_quantized())


def _refuse_read_only(cache, command: str) -> None:
    if cache.read_only:
        raise UsageError(f"compile cache {cache.path}: is read-only, and npu {command} "
                         "writes it; pass another --cache PATH")


def cache_info(cache) -> int:
    from collections import Counter

    entries = cache.entries()
    st = cache.stats()
    profiles = Counter(e["profile_name"] or e["profile"] for e in entries)
    programs = sum(e["kind"] == "program" for e in entries)
    other_version = sum(not e["current"] for e in entries)
    print(f"path: {cache.path}")
    print(f"entries: {len(entries)} ({programs} programs, {len(entries) - programs} refusals"
          f"{f', {other_version} from another compiler version' if other_version else ''})")
    units = cache.unit_entries()
    refused = sum(u["kind"] == "error" for u in units)
    print(f"units: {len(units)} compiled units ({refused} refusals)")
    print(f"size: {st['bytes'] + st['unit_bytes']} bytes stored, file "
          f"{cache.path.stat().st_size} bytes")
    print("profiles: " + (", ".join(f"{name} ({n})" for name, n in sorted(profiles.items()))
                          or "none"))
    return ExitCode.OK


def cache_verify(cache, names: list[str]) -> int:
    from .adaptive.cache import verify
    from .compiler import simplify
    from .errors import ModelError
    from .onnx_import import load_onnx

    graphs = []
    for name in names:
        try:
            graphs.append(simplify(load_onnx(model_path(name)))[0])
        except ModelError as err:
            print(f"note: {name} skipped: {err}")
    res = verify(cache, graphs)
    print(f"{cache.path}: {res.entries} entries; {res.recompiled} recompiled and compared, "
          f"{res.intact} others intact (version, digest, decoding); evicted {res.evicted}; "
          f"{res.units} compiled units checked (version, digest, decoding), "
          f"{res.units_evicted} evicted")
    return ExitCode.OK


def report_cmd(opts) -> int:
    from .adaptive.report import print_report
    from .adaptive.saved import load_report

    config = "" if opts.config == "default" else f" --config {opts.config}"
    rep = load_report(model_path(opts.model), CONFIGS[opts.config],
                      f"npu run {opts.model} --adaptive{config}")
    if opts.json:
        print(json.dumps(rep, indent=1))
    else:
        print_report(rep, Console())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other ``npu`` error."""

    def error(self, message):
        self.exit(ExitCode.USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="npu", description=__doc__.splitlines()[0], epilog=EXIT_CODES_HELP)
    ap.add_argument("--debug", action="store_true",
                    help="show the Python traceback of a failure instead of one line")
    sub = ap.add_subparsers(dest="command", required=True)

    def per_layer_arg(p):
        p.add_argument("--per-layer", action="store_true",
                       help="compile one unit per layer (default: neighbouring layers fused "
                       "where the cost model predicts it faster)")

    from .profiles import PROFILES

    def common(p, backend: bool):
        # A named profile is a build and a memory: it replaces --config on a device.
        g = p.add_mutually_exclusive_group() if backend else p
        g.add_argument("--config", default="default", choices=sorted(CONFIGS),
                       help="hardware configuration (default: default)")
        if backend:
            g.add_argument("--profile", choices=list(PROFILES),
                           help="a named hardware profile: its build behind its memory "
                           "(slowmem: the default build behind a slow DRAM)")
            p.add_argument("--backend", default="golden", choices=("golden", "verilator", "serial"))
            p.add_argument("--port", help="with --backend serial: the board's serial port")
            p.add_argument("--baud", type=int, default=115_200, help="with --backend serial")

    p = sub.add_parser("run", help="run a model and report")
    p.add_argument("model", help="an .onnx file or a bundled model name (mlp, cnn, moe, "
                   "early_exit; MLPerf Tiny: resnet8, ds_cnn, mobilenet_v1_025, "
                   "fc_autoencoder)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--digits", type=positive_int,
                   help=f"held-out digits to run (default {DIGITS}; an MLPerf model runs "
                   "its sample inputs unless this is given)")
    g.add_argument("--inputs", help=".npz with one array per graph input (first axis: samples) "
                   "and optional 'labels'")
    p.add_argument("--no-check", action="store_true", help="skip the reference comparison")
    p.add_argument("--cycle-budget", type=cycle_budget_arg, metavar="N",
                   help="NPU cycles one run may take before the NPU stops it (default: "
                   "16x the program's cost-model estimate, at least 100000; 0: none)")
    p.add_argument("--timeout", type=timeout_arg, metavar="S",
                   help="wall-clock seconds to wait for one run (default: 10 s plus the "
                   "cycle budget at 10k cycles/s, the slowest backend; 0: none)")
    p.add_argument("--cpu-fallback", action="store_true", help="run unsupported ops on the CPU")
    p.add_argument("--dim", type=dim_arg, action="append", metavar="NAME=SIZE",
                   help="a size for a symbolic input dimension (repeatable; a symbolic "
                   "batch dimension is 1 without it)")
    p.add_argument("--adaptive", action="store_true",
                   help="serve with the adaptive runtime (profile, fuse, hot-swap, validate; "
                   "it starts from the per-layer plan)")
    p.add_argument("--specialize", action="store_true",
                   help="with --adaptive: try variants of the hot units picked by their "
                   "counters, keep what measures faster (npu compile --variants lists them)")
    p.add_argument("--sparsity", action="store_true",
                   help="with --adaptive: skip GEMM input elements the inputs keep zero, "
                   "on a variant guarded per input (the generic plan runs the rest)")
    p.add_argument("--start-fused", action="store_true",
                   help="with --adaptive: start from the compiler's fused plan")
    per_layer_arg(p)
    p.add_argument("--phases", type=phases_arg, help="with --digits N: a stream whose class "
                   "mix shifts, e.g. '012|789' (two phases)")
    p.add_argument("--seed", type=int, default=0, help="stream seed for --phases")
    p.add_argument("--batch", type=int, default=1, help="with --adaptive: serve B inputs "
                   "per call (the runtime builds a guarded batch variant when it can)")
    p.add_argument("--cache", help="compile cache file (default: $NPU_CACHE_DIR/"
                   "compile.sqlite or ~/.cache/npu/compile.sqlite)")
    p.add_argument("--no-cache", action="store_true", help="keep compiled plans in memory "
                   "only (and neither load nor save the runtime's state)")
    p.add_argument("--inline-compile", action="store_true", help="with --adaptive: compile "
                   "new plans on the inference path instead of a worker thread (the "
                   "decisions then do not depend on thread timing: reproducible runs)")
    p.add_argument("--fresh", action="store_true", help="with --adaptive: ignore the state "
                   "an earlier run saved (profile and plan) and the compile cache's entries "
                   "(plans are compiled again and replace them), and start from the initial "
                   "plan")
    common(p, True)
    p = sub.add_parser("report", help="the report of the last adaptive run of a model")
    p.add_argument("model")
    p.add_argument("--json", action="store_true", help="print the saved report as JSON "
                   "(its cost graph under 'costgraph')")
    common(p, False)
    p = sub.add_parser("info", help="the device's CAPS as a hardware profile")
    common(p, True)
    for name, what in (("compile", "compile and summarize"), ("disasm", "print the program")):
        p = sub.add_parser(name, help=what)
        p.add_argument("model")
        p.add_argument("--cpu-fallback", action="store_true")
        p.add_argument("--dim", type=dim_arg, action="append", metavar="NAME=SIZE")
        if name == "compile":
            p.add_argument("-o", "--output", help="write the program image here")
            p.add_argument("--variants", action="store_true",
                           help="list each unit's legal variants with predicted cycles")
        per_layer_arg(p)
        common(p, False)
    p = sub.add_parser("precompile", help="fill the compiled-unit cache for a hardware "
                       "profile (initial plans and every accepted merge of two units)")
    p.add_argument("--profile", required=True, choices=list(PROFILES),
                   help="the hardware profile to compile for")
    p.add_argument("--model", nargs="+", action="extend",
                   help="bundled model names or .onnx files (default: every bundled "
                   "quantized model)")
    p.add_argument("--cache", help="the cache file (default: $NPU_CACHE_DIR/compile.sqlite "
                   "or ~/.cache/npu/compile.sqlite)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="compile processes (default: one per core)")
    p.add_argument("--cpu-fallback", action="store_true",
                   help="run what the NPU lacks on the CPU (models such as resnet8)")
    p = sub.add_parser("cache", help="inspect, verify or clear the compile cache")
    p.add_argument("action", choices=("info", "verify", "clear"),
                   help="info: what it holds; verify: recompile the bundled models' plans "
                   "and check every entry, evicting bad ones; clear: remove every entry")
    p.add_argument("--cache", help="the cache file (default: $NPU_CACHE_DIR/compile.sqlite "
                   "or ~/.cache/npu/compile.sqlite)")
    p.add_argument("--model", nargs="+", action="extend",
                   help="with verify: the models whose plans are recompiled (default: every "
                   "bundled quantized model)")
    for p in sub.choices.values():
        # also after the command (npu run mlp --debug); SUPPRESS keeps the global value
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)
    return ap


def failure(err: Exception) -> tuple[ExitCode, str]:
    """The exit code and the one line ``npu`` prints for an exception a command raised."""
    from .adaptive.cache import CacheFileError
    from .adaptive.saved import SavedFileError
    from .compiler.plan import CompileError
    from .driver import DeviceError
    from .errors import CPU_FALLBACK_HINT, ModelError, UnsupportedOpError
    from .limits import LimitExceeded
    from .runtime import MismatchError

    if isinstance(err, (UsageError, CacheFileError, SavedFileError)):
        return ExitCode.USAGE, str(err)
    if isinstance(err, LimitExceeded):
        return ExitCode.LIMIT, (f"{err}: a program that does not end, or a limit too tight "
                                f"for it (raise it with {err.option}, 0 for none)")
    if isinstance(err, UnsupportedOpError):
        return ExitCode.UNSUPPORTED, str(err).replace(
            CPU_FALLBACK_HINT, "or run with --cpu-fallback to run it on the CPU")
    if isinstance(err, CompileError):
        return ExitCode.UNSUPPORTED, f"the compiler cannot map the model onto this NPU: {err}"
    if isinstance(err, ModelError):  # the command's flag for the library's dims=
        return ExitCode.BAD_MODEL, "bad model: " + re.sub(
            r"pass dims=\{'([^']*)': N\} to load_onnx", r"run with --dim \1=N", str(err))
    if isinstance(err, DeviceError):
        return ExitCode.DEVICE, f"device error: {err}"
    if isinstance(err, MismatchError):
        return ExitCode.MISMATCH, (f"the NPU's result differs from the reference interpreter: "
                                   f"{err} (a compiler or NPU bug: rerun with --no-cache to rule "
                                   "out a stale compiled program, and report it with the model)")
    return ExitCode.INTERNAL, (f"internal error: {type(err).__name__}: {err} "
                               "(run with --debug for the traceback)")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = _parser().parse_args(argv)
    try:
        return _command(opts, argv)
    except KeyboardInterrupt:  # Ctrl-C outside a command's own handler: no traceback
        print("npu: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as err:
        code, line = failure(err)
        if opts.debug:
            traceback.print_exc()
        else:
            # messages may quote arrays that numpy wraps over several lines
            print("npu: " + " ".join(line.split()), file=sys.stderr)
        return code


def _command(opts, argv) -> int:
    if opts.command == "compile":
        return compile_cmd(opts)
    if opts.command == "disasm":
        return disasm_cmd(opts)
    if opts.command == "precompile":
        return precompile_cmd(opts)
    if opts.command == "report":
        return report_cmd(opts)
    if opts.command == "cache":
        return cache_cmd(opts)
    if opts.command == "run":
        _refuse_adaptive_options_alone(opts)
    return _on_backend(opts, argv)


def _refuse_adaptive_options_alone(opts) -> None:
    """Options that only the adaptive runtime acts on: refused on a plain run rather
    than ignored, so no one believes a batch or a cache was used. (``--no-cache`` and
    ``--fresh`` ask for what a plain run does anyway, so they pass.)"""
    given = [flag for flag, on in (("--batch", opts.batch != 1), ("--cache", opts.cache),
                                   ("--inline-compile", opts.inline_compile),
                                   ("--specialize", opts.specialize),
                                   ("--sparsity", opts.sparsity),
                                   ("--start-fused", opts.start_fused)) if on]
    if given and not opts.adaptive:
        raise UsageError(f"{', '.join(given)}: only with --adaptive (add it, or drop "
                         f"{'them' if len(given) > 1 else 'it'})")


if __name__ == "__main__":
    raise SystemExit(main())
