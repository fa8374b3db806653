; Systolic array: Y = requant(X @ W + b) with X 16 x 16 (r1), W 16 x 8 (r2, two
; 8 x 8 K tiles back to back), b 8 int32 (r3), Y 16 x 8 int8 (r4).
; The second K tile is preloaded while the first streams and accumulates.
; Defines: QMUL, QSHIFT, QZP.
    load    p0, r0, r1, r0, 16, 16, push=next     ; X
    load    p1, r0, r2, r0, 1, 128, push=next     ; W
    load    p2, r0, r3, r0, 1, 32, push=next      ; b
    cfg.gemm_stride 16, pop=prev
    cfg.qmul QMUL
    cfg.qshift QSHIFT
    cfg.qzp QZP
    li      r8, 64
    li      r9, 8
    wload   p1, r0, 8, 8, pop=prev
    gemm.overwrite p0, r0, r0, 16, swap=1
    wload   p1, r8, 8, 8
    gemm.accumulate p0, r9, r0, 16, swap=1
    vbias   p2, r0, r0, 16, 8, pop=prev
    vreq    p3, r0, r0, 16, 8, push=next
    store   p3, r0, r4, r0, 16, 8, pop=prev
    end
