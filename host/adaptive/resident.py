"""Which program the NPU holds: the generic plan's or a variant's."""

from __future__ import annotations

from ..compiler import CompiledModel
from ..driver import NPUDriver
from ..runtime import Session


class ResidentProgram:
    """The program in the NPU's active instruction bank, and the switch between
    the generic plan's session and a batch variant's.

    A switch rewrites the instruction bank, and the constants too when the two
    programs' differ (a variant's constants sit at the generic session's
    ``const_base``; its activations in the generic session's arena). A variant
    compiled around the generic plan's constants
    (:class:`~host.compiler.compile.SharedConsts`) writes only its own blobs, and
    neither switch invalidates the tags.

    Parameters
    ----------
    driver : the NPU.
    generic : the session of the generic plan (one input per run).
    """

    def __init__(self, driver: NPUDriver, generic: Session):
        self.driver, self.generic = driver, generic
        self.model: CompiledModel | None = None  # None until the first load
        self._variant: Session | None = None
        self._shared = False  # the resident variant shares the generic's constants
        self._tail: tuple | None = None  # (offset, bytes) of the shared blobs written

    def generic_installed(self) -> None:
        """Note that the generic session put its plan on the NPU itself (a load, a
        swap, a rollback)."""
        self.model = self.generic.model

    def to_generic(self) -> None:
        """Put the generic plan back on the NPU after a batch variant ran."""
        plan = self.generic.model
        if self.model is plan:
            return
        if self._shared:
            self.generic.install(plan)
        elif self.model is not None and self.model.const_image() != plan.const_image():
            self.generic.load()
        else:
            self.generic.install(plan)
        self.model, self._shared = plan, False

    def to_variant(self, model: CompiledModel, tail_at: int | None = None) -> Session:
        """Put a variant's program on the NPU; the session that runs it. ``tail_at``:
        the variant shares the generic plan's constants, its own blobs start there."""
        if self.model is not model:
            self._variant = Session(self.driver, model, check=False,
                                    const_base=self.generic.const_base,
                                    arena_base=self.generic.arena_base)
            shared = tail_at is not None and self.model is self.generic.model
            if shared:
                tail = tuple((b.dram, b.data) for b in model.place.blobs.values()
                             if b.dram >= tail_at)
                fresh = tail != self._tail
                if fresh:  # a tag may name a tail address whose bytes change now
                    for dram, data in tail:
                        self.driver.write_mem(self.generic.const_base + dram, data)
                    self._tail = tail
                self._variant.install(model, invalidate_tags=fresh)
            elif model.const_image() != self.generic.model.const_image():
                self._variant.load()
            else:
                self._variant.install(model)
            if not shared:
                self._tail = None  # the tail region was overwritten or never written
            self.model, self._shared = model, shared
        return self._variant
