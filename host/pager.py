"""Page a program larger than an instruction bank through the shadow bank.

A paged model (``CompiledModel.pages``, :mod:`host.compiler.pages`) runs as one NPU
run per page. While page i runs on the active bank, the pager writes page i+1 into
the shadow bank (only the words that differ from what the bank holds) with the
partition table, and requests the swap, which lands at the run boundary at no
cycle's cost; the host then starts the next run. The last page of an inference
stages the first one for the next inference, so every inference starts with page 0
active. Two pages stay resident: after the first inference nothing is rewritten.

The shadow bank is then the pager's, so a paged model cannot be hot-swapped
(``Session.stage`` refuses it).
"""

from __future__ import annotations

from .compiler import CompiledModel
from .driver import STATUS_BUSY, DeviceError, NPUDriver


class Pager:
    """The pages of one model on one NPU.

    Members
    -------
    active : the page the active bank holds (None before :meth:`install`).
    runs : page runs so far.
    late : page runs that had ended before the next page was staged (the NPU would
        have waited for the host).
    """

    def __init__(self, driver: NPUDriver, model: CompiledModel):
        if not model.pages:
            raise ValueError("the model fits one instruction bank: it needs no pager")
        self.driver, self.model = driver, model
        self.active: int | None = None
        self.runs = self.late = 0
        self._landing: int | None = None  # the bank the requested swap makes active

    def install(self, version: int, invalidate_tags: bool) -> None:
        """Between runs: page 0 and the partition table into the shadow bank, swapped
        in."""
        self._write(0, version)
        if invalidate_tags:
            self.driver.invalidate_tags()
        self.driver.swap(wait=True)
        self.active = 0

    def bring(self, page: int) -> None:
        """Between runs: make ``page`` active (after an inference that stopped
        part way, whose pages left another one active)."""
        if self.active != page:
            self._write(page, None)
            self.driver.swap(wait=True)
            self.active = page

    def pages_of(self, segment: int) -> list[int]:
        """The pages that run NPU segment ``segment``, in order."""
        return [i for i, p in enumerate(self.model.pages) if p.segment == segment]

    def stage_next(self) -> None:
        """While the active page runs: write the page after it (the first after the
        last) into the shadow bank and request the swap at the run boundary."""
        nxt = (self.active + 1) % len(self.model.pages)
        self._landing = self._write(nxt, None)
        self.driver.swap(wait=False)
        self.runs += 1
        if not self.driver.status() & STATUS_BUSY:
            self.late += 1
        self.active = nxt

    def check_landed(self) -> None:
        """After the run: the staged page is active."""
        if self.driver.active_bank != self._landing:
            raise DeviceError(f"page {self.active} was staged in bank {self._landing}, "
                              f"but bank {self.driver.active_bank} is active after the run")

    def _write(self, page: int, version: int | None) -> int:
        drv = self.driver
        bank = drv.write_program(self.model.page_words(page), version=version,
                                 changed_only=True)
        drv.set_partitions(self.model.partitions, changed_only=True)
        return bank
