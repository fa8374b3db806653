"""The adaptive runtime: profile, fuse, compile, hot-swap, validate, de-fuse.

:class:`AdaptiveRuntime` serves a model on one NPU and re-plans it while it runs
(docs/runtime.md). Its parts: :mod:`.profiler` (execution traces, chain counts,
observed dependency graph), :mod:`.units` (the dynamic compilation graph),
:mod:`.fusion` (candidate scoring and refusals), :mod:`.cache` (compiled plans,
persistent across processes), :mod:`.specialize` (guarded specialized variants).
"""

from .engine import AdaptiveConfig, AdaptiveInference, AdaptiveRuntime, RuntimeEvent

__all__ = ["AdaptiveConfig", "AdaptiveInference", "AdaptiveRuntime", "RuntimeEvent"]
