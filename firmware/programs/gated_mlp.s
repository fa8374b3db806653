; Gated two-expert MLP for one input vector: a gate layer picks an expert with
; vargmax, a data-dependent branch runs only that expert.
;
;   logits = requant(x @ Wg + bg)          (64 -> 2)      region 1
;   e      = argmax(logits)                 (scalar r11)
;   y      = relu(requant(x @ We + be))     (64 -> 8)      region 2 (e=0) or 3 (e=1)
;
; Arguments: r1 x (64 int8), r2 Wg (64x2 row-major), r3 W0 / r4 W1 (64x8 row-major),
; r5 biases (bg: 2 int32, b0: 8 int32, b1: 8 int32), r6 output (y: 8 bytes, then the
; 2 gate logits). Weights and biases are tagged: they stay resident across runs.
; Defines: GATE_MUL/GATE_SHIFT/GATE_ZP and EXP_MUL/EXP_SHIFT/EXP_ZP.
;
; Partitions: p0 x + logits, p1 Wg, p2 W0, p3 W1, p4 biases, p5 y.

.reg x, r1
.reg wg, r2
.reg w0, r3
.reg w1, r4
.reg bias, r5
.reg out, r6
.reg xo, r8          ; activation offset of the current K tile
.reg wo, r9          ; weight offset of the current K tile
.reg e, r11          ; chosen expert

    region.begin 1
    load    p0, r0, x, r0, 1, 64, push=next
    load    p1, r0, wg, r0, 1, 128, tag=1, push=next
    load    p4, r0, bias, r0, 1, 72, tag=4, push=next
    cfg.qmul   GATE_MUL, pop=prev                ; x has arrived
    cfg.qshift GATE_SHIFT
    cfg.qzp    GATE_ZP
    li      xo, 0
    li      wo, 0
    wload   p1, wo, 8, 2, pop=prev              ; Wg has arrived
    gemm.overwrite p0, xo, r0, 1, swap=1
    loop    7, gate_k
    addi    xo, xo, 8
    addi    wo, wo, 16
    wload   p1, wo, 8, 2
    gemm.accumulate p0, xo, r0, 1, swap=1
gate_k:
    vbias   p4, r0, r0, 1, 2, pop=prev          ; biases have arrived
    vreq    p0, r0, r0, 1, 2, off=64
    vargmax e, p0, r0, 2, off=64
    region.end 1
    br.ne   e, r0, expert1

    region.begin 2                               ; expert 0
    load    p2, r0, w0, r0, 1, 512, tag=2, push=next
    li      xo, 0
    li      wo, 0
    wload   p2, wo, 8, 8, pop=prev
    gemm.overwrite p0, xo, r0, 1, swap=1
    loop    7, e0_k
    addi    xo, xo, 8
    addi    wo, wo, 64
    wload   p2, wo, 8, 8
    gemm.accumulate p0, xo, r0, 1, swap=1
e0_k:
    vbias   p4, r0, r0, 1, 8, off=8
    region.end 2
    jmp     epilogue

expert1:
    region.begin 3                               ; expert 1
    load    p3, r0, w1, r0, 1, 512, tag=3, push=next
    li      xo, 0
    li      wo, 0
    wload   p3, wo, 8, 8, pop=prev
    gemm.overwrite p0, xo, r0, 1, swap=1
    loop    7, e1_k
    addi    xo, xo, 8
    addi    wo, wo, 64
    wload   p3, wo, 8, 8
    gemm.accumulate p0, xo, r0, 1, swap=1
e1_k:
    vbias   p4, r0, r0, 1, 8, off=40
    region.end 3

epilogue:
    cfg.qmul    EXP_MUL
    cfg.qshift  EXP_SHIFT
    cfg.qzp     EXP_ZP
    cfg.clip_lo EXP_ZP                            ; ReLU
    vreq    p5, r0, r0, 1, 8, push=next
    store   p5, r0, out, r0, 1, 8, pop=prev
    addi    r12, out, 8
    store   p0, r0, r12, r0, 1, 2, off=64         ; the gate logits after y
    end
