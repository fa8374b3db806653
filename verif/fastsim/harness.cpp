// The NPU's Verilator model in a plain C++ loop, behind a C ABI (loaded by
// host/verilator_device.py with ctypes).
//
// The host reaches the NPU as it would a board: CSR reads and writes over the
// AXI4-Lite port, and DRAM that the NPU reads and writes over its AXI4 master port.
// DRAM here is a byte array served by a C++ model of cocotbext-axi's AxiRam with the
// same handshake timing, cycle for cycle, so a run takes as many NPU cycles as under
// cocotb (checked by tests/test_fastsim.py). The host writes and reads that array
// directly (as a CPU shares memory with an accelerator); the NPU only through its DMA.
// Between host calls nothing runs; within a call the clock runs without leaving C++.
//
// Timing model (cocotb 2 with Verilator): a testbench coroutine woken by a rising
// edge sees the values from just before the edge, and its writes land after it. The
// channel models run first at each edge (sinks capture and set READY, sources present
// the next beat), then the burst processes that their queues woke; a beat queued by
// a process is presented at the next edge at the earliest. Queues hold two entries.
//
// DRAM latency (npusim_set_dram_latency; verif.rtl_device.delay_answers under cocotb):
// the read process queues a burst's first beat no earlier than `read` cycles after
// it took the burst up, and the write process queues a burst's response no earlier
// than `write` cycles after its last beat; each serves one burst at a time.

#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <type_traits>
#include <vector>

#include "Vnpu.h"
#include "Vnpu___024root.h"
#include "verilated.h"

#define CSR(name) top->csr___05F##name
#define AXI(name) top->axi___05F##name

namespace {

constexpr int QUEUE_LIMIT = 2;  // cocotbext-axi's queue_occupancy_limit on every channel
constexpr int RESP_OKAY = 0;
constexpr int NO_ANSWER = -1;        // a CSR access the NPU did not complete in time
constexpr uint64_t CSR_PATIENCE = 100000;  // cycles; an access takes a handful

// ---- bus words of any width (Verilator: integers up to 64 bits, VlWide above) ------------
template <typename T>
void word_to_bytes(const T& port, uint8_t* out, int n) {
    if constexpr (std::is_integral_v<T>) {
        uint64_t v = port;
        for (int i = 0; i < n; ++i) out[i] = uint8_t(v >> (8 * i));
    } else {
        for (int i = 0; i < n; ++i) out[i] = uint8_t(port[i / 4] >> (8 * (i % 4)));
    }
}

template <typename T>
void bytes_to_word(T& port, const uint8_t* in, int n) {
    if constexpr (std::is_integral_v<T>) {
        uint64_t v = 0;
        for (int i = 0; i < n; ++i) v |= uint64_t(in[i]) << (8 * i);
        port = T(v);
    } else {
        for (int w = 0; w < (n + 3) / 4; ++w) {
            uint32_t v = 0;
            for (int b = 0; b < 4 && 4 * w + b < n; ++b) v |= uint32_t(in[4 * w + b]) << (8 * b);
            port[w] = v;
        }
    }
}

// Whether the model exposes the clock's edge detector (Verilator 5's generated
// `__Vtrigprevexpr___TOP__clk__0`). With it, a cycle whose inputs did not change
// skips the falling-edge eval: the model's outputs are already those of the new
// state and the same inputs, and only the detector needs to see the clock low.
template <typename R, typename = void>
struct HasClockDetector : std::false_type {};
template <typename R>
struct HasClockDetector<R, std::void_t<decltype(std::declval<R&>().__Vtrigprevexpr___TOP__clk__0)>>
    : std::true_type {};

}  // namespace

// Verilator 5's eval() runs the input-combinational logic ("ico") first, every time,
// whether an input changed or not. The rising edge comes after an eval that already
// settled the current inputs, so the harness runs only the edge's own phases there
// (the loop of the generated `_eval` without its ico phase), through these
// functions of the generated model. They are weak references: a Verilator that names
// them differently leaves them null and the harness calls eval() instead.
bool Vnpu___024root___eval_phase__act(Vnpu___024root*) __attribute__((weak));
bool Vnpu___024root___eval_phase__nba(Vnpu___024root*) __attribute__((weak));

namespace {

template <typename T, typename V>
bool assign(T& port, V value) {  // set an input; whether it changed
    if (port == T(value)) return false;
    port = T(value);
    return true;
}

template <typename T>
bool assign_bytes(T& port, const uint8_t* in, int n) {
    T before = port;
    bytes_to_word(port, in, n);
    if constexpr (std::is_integral_v<T>) {
        return before != port;
    } else {
        return std::memcmp(&before, &port, sizeof(T)) != 0;
    }
}

// A seeded pause pattern per channel (splitmix64): paused on `percent` % of the cycles.
struct Pauses {
    uint64_t state = 0;
    uint32_t percent = 0;
    bool next() {
        if (!percent) return false;
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return (z % 100) < percent;
    }
};

struct Fault {
    uint64_t lo, hi;
    int resp;
};

struct Addr {  // an AR or AW beat
    uint32_t id, addr, len, size, burst;
};

struct RBeat {
    uint32_t id;
    int resp;
    bool last;
    std::vector<uint8_t> data;
};

struct BBeat {
    uint32_t id;
    int resp;
};

struct WBeat {
    std::vector<uint8_t> data;
    uint64_t strb;
    bool last;
};

// The cursor of one burst (INCR, FIXED or WRAP), as cocotbext-axi steps it.
struct Burst {
    bool active = false;
    Addr a{};
    uint32_t beat = 0, cur = 0, lower = 0, upper = 0;
    int resp = RESP_OKAY;
    void start(const Addr& x) {
        a = x;
        active = true;
        beat = 0;
        resp = RESP_OKAY;
        uint32_t n = 1u << x.size;
        cur = x.addr / n * n;
        uint32_t total = n * (x.len + 1);
        lower = x.addr / total * total;
        upper = lower + total;
    }
    void step() {
        ++beat;
        if (a.burst != 0) {  // not FIXED
            cur += 1u << a.size;
            if (a.burst == 2 && cur == upper) cur = lower;
        }
    }
    bool done() const { return beat > a.len; }
};

}  // namespace

struct NpuSim {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vnpu> top;
    std::vector<uint8_t> dram;
    int lanes = 0;
    uint64_t cycle = 0;
    std::vector<Fault> faults;
    Pauses pause_ar, pause_r, pause_aw, pause_w, pause_b;
    bool pause_ar_now = false, pause_aw_now = false, pause_w_now = false;

    // read side: AR sink, R source, read process
    std::deque<Addr> ar_q;
    std::deque<RBeat> r_q;
    Burst rd;
    uint64_t rd_ready = 0;  // the cycle from which the burst's beats may be queued
    // write side: AW sink, W sink, B source, write process
    std::deque<Addr> aw_q;
    std::deque<WBeat> w_q;
    std::deque<BBeat> b_q;
    Burst wr;
    bool wr_b_pending = false;  // the burst's last beat is in, its response not queued
    uint64_t wr_b_ready = 0;  // the cycle from which that response may be queued
    uint32_t read_latency = 0, write_latency = 0;  // extra DRAM cycles (see the top)

    // what the testbench drives (applied after each edge)
    bool arready = false, rvalid = false, awready = false, wready = false, bvalid = false;
    RBeat r_cur;
    BBeat b_cur{};

    // the CSR master: one transaction at a time
    bool c_aw = false, c_w = false, c_b = false, c_ar = false, c_r = false;
    uint32_t c_addr = 0, c_data = 0;
    int c_resp = 0;

    // run watching: rising edges of the sequencer's run_start and done
    bool watching = false, last_start = false, last_done = false;
    std::vector<uint64_t> ev_cycle;
    std::vector<uint8_t> ev_kind;

    NpuSim(uint64_t dram_bytes) : ctx(new VerilatedContext), dram(dram_bytes, 0) {
        ctx->quiet(true);
        top.reset(new Vnpu(ctx.get(), "npu"));
        lanes = int(sizeof(AXI(rdata)));  // QData, IData or VlWide: the bus width
        r_cur.data.assign(lanes, 0);
        drive();
        top->clk = 0;
        top->rst = 1;
        top->eval();
        for (int i = 0; i < 5; ++i) tick();
        top->rst = 0;
        top->eval();  // every input change is evaluated before the next edge
        for (int i = 0; i < 2; ++i) tick();
    }

    int fault_at(uint64_t addr, uint64_t size) const {
        for (const Fault& f : faults)
            if (addr < f.hi && f.lo < addr + size) return f.resp;
        return RESP_OKAY;
    }

    // Apply what the testbench drives; whether any input changed.
    bool drive() {
        bool changed = false;
        changed |= assign(AXI(arready), arready);
        changed |= assign(AXI(awready), awready);
        changed |= assign(AXI(wready), wready);
        changed |= assign(AXI(rvalid), rvalid);
        changed |= assign(AXI(rid), r_cur.id);
        changed |= assign(AXI(rresp), r_cur.resp);
        changed |= assign(AXI(rlast), r_cur.last);
        changed |= assign_bytes(AXI(rdata), r_cur.data.data(), lanes);
        changed |= assign(AXI(bvalid), bvalid);
        changed |= assign(AXI(bid), b_cur.id);
        changed |= assign(AXI(bresp), b_cur.resp);
        changed |= assign(CSR(awvalid), c_aw);
        changed |= assign(CSR(awaddr), c_addr);
        changed |= assign(CSR(awprot), 0);
        changed |= assign(CSR(wvalid), c_w);
        changed |= assign(CSR(wdata), c_data);
        changed |= assign(CSR(wstrb), 0xF);
        changed |= assign(CSR(bready), c_b);
        changed |= assign(CSR(arvalid), c_ar);
        changed |= assign(CSR(araddr), c_addr);
        changed |= assign(CSR(arprot), 0);
        changed |= assign(CSR(rready), c_r);
        return changed;
    }

    // One clock cycle: the testbench reacts to the values before the edge, the NPU
    // takes the edge, then the testbench's new values are applied.
    void tick() {
        if (!top->rst) testbench();
        rising_edge();
        bool changed = drive();
        top->clk = 0;
        if constexpr (HasClockDetector<Vnpu___024root>::value) {
            if (changed)
                top->eval();
            else
                top->rootp->__Vtrigprevexpr___TOP__clk__0 = 0;
        } else {
            top->eval();
        }
        if (watching) watch();
        ++cycle;
    }

    // The inputs are those of the last eval (drive() and the CSR calls evaluate what
    // they change), so only the edge's phases need to run.
    void rising_edge() {
        top->clk = 1;
        if (!Vnpu___024root___eval_phase__act || !Vnpu___024root___eval_phase__nba) {
            top->eval();
            return;
        }
        Vnpu___024root* root = top->rootp;
        do {
            while (Vnpu___024root___eval_phase__act(root)) {
            }
        } while (Vnpu___024root___eval_phase__nba(root));
    }

    void watch() {
        bool s = top->rootp->npu__DOT__run_start, d = top->rootp->npu__DOT__done;
        if (s && !last_start) { ev_cycle.push_back(cycle); ev_kind.push_back(0); }
        if (d && !last_done) { ev_cycle.push_back(cycle); ev_kind.push_back(1); }
        last_start = s;
        last_done = d;
    }

    void testbench() {
        // channel models (their order within an edge does not matter: they meet only
        // through the queues, which the processes below serve after them)
        if (arready && AXI(arvalid))
            ar_q.push_back({AXI(arid), AXI(araddr), AXI(arlen), AXI(arsize), AXI(arburst)});
        bool ar_pause = pause_ar_now;
        pause_ar_now = pause_ar.next();
        arready = !(int(ar_q.size()) >= QUEUE_LIMIT || ar_pause);

        if (awready && AXI(awvalid))
            aw_q.push_back({AXI(awid), AXI(awaddr), AXI(awlen), AXI(awsize), AXI(awburst)});
        bool aw_pause = pause_aw_now;
        pause_aw_now = pause_aw.next();
        awready = !(int(aw_q.size()) >= QUEUE_LIMIT || aw_pause);

        if (wready && AXI(wvalid)) {
            WBeat w;
            w.data.resize(lanes);
            word_to_bytes(AXI(wdata), w.data.data(), lanes);
            w.strb = AXI(wstrb);
            w.last = AXI(wlast);
            w_q.push_back(std::move(w));
        }
        bool w_pause = pause_w_now;
        pause_w_now = pause_w.next();
        wready = !(int(w_q.size()) >= QUEUE_LIMIT || w_pause);

        bool r_pause = pause_r.next();
        if ((AXI(rready) && rvalid) || !rvalid) {
            if (!r_q.empty() && !r_pause) {
                r_cur = std::move(r_q.front());
                r_q.pop_front();
                rvalid = true;
            } else {
                rvalid = false;
            }
        }
        bool b_pause = pause_b.next();
        if ((AXI(bready) && bvalid) || !bvalid) {
            if (!b_q.empty() && !b_pause) {
                b_cur = b_q.front();
                b_q.pop_front();
                bvalid = true;
            } else {
                bvalid = false;
            }
        }

        read_process();
        write_process();
        csr_master();
    }

    void read_process() {
        while (true) {
            if (!rd.active || rd.done()) {
                if (ar_q.empty()) { rd.active = false; return; }
                rd.start(ar_q.front());
                ar_q.pop_front();
                rd_ready = cycle + read_latency;
            }
            if (cycle < rd_ready || int(r_q.size()) >= QUEUE_LIMIT) return;
            RBeat r;
            r.id = rd.a.id;
            r.last = rd.beat == rd.a.len;
            uint64_t word = rd.cur / lanes * uint64_t(lanes);
            r.data.assign(lanes, 0);
            r.resp = fault_at(word, lanes);
            if (r.resp == RESP_OKAY) {
                if (word + lanes <= dram.size())
                    std::memcpy(r.data.data(), &dram[word], lanes);
                else
                    r.resp = 2;  // AxiRam: an access outside the memory fails (SLVERR)
            }
            r_q.push_back(std::move(r));
            rd.step();
        }
    }

    void write_process() {
        while (true) {
            if (wr_b_pending) {
                if (cycle < wr_b_ready || int(b_q.size()) >= QUEUE_LIMIT) return;
                b_q.push_back({wr.a.id, wr.resp});
                wr_b_pending = false;
                wr.active = false;
            }
            if (!wr.active) {
                if (aw_q.empty()) return;
                wr.start(aw_q.front());
                aw_q.pop_front();
            }
            if (w_q.empty()) return;
            WBeat w = std::move(w_q.front());
            w_q.pop_front();
            uint64_t word = wr.cur / lanes * uint64_t(lanes);
            // write each run of enabled byte lanes, as cocotbext-axi does
            int i = 0;
            while (i < lanes) {
                if (!((w.strb >> i) & 1)) { ++i; continue; }
                int j = i;
                while (j < lanes && ((w.strb >> j) & 1)) ++j;
                uint64_t at = word + i;
                int resp = fault_at(at, j - i);
                if (resp == RESP_OKAY && at + (j - i) > dram.size()) resp = 2;
                if (resp == RESP_OKAY)
                    std::memcpy(&dram[at], &w.data[i], j - i);
                else if (wr.resp == RESP_OKAY)
                    wr.resp = resp;
                i = j;
            }
            wr.step();
            if (wr.done()) {
                wr_b_pending = true;
                wr_b_ready = cycle + write_latency;
            }
        }
    }

    void csr_master() {
        if (c_aw && CSR(awready)) c_aw = false;
        if (c_w && CSR(wready)) c_w = false;
        if (c_b && CSR(bvalid)) { c_b = false; c_resp = CSR(bresp); }
        if (c_ar && CSR(arready)) c_ar = false;
        if (c_r && CSR(rvalid)) { c_r = false; c_resp = CSR(rresp); c_data = CSR(rdata); }
    }

    int csr_write(uint32_t addr, uint32_t value) {
        c_addr = addr;
        c_data = value;
        c_aw = c_w = c_b = true;
        drive();
        top->eval();
        for (uint64_t i = 0; c_aw || c_w || c_b; ++i) {
            if (i == CSR_PATIENCE) return abandon();
            tick();
        }
        return c_resp;
    }

    int csr_read(uint32_t addr, uint32_t* value) {
        c_addr = addr;
        c_ar = c_r = true;
        drive();
        top->eval();
        for (uint64_t i = 0; c_ar || c_r; ++i) {
            if (i == CSR_PATIENCE) return abandon();
            tick();
        }
        *value = c_data;
        return c_resp;
    }

    int abandon() {  // drop the access (the bus is then in an unknown state)
        c_aw = c_w = c_b = c_ar = c_r = false;
        drive();
        top->eval();
        return NO_ANSWER;
    }
};

extern "C" {

NpuSim* npusim_create(uint64_t dram_bytes) { return new NpuSim(dram_bytes); }

void npusim_destroy(NpuSim* s) {
    if (s) s->top->final();
    delete s;
}

uint64_t npusim_cycle(NpuSim* s) { return s->cycle; }

// CSR accesses answer the AXI response (0 OKAY, 2 SLVERR, 3 DECERR), or -1 when the
// NPU did not complete the handshake within CSR_PATIENCE cycles.
int npusim_csr_read(NpuSim* s, uint32_t addr, uint32_t* value) {
    return s->csr_read(addr, value);
}

// Writes in order; returns the first error response (0: all OKAY), or -1 at once
// when a write got no answer.
int npusim_csr_write_many(NpuSim* s, const uint32_t* addrs, const uint32_t* values, int n) {
    int first = 0;
    for (int i = 0; i < n; ++i) {
        int resp = s->csr_write(addrs[i], values[i]);
        if (resp == NO_ANSWER) return NO_ANSWER;
        if (resp && !first) first = resp;
    }
    return first;
}

int npusim_dram_write(NpuSim* s, uint64_t addr, const uint8_t* data, uint64_t n) {
    if (addr + n > s->dram.size() || addr + n < addr) return -1;
    std::memcpy(&s->dram[addr], data, n);
    return 0;
}

int npusim_dram_read(NpuSim* s, uint64_t addr, uint8_t* out, uint64_t n) {
    if (addr + n > s->dram.size() || addr + n < addr) return -1;
    std::memcpy(out, &s->dram[addr], n);
    return 0;
}

// Run until the interrupt line is high (1) or `timeout` cycles have passed (0).
int npusim_wait_irq(NpuSim* s, uint64_t timeout) {
    if (s->top->irq) return 1;
    for (uint64_t i = 0; i < timeout; ++i) {
        s->tick();
        if (s->top->irq) return 1;
    }
    return 0;
}

void npusim_set_faults(NpuSim* s, const uint64_t* lo, const uint64_t* hi, const int* resp,
                       int n) {
    s->faults.clear();
    for (int i = 0; i < n; ++i) s->faults.push_back({lo[i], hi[i], resp[i]});
}

// Pause every DRAM channel on `percent` % of the cycles, a pattern drawn from `seed`
// (0 % turns it off).
void npusim_set_backpressure(NpuSim* s, uint64_t seed, uint32_t percent) {
    Pauses* all[] = {&s->pause_ar, &s->pause_r, &s->pause_aw, &s->pause_w, &s->pause_b};
    for (int i = 0; i < 5; ++i) {
        all[i]->state = seed * 5 + uint64_t(i);
        all[i]->percent = percent;
    }
}

// Extra DRAM cycles: before each read burst's first beat, before each write response.
void npusim_set_dram_latency(NpuSim* s, uint32_t read, uint32_t write) {
    s->read_latency = read;
    s->write_latency = write;
}

void npusim_watch_runs(NpuSim* s, int on) {
    s->watching = on != 0;
    s->last_start = s->top->rootp->npu__DOT__run_start;
    s->last_done = s->top->rootp->npu__DOT__done;
}

// Copy up to `max` recorded run events (cycle, 0 start / 1 done); returns how many exist.
int npusim_run_events(NpuSim* s, uint64_t* cycles, uint8_t* kinds, int max) {
    int n = int(s->ev_cycle.size());
    for (int i = 0; i < n && i < max; ++i) {
        cycles[i] = s->ev_cycle[i];
        kinds[i] = s->ev_kind[i];
    }
    return n;
}

}  // extern "C"
