"""The adaptive runtime: profile, fuse, compile, hot-swap, validate, de-fuse.

:class:`AdaptiveRuntime` serves a model on one NPU and re-plans it while it runs
(docs/runtime.md). Its parts: :mod:`.profiler` (execution traces, chain counts,
observed dependency graph), :mod:`.units` (the dynamic compilation graph),
:mod:`.fusion` (candidate scoring and refusals), :mod:`.changes` (a plan change's
states and moves), :mod:`.cache` (compiled plans, persistent across processes),
:mod:`.speculate` (bets on a branch), :mod:`.batching` with :mod:`.specialize`
and :mod:`.routed` (batches on guarded variants), :mod:`.resident` (which
program the NPU holds), :mod:`.records` (events, inferences, the stream's log).
"""

from .engine import AdaptiveConfig, AdaptiveInference, AdaptiveRuntime, RuntimeEvent

__all__ = ["AdaptiveConfig", "AdaptiveInference", "AdaptiveRuntime", "RuntimeEvent"]
