"""A plan change's way through the adaptive runtime, one change at a time.

The runtime is always in one of these states (:class:`PlanState`):

* ``SERVING``: no change under way; the plan runs, and a decision may plan one.
* ``COMPILING``: a change is planned and compiles (in the worker thread, or
  inline with ``async_compile=False``, where it leaves this state at once).
* ``READY``: it compiled; the next inference stages it.
* ``STAGED``: it is in the shadow instruction bank and lands at the run
  boundary (a plan with other constants is installed between runs instead:
  staged and landed at once).
* ``VALIDATING``: it landed; its first ``validate_runs`` inferences are
  compared with the reference.

The moves between them are the table :data:`MOVES`, and nothing else::

    SERVING --plan--> COMPILING --compiled--> READY --stage--> STAGED
    STAGED --land--> VALIDATING --validated--> SERVING
    COMPILING --refused--> SERVING       (it does not compile, or gains nothing)
    STAGED --trust--> SERVING            (validate_runs == 0)
    VALIDATING --rollback--> SERVING     (a mismatch: the previous plan is back)
"""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass

from ..compiler import CompiledModel
from ..ir import Graph, Subgraph
from .speculate import Bet
from .units import Unit


class PlanState(enum.Enum):
    """Where the runtime's plan change is (see the module text)."""

    SERVING = "serving"
    COMPILING = "compiling"
    READY = "ready"
    STAGED = "staged"
    VALIDATING = "validating"


class ChangeKind(enum.Enum):
    """What a plan change does to the plan, and the events it is reported by."""

    MERGE = "merge"
    SPECULATE = "speculate"
    SPLIT = "split"
    SPECIALIZE = "variant"  # a unit's variant (host.adaptive.specialize_units)

    @property
    def planned_event(self) -> str:
        """``fuse-planned``, ``speculate-planned``, ``defuse-planned`` or
        ``specialize-planned``."""
        verb = {"merge": "fuse", "speculate": "speculate", "split": "defuse",
                "variant": "specialize"}[self.value]
        return f"{verb}-planned"

    @property
    def validated_event(self) -> str:
        """``merge-validated``, ``speculate-validated``, ``split-validated`` or
        ``variant-validated``."""
        return f"{self.value}-validated"


MOVES: dict[tuple[PlanState, str], PlanState] = {
    (PlanState.SERVING, "plan"): PlanState.COMPILING,
    (PlanState.COMPILING, "compiled"): PlanState.READY,
    (PlanState.COMPILING, "refused"): PlanState.SERVING,
    (PlanState.READY, "stage"): PlanState.STAGED,
    (PlanState.STAGED, "land"): PlanState.VALIDATING,
    (PlanState.STAGED, "trust"): PlanState.SERVING,
    (PlanState.VALIDATING, "validated"): PlanState.SERVING,
    (PlanState.VALIDATING, "rollback"): PlanState.SERVING,
}
"""(state, event) -> next state: every move a plan change can make."""


@dataclass
class PlanChange:
    """One change of the plan, from its decision to its landing.

    Members
    -------
    kind : merge, speculative merge, split or specialization.
    unit : the unit it makes (merge, bet), splits or specializes.
    plan : the new plan's units.
    reason : why it was decided (the planned event's detail).
    graph : the graph the plan compiles (None: the current plan's).
    bet : a speculative merge's wager.
    future : the worker thread's compile (None: compiled inline, or collected).
    model : the compiled plan, once compiled.
    hit : whether it came from the compile cache.
    variants : the new plan's unit variants (None: the current plan's, for its units).
    event : the planned event's name (empty: the kind's).
    """

    kind: ChangeKind
    unit: Unit
    plan: list[Subgraph]
    reason: str
    graph: Graph | None = None
    bet: Bet | None = None
    future: Future | None = None
    model: CompiledModel | None = None
    hit: bool = False
    variants: dict | None = None
    event: str = ""

    def compile_finished(self) -> bool:
        """Whether its compile is over (its result may not be collected yet)."""
        return self.future is None or self.future.done()


@dataclass
class Validation:
    """A landed change under shadow validation.

    Members
    -------
    change : the change that landed.
    previous : the plan it replaced (what a rollback installs again).
    left : inferences still to compare with the reference.
    bet : the bet running before the change (restored by a rollback).
    """

    change: PlanChange
    previous: CompiledModel
    left: int
    bet: Bet | None = None


class PlanChanges:
    """The runtime's plan change and its :class:`PlanState`; the methods are the
    moves of :data:`MOVES` and raise ``RuntimeError`` for any other."""

    def __init__(self):
        self.state = PlanState.SERVING
        self.change: PlanChange | None = None  # planned, until it lands or is refused
        self.validation: Validation | None = None  # while VALIDATING

    def _move(self, event: str) -> None:
        try:
            self.state = MOVES[self.state, event]
        except KeyError:
            raise RuntimeError(f"a plan change cannot {event} while "
                               f"{self.state.value}") from None

    def plan(self, change: PlanChange) -> None:
        """A decision: ``change`` starts compiling."""
        self._move("plan")
        self.change = change

    def compiled(self) -> None:
        """The change compiled and waits to be staged."""
        self._move("compiled")

    def refused(self) -> None:
        """The change does not compile, or is not worth landing: dropped."""
        self._move("refused")
        self.change = None

    def stage(self) -> None:
        """The change is written to the shadow bank (or installed between runs)."""
        self._move("stage")

    def land(self, validation: Validation | None) -> None:
        """The change is the running plan; ``validation`` checks it (None: trusted)."""
        self._move("land" if validation is not None else "trust")
        self.change, self.validation = None, validation

    def validated(self) -> Validation:
        """Its validation runs all equal the reference: the change is trusted."""
        self._move("validated")
        v, self.validation = self.validation, None
        return v

    def rolled_back(self) -> Validation:
        """A validation run did not equal the reference: the previous plan is back."""
        self._move("rollback")
        v, self.validation = self.validation, None
        return v

    def waiting_to_land(self) -> bool:
        """Whether a change has finished compiling and not yet passed validation
        (it lands, and is validated, only on runs of the generic plan)."""
        if self.state is PlanState.COMPILING:
            return self.change.compile_finished()
        return self.state in (PlanState.READY, PlanState.STAGED, PlanState.VALIDATING)

    def planned(self, kind: ChangeKind) -> bool:
        """Whether a change of ``kind`` is planned and has not landed yet."""
        return self.change is not None and self.change.kind is kind
