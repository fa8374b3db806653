"""A pool of compile processes: many plans compiled in parallel through one cache.

Compiling is Python, so threads would take turns on one core; processes do not.
:func:`compile_plans_parallel` runs a ``ProcessPoolExecutor`` of at most one
process per core: the processes first lower the units every plan shares (those
of the first plan of each graph, each once), then compile their share of the
plans, lowering what those still lack and linking (:func:`precompile
<host.adaptive.cache.precompile>`). The processes read the sqlite cache and hand
what they compile to the parent, the one writer (a transaction per task), so no
process waits on another for the file's write lock.

Interrupting is safe at any moment: what a task compiled is in the cache whole or
not at all. Ctrl-C stops the workers at once (they ignore SIGINT; the parent ends
them) and the parent re-raises ``KeyboardInterrupt``; a parent killed outright
leaves workers that finish their current task and exit, their work lost.
"""

from __future__ import annotations

import math
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import NamedTuple

from firmware.config import NPUConfig

from ..compiler import CompileError
from ..compiler.compile import plan_units
from ..ir import Graph
from ..profiles import profile_key


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def missing_units(cache, jobs: list[tuple[Graph, list]], config: NPUConfig,
                  variant: str = "") -> list[tuple[int, list[int]]]:
    """``(job index, unit ids)`` to lower so that every plan of ``jobs`` links from the
    cache: each unit the cache lacks, once (the first plan that has it)."""
    from .cache import unit_key

    profile = profile_key(config)
    wanted: dict[str, tuple[int, int]] = {}
    for i, (graph, plan) in enumerate(jobs):
        try:
            planner = plan_units(graph, config, plan)
        except CompileError:
            continue  # the plan is refused whole: its compile says so
        for u, taken in planner.units:
            key = unit_key(graph, [n.name for n in u.nodes], planner.context(u, taken))
            if key not in wanted and not cache.has_unit((key, profile, variant)):
                wanted[key] = (i, u.id)
    by_job: dict[int, list[int]] = {}
    for i, uid in wanted.values():
        by_job.setdefault(i, []).append(uid)
    return sorted(by_job.items())


class Outcome(NamedTuple):
    """What compiling one plan did: ``kind`` "hit", "compiled" or "refused" (then
    ``message`` is the compiler's; ``fresh``: refused now, not from the cache);
    ``units``: the units lowered for it."""

    kind: str
    message: str = ""
    fresh: bool = True
    units: int = 0


def compile_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of at most ``workers`` compile processes (and at most one per core), to
    pass to several :func:`compile_plans_parallel` calls (starting processes costs)."""
    return ProcessPoolExecutor(max(1, min(workers, cores())), initializer=_ignore_sigint)


def compile_plans_parallel(cache, jobs: list[tuple[Graph, list]], config: NPUConfig,
                           workers: int, pool: ProcessPoolExecutor | None = None,
                           busy: list | None = None) -> list[Outcome]:
    """Compile every plan of ``jobs`` into ``cache`` with at most ``workers`` processes
    (and at most one per core), those of ``pool`` when given (else a pool of its
    own). Returns the outcome per job. ``cache`` must be a file (the processes read
    it). ``busy``: gets, per phase, the CPU seconds each process spent on it."""
    if cache.path is None:
        raise ValueError("a pool of compile processes needs a cache file, not memory")
    workers = max(1, min(workers, cores()))
    # Units that every plan of a graph shares (those of its first plan) are lowered
    # first, spread over the processes; then the processes compile runs of
    # neighbouring plans (one graph's, one bet's: they share the most units, and a
    # unit two processes both lack is lowered twice), lowering what those still
    # lack and linking. A few tasks per process and phase: enough to even out
    # plans of unequal cost, few because a round trip to a process costs tens of
    # milliseconds on a loaded machine.
    firsts = list({id(g): i for i, (g, _) in reversed(list(enumerate(jobs)))}.values())
    shared = missing_units(cache, [jobs[i] for i in firsts], config)
    missing = [(firsts[k], uid) for k, ids in shared for uid in ids]
    unit_bins = [missing[k::2 * workers] for k in range(2 * workers)]
    step = math.ceil(len(jobs) / (2 * workers))
    plan_bins = [list(range(a, min(a + step, len(jobs)))) for a in range(0, len(jobs), step)]
    path = str(cache.path)
    own = pool is None
    if own:
        pool = compile_pool(workers)
    try:
        lowered = [0] * len(jobs)
        done = _each(cache, [pool.submit(_timed, _lower_units, path, _by_plan(jobs, b), config)
                             for b in unit_bins if b])
        for (counts, _), _ in done:
            for i, n in counts.items():
                lowered[i] += n
        _busy(busy, done)
        outcomes: list[Outcome] = [Outcome("refused")] * len(jobs)
        bins = [b for b in plan_bins if b]
        done = _each(cache, [pool.submit(_timed, _link_plans, path, [jobs[i] for i in b],
                                         config) for b in bins])
        for b, ((results, _), _) in zip(bins, done, strict=True):
            for i, out in zip(b, results, strict=True):
                outcomes[i] = out._replace(units=out.units + lowered[i])
        _busy(busy, done)
    except BaseException:
        stop(pool)
        raise
    if own:
        pool.shutdown()
    return outcomes


def _by_plan(jobs, units: list[tuple[int, int]]) -> list[tuple[int, Graph, list, list[int]]]:
    """``(job, unit id)`` pairs -> ``(job, graph, plan, unit ids)`` per plan."""
    ids: dict[int, list[int]] = {}
    for i, uid in units:
        ids.setdefault(i, []).append(uid)
    return [(i, *jobs[i], uids) for i, uids in ids.items()]


def _each(cache, futures: list) -> list:
    """The tasks' results in order; each task's cache entries (the second item of its
    result) are written as it finishes, so the tasks that start later find them.
    The first failure is raised at once."""
    for f in as_completed(futures):
        (_, rows), _ = f.result()
        cache.write_rows(rows)
    return [f.result() for f in futures]


def _timed(task, *args):
    """Run ``task`` in a pool process: its result and ``(pid, CPU seconds)``."""
    cpu = time.process_time()
    return task(*args), (os.getpid(), time.process_time() - cpu)


def _busy(busy: list | None, done: list) -> None:
    if busy is not None:
        per: dict[int, float] = {}
        for _, (pid, cpu) in done:
            per[pid] = per.get(pid, 0.0) + cpu
        busy.append(per)


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides, and ends us


def stop(pool: ProcessPoolExecutor):
    """End the pool's processes now (an interrupt: their current tasks are lost)."""
    for proc in list((pool._processes or {}).values()):
        proc.terminate()
    # A process ended while sending its result leaves half a message in the result
    # pipe, and the pool's manager thread would wait forever for the rest: this
    # process holds the pipe's write end too. Closed here, the read ends at EOF
    # once the dead processes' ends are gone, and the pool shuts down as broken.
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
        writer.close()
    pool.shutdown(wait=True, cancel_futures=True)


_caches: dict[str, object] = {}


def _cache(path: str):
    from .cache import CompileCache

    if path not in _caches:
        _caches[path] = CompileCache(Path(path))
    return _caches[path]


def _lower_units(path: str, work: list[tuple[int, Graph, list, list[int]]],
                 config: NPUConfig) -> tuple[dict[int, int], list]:
    """In a pool process: lower the given units of each plan; returns how many per
    job and the cache entries for the parent to write (the processes only read the
    file)."""
    from .cache import digests_remembered

    cache = _cache(path)
    cache.hold_writes()
    store = cache.unit_store(config)
    lowered: dict[int, int] = {}
    with digests_remembered():
        for job, graph, plan, ids in work:
            planner = plan_units(graph, config, plan)
            for u, taken in planner.units:
                if u.id not in ids:
                    continue
                names = [n.name for n in u.nodes]
                context = planner.context(u, taken)
                try:
                    if store.get(graph, names, context) is not None:
                        continue  # another process was first
                except CompileError:
                    continue
                try:
                    code = planner.lower(u, taken)
                except CompileError as err:
                    store.put(graph, names, context, err)
                else:
                    store.put(graph, names, context, code)
                lowered[job] = lowered.get(job, 0) + 1
    return lowered, cache.take_held()


def _link_plans(path: str, jobs: list[tuple[Graph, list]], config: NPUConfig
                ) -> tuple[list[Outcome], list]:
    """In a pool process: compile each plan through the cache at ``path`` (lowering the
    units it lacks, then linking); returns the outcomes and the cache entries for the
    parent to write."""
    from .cache import digests_remembered

    cache = _cache(path)
    cache.hold_writes()
    out = []
    with digests_remembered():
        for graph, plan in jobs:
            out.append(compile_one(cache, graph, plan, config))
    return out, cache.take_held()


def compile_one(cache, graph: Graph, plan: list, config: NPUConfig) -> Outcome:
    """Compile one plan through ``cache``: what happened."""
    compiles, units = cache.compiles, cache.unit_compiles
    try:
        _, hit = cache.get_or_compile(graph, plan, config)
    except CompileError as err:
        return Outcome("refused", str(err), cache.compiles > compiles,
                       cache.unit_compiles - units)
    return Outcome("hit" if hit else "compiled", units=cache.unit_compiles - units)
