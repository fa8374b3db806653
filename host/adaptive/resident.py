"""Which program the NPU holds: the generic plan's or a batch variant's."""

from __future__ import annotations

from ..compiler import CompiledModel
from ..driver import NPUDriver
from ..runtime import Session


class ResidentProgram:
    """The program in the NPU's active instruction bank, and the switch between
    the generic plan's session and a batch variant's.

    A switch rewrites the instruction bank, and the constants too when the two
    programs' differ (a variant's constants sit at the generic session's
    ``const_base``; its activations in the generic session's arena).

    Parameters
    ----------
    driver : the NPU.
    generic : the session of the generic plan (one input per run).
    """

    def __init__(self, driver: NPUDriver, generic: Session):
        self.driver, self.generic = driver, generic
        self.model: CompiledModel | None = None  # None until the first load
        self._variant: Session | None = None

    def generic_installed(self) -> None:
        """Note that the generic session put its plan on the NPU itself (a load, a
        swap, a rollback)."""
        self.model = self.generic.model

    def to_generic(self) -> None:
        """Put the generic plan back on the NPU after a batch variant ran."""
        plan = self.generic.model
        if self.model is plan:
            return
        if self.model is not None and self.model.const_image() != plan.const_image():
            self.generic.load()
        else:
            self.generic.install(plan)
        self.model = plan

    def to_variant(self, model: CompiledModel) -> Session:
        """Put a batch variant's program on the NPU; the session that runs it."""
        if self.model is not model:
            self._variant = Session(self.driver, model, check=False,
                                    const_base=self.generic.const_base,
                                    arena_base=self.generic.arena_base)
            if model.const_image() != self.generic.model.const_image():
                self._variant.load()
            else:
                self._variant.install(model)
            self.model = model
        return self._variant
