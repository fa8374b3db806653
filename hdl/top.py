"""The NPU: every block joined, with the run and swap protocol.

Ports: an AXI4-Lite CSR subordinate (``csr``), an AXI4 manager to DRAM (``axi``)
and an interrupt line (``irq``).

Run and swap protocol
---------------------
* START while idle begins a run on the active bank at pc 0; START while a run is in
  progress is remembered and begins the next run the cycle after the current one
  ends (back-to-back runs, nothing lost or doubled).
* SWAP marks a swap pending. It lands at the next run boundary: immediately when
  idle, otherwise in the cycle the running program finishes, before a remembered
  START begins. A run therefore executes entirely on one bank (never torn), and by
  construction a swap adds no cycle between runs (the swap-stall figure of
  ``make bench-npu`` is not measured yet). The partition tables belong to the banks and
  swap with them. The old bank stays intact: rollback is one more swap.
* The host writes instructions, partition tables and bank versions only into the
  shadow bank; the CSR block refuses and flags writes aimed at the active bank.
"""

from __future__ import annotations

from amaranth.hdl import C, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect

from firmware.config import NPUConfig
from firmware.regs import TRACE_FIELDS

from .accumulator import Accumulator
from .array import GemmEngine
from .axi import axi4_lite_signature, axi4_signature
from .csr import CSRBlock
from .depthwise import DepthwiseEngine
from .dma import DMA
from .imem import InstructionMemory
from .partition import PartitionTable
from .perf import PerfCounters, TraceFIFO
from .ports import sp_window_signature
from .queues import ComputeQueue, LoadQueue, StoreQueue
from .scratchpad import Scratchpad
from .sequencer import NUM_CHECKS, Sequencer
from .tags import TagStore
from .vector import VectorUnit

# Scratchpad port priority (lower wins a bank): compute first, it streams every cycle.
# The weight loader goes before the gemm stream: its k reads are never refused, so a
# wload beside a streaming gemm ends on time and costs the gemm a cycle only for a row
# whose banks one of its reads takes in that cycle (the other way round, a gemm with
# its rows on one bank would hold a wload's read of that bank until it ends).
SP_PORTS = ("wload", "gemm", "vec_a", "vec_b", "vec_wr", "dma_load", "dma_store")
SP_CONFLICT_BITS = 3  # refused scratchpad ports in one cycle: at most len(SP_PORTS)
assert len(SP_PORTS) < 1 << SP_CONFLICT_BITS


def connect_checks(m: Module, seq: Sequencer, pt: PartitionTable) -> None:
    """Wire the sequencer's partition checks through the partition table, against the
    set its ``ptsel`` selected (shared with the per-block timing tool)."""
    m.d.comb += pt.set.eq(seq.pt_set)
    for s, c in zip(seq.chk, pt.checks, strict=True):
        connect(m, s, c)


def share_with_depthwise(m: Module, dw_sel, gemm: GemmEngine, dw: DepthwiseEngine,
                         acc: Accumulator):
    """Give the depthwise engine the GEMM engine's scratchpad port and the
    accumulator's array port: the compute queue never runs the two at once
    (``dw_sel``: the depthwise engine was issued last). Returns the scratchpad
    requester that takes the GEMM engine's place."""
    port = sp_window_signature(gemm.config).create(path=("gemm_dw_sp",))
    use_dw = dw.sp.valid
    m.d.comb += [
        port.valid.eq(gemm.sp.valid | dw.sp.valid),
        port.addr.eq(Mux(use_dw, dw.sp.addr, gemm.sp.addr)),
        port.we.eq(gemm.sp.we & ~use_dw), port.wdata.eq(gemm.sp.wdata),
        port.wstrb.eq(gemm.sp.wstrb),
        gemm.sp.ready.eq(port.ready & ~use_dw), dw.sp.ready.eq(port.ready),
        # each engine takes read data only for its own grants
        gemm.sp.rvalid.eq(port.rvalid), gemm.sp.rdata.eq(port.rdata),
        dw.sp.rvalid.eq(port.rvalid), dw.sp.rdata.eq(port.rdata),
    ]
    a, g, d = acc.array, gemm.acc, dw.acc
    for name in ("ren", "raddr", "wen", "waddr", "wdata", "wmask"):
        m.d.comb += getattr(a, name).eq(Mux(dw_sel, getattr(d, name), getattr(g, name)))
    m.d.comb += [g.rdata.eq(a.rdata), d.rdata.eq(a.rdata)]
    return port


class NPU(wiring.Component):
    """The whole NPU for one :class:`~firmware.config.NPUConfig`.

    Members
    -------
    csr : In(axi4_lite_signature(12, 32))
        Host port (register map: firmware/regs.py, docs/registers.md).
    axi : Out(axi4_signature(32, bus_bytes * 8))
        DRAM port.
    irq : Out(1)
        Interrupt (IRQ_STATUS & IRQ_ENABLE).
    """

    def __init__(self, config: NPUConfig | None = None):
        self.config = config = config or NPUConfig()
        super().__init__({
            "csr": In(axi4_lite_signature(12, 32)),
            "axi": Out(axi4_signature(32, config.bus_bytes * 8)),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        sub = m.submodules
        sub.csr = csr = CSRBlock(cfg)
        sub.imem = imem = InstructionMemory(cfg)
        sub.seq = seq = Sequencer(cfg)
        sub.lq = lq = LoadQueue(cfg)
        sub.cq = cq = ComputeQueue(cfg)
        sub.sq = sq = StoreQueue(cfg)
        sub.pt = pt = PartitionTable(cfg, checks=NUM_CHECKS)
        sub.tags = tags = TagStore(cfg)
        sub.sp = sp = Scratchpad(cfg, ports=len(SP_PORTS))
        sub.acc = acc = Accumulator(cfg)
        sub.gemm = gemm = GemmEngine(cfg)
        sub.vec = vec = VectorUnit(cfg)
        dw = None
        if cfg.dw_rows:
            sub.dw = dw = DepthwiseEngine(cfg)
        sub.dma = dma = DMA(cfg)
        sub.perf = perf = PerfCounters(cfg, widths={"sp_conflicts": SP_CONFLICT_BITS})
        sub.trace = trace = TraceFIFO(cfg)

        connect(m, wiring.flipped(self.csr), csr.bus)
        connect(m, dma.axi, wiring.flipped(self.axi))
        m.d.comb += self.irq.eq(csr.irq)

        # ---- run and swap protocol ---------------------------------------------------
        active_bank = Signal()
        swap_pending = Signal()
        start_pending = Signal()
        seq_idle = ~seq.busy & ~seq.done
        start_req = csr.start | start_pending
        boundary = ~seq.busy  # idle, or the cycle the run finishes
        do_swap = boundary & (swap_pending | csr.swap)
        do_start = start_req & seq_idle & ~do_swap
        m.d.comb += seq.start.eq(do_start)
        with m.If(do_swap):
            m.d.sync += [active_bank.eq(~active_bank), swap_pending.eq(0)]
        with m.Elif(csr.swap):
            m.d.sync += swap_pending.eq(1)
        m.d.sync += start_pending.eq(start_req & ~do_start)

        m.d.comb += [
            csr.busy.eq(seq.busy | start_req),
            csr.active_bank.eq(active_bank),
            csr.swap_pending.eq(swap_pending),
            csr.error.eq(seq.error_code != 0),
            csr.error_code.eq(seq.error_code),
            csr.error_pc.eq(seq.error_pc),
            csr.error_addr.eq(seq.error_addr),
            csr.run_done.eq(seq.done),
            csr.run_error.eq(seq.done & seq.ev_error),
            csr.trace_overflow.eq(trace.overflow),
            seq.cycle_budget.eq(csr.cycle_budget),
        ]
        for i in range(7):
            m.d.comb += seq.args[i].eq(csr.args[i])
        for i in range(16):
            m.d.comb += csr.regs[i].eq(seq.regs[i])

        # ---- instruction memory and partition table ------------------------------------
        m.d.comb += [
            imem.w_en.eq(csr.imem_we), imem.w_bank.eq(csr.imem_bank),
            imem.w_index.eq(csr.imem_index), imem.w_data.eq(csr.imem_data),
            imem.r_en.eq(seq.imem_en), imem.r_index.eq(seq.imem_addr),
            # A swap in the start cycle is impossible (do_start excludes it), so the
            # bank the first fetch reads is the bank the whole run uses.
            imem.r_bank.eq(active_bank),
            seq.imem_data.eq(imem.r_data), seq.imem_pre.eq(imem.r_pre),
            pt.w_en.eq(csr.pt_we), pt.w_bank.eq(csr.pt_bank), pt.w_set.eq(csr.pt_set),
            pt.w_part.eq(csr.pt_part), pt.w_base.eq(csr.pt_base), pt.w_size.eq(csr.pt_size),
            pt.r_bank.eq(csr.pt_rd_bank), pt.r_set.eq(csr.pt_rd_set),
            pt.r_part.eq(csr.pt_rd_part),
            csr.pt_rd_base.eq(pt.r_base), csr.pt_rd_size.eq(pt.r_size),
            pt.bank.eq(active_bank),
        ]
        connect_checks(m, seq, pt)

        # ---- tags ---------------------------------------------------------------------------
        # Sets and invalidations reach the tag store a cycle late: they come from the DMA's
        # completion through the load queue, and from the sequencer's fire, and straight
        # into the valid bits they would be the FPGA build's critical path. The lookup
        # sees a late update in its own cycle (the store's lookup counts that cycle's
        # updates), and none is later than that: a load's set lands as its queue takes
        # the next entry, a tinv (which waits for the load queue to idle) cycles before the
        # next load can be taken, and a miss's invalidation while its transfer runs.
        m.d.comb += [
            tags.q_slot.eq(lq.tag_slot), tags.q_key.eq(lq.tag_key), lq.tag_hit.eq(tags.q_hit),
        ]
        m.d.sync += [
            tags.set_en.eq(lq.tag_set_en), tags.set_slot.eq(lq.tag_set_slot),
            tags.set_key.eq(lq.tag_set_key),
            tags.inv_en.eq(lq.tag_inv_en | seq.tinv_en),
            tags.inv_slot.eq(Mux(seq.tinv_en, seq.tinv_slot, lq.tag_inv_slot)),
            tags.inv_all.eq(csr.tag_invalidate),
        ]

        # ---- queues ---------------------------------------------------------------------------
        connect(m, seq.load, lq.entry)
        connect(m, seq.compute, cq.entry)
        connect(m, seq.store, sq.entry)
        for q in (lq, cq, sq):
            m.d.comb += [q.run_start.eq(seq.run_start), q.flush.eq(seq.flush)]
        m.d.comb += [
            seq.load_idle.eq(lq.idle), seq.compute_idle.eq(cq.idle),
            seq.store_idle.eq(sq.idle),
            seq.rd_we.eq(cq.rd_we), seq.rd_index.eq(cq.rd_index), seq.rd_value.eq(cq.rd_value),
            seq.queue_error.eq(lq.read_error | sq.write_error),
            seq.queue_error_pc.eq(Mux(lq.read_error, lq.error_pc, sq.error_pc)),
            seq.queue_error_addr.eq(Mux(lq.read_error, lq.error_addr, sq.error_addr)),
            # tokens
            cq.tok_in_load.eq(lq.tok_out), lq.tok_in.eq(cq.tok_out_load),
            sq.tok_in.eq(cq.tok_out_store), cq.tok_in_store.eq(sq.tok_out),
        ]

        # ---- engines -----------------------------------------------------------------------------
        connect(m, lq.dma_cmd, dma.load_cmd)
        connect(m, dma.load_done, lq.dma_done)
        connect(m, sq.dma_cmd, dma.store_cmd)
        connect(m, dma.store_done, sq.dma_done)
        connect(m, cq.arr_cmd, gemm.cmd)
        connect(m, cq.vec_cmd, vec.cmd)
        connect(m, vec.acc, acc.vector)
        gemm_sp = gemm.sp
        if dw is None:
            connect(m, gemm.acc, acc.array)
        else:
            connect(m, cq.dw_cmd, dw.cmd)
            m.d.comb += [cq.dw_done.eq(dw.done), cq.dw_idle.eq(dw.idle)]
            gemm_sp = share_with_depthwise(m, cq.dw_sel, gemm, dw, acc)
        m.d.comb += [
            acc.sel.eq(cq.acc_sel),
            cq.arr_wload_done.eq(gemm.wload_done), cq.arr_gemm_done.eq(gemm.gemm_done),
            cq.arr_idle.eq(gemm.idle),
            cq.vec_done.eq(vec.done), cq.vec_idle.eq(vec.idle),
            cq.vec_result.eq(vec.result), cq.vec_result_valid.eq(vec.result_valid),
            vec.run_start.eq(seq.run_start),
        ]
        requesters = {"wload": gemm.wsp, "gemm": gemm_sp, "vec_a": vec.rd_a, "vec_b": vec.rd_b,
                      "vec_wr": vec.wr, "dma_load": dma.load_sp, "dma_store": dma.store_sp}
        for i, name in enumerate(SP_PORTS):
            connect(m, requesters[name], sp.ports[i])

        # ---- counters and trace ------------------------------------------------------------------
        macs = gemm.macs if dw is None else gemm.macs + dw.macs  # never both at once
        busy_array = gemm.busy if dw is None else gemm.busy | dw.busy
        # Port-cycles refused by the scratchpad's bank arbitration (requests wait
        # there for nothing else).
        sp_conflicts = sum((p.valid & ~p.ready for p in sp.ports), start=C(0, SP_CONFLICT_BITS))
        axi = dma.axi
        m.d.comb += [
            seq.ev_macs.eq(macs), seq.ev_read_bytes.eq(dma.read_bytes),
            seq.ev_write_bytes.eq(dma.write_bytes),
            seq.ev_hit.eq(lq.hit), seq.ev_miss.eq(lq.miss),
            seq.ev_busy_load.eq(lq.busy), seq.ev_busy_store.eq(sq.busy),
            seq.ev_busy_array.eq(busy_array), seq.ev_busy_vector.eq(vec.busy),
            seq.ev_sp_conflicts.eq(sp_conflicts),
            trace.push.valid.eq(seq.trace_valid),
            trace.pop.eq(csr.trace_pop), trace.clear.eq(csr.trace_clear),
            csr.trace_count.eq(trace.count), csr.trace_head.eq(trace.head),
            perf.reset.eq(csr.counter_reset),
        ]
        for i, name in enumerate(TRACE_FIELDS):
            m.d.comb += trace.push.payload[name].eq(seq.trace_record[i])
        inc = perf.inc
        events = {
            "cycles": seq.busy, "instructions": seq.ev_instr, "macs": macs,
            "dram_read_bytes": dma.read_bytes, "dram_write_bytes": dma.write_bytes,
            "regions": seq.ev_region, "misspeculations": seq.ev_misspec,
            "runs": seq.ev_run, "errors": seq.done & seq.ev_error, "swaps": do_swap,
            "trace_overflows": trace.overflow,
            "busy_load": lq.busy, "busy_compute": cq.busy, "busy_store": sq.busy,
            "stall_cycles": seq.ev_stall,
            "busy_array": busy_array, "busy_vector": vec.busy,
            "stall_in_seq": seq.ev_stall & ~seq.ev_stall_room,
            "stall_out_seq": seq.ev_stall_room,
            "stall_in_load": dma.load_stall, "stall_out_load": lq.wait_token,
            "stall_in_array": cq.wait_load & ~cq.head_vector,
            "stall_out_array": cq.wait_store & ~cq.head_vector,
            "stall_in_vector": cq.wait_load & cq.head_vector,
            "stall_out_vector": cq.wait_store & cq.head_vector,
            "stall_in_store": sq.wait_token, "stall_out_store": dma.store_stall,
            "sp_conflicts": sp_conflicts,
            "dram_read_bursts": axi.arvalid & axi.arready,
            "dram_write_bursts": axi.awvalid & axi.awready,
        }
        for name, ev in events.items():
            m.d.comb += inc[name].eq(ev)
        for p in range(cfg.partitions):
            m.d.comb += [
                inc[f"tag_hits_p{p}"].eq(lq.hit & (lq.part == p)),
                inc[f"tag_misses_p{p}"].eq(lq.miss & (lq.part == p)),
            ]
        for i in range(len(perf.values)):
            m.d.comb += csr.counters[i].eq(perf.values[i])
        return m
