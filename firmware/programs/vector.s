; Vector unit on int8 tensors from r1 (a: 4x8, b: 4x8, t: 4x4x2 HWC, v: 8 values):
;   r2 + 0:  vadd  a + b with requantization (ADD_MUL_A/B, ADD_ZP_A/B, QSHIFT, QZP)
;   r2 + 32: vclip a to [-10, 10]
;   r2 + 64: 2x2 max-pool (stride 2) of t, 2x2x2 HWC, in two separable vmax passes
;   r12:     vargmax of v
    load    p0, r0, r1, r0, 1, 104, push=next
    cfg.add_mul_a ADD_MUL_A, pop=prev
    cfg.add_mul_b ADD_MUL_B
    cfg.add_zp_a ADD_ZP_A
    cfg.add_zp_b ADD_ZP_B
    cfg.qshift QSHIFT
    cfg.qzp QZP
    li      r8, 32                           ; b
    li      r9, 64                           ; t
    li      r10, 96                          ; v
    vadd    p1, r0, p0, r0, p0, r8, 4, 8
    cfg.clip_lo -10
    cfg.clip_hi 10
    li      r11, 32
    vclip   p1, r11, p0, r0, 4, 8
    ; pass 1, along W: 8 output pairs (row h, pooled column w') of 2 channels.
    ; window elements are 2 bytes (one pixel) apart, output windows 4 bytes apart.
    cfg.pool_count 2
    cfg.pool_stride 2
    cfg.pool_istride 4
    li      r13, 0
    vmax    p2, r13, p0, r9, 8, 2
    ; pass 2, along H: pass-1 rows are h * 4 bytes apart; 2 output rows of 4 bytes
    cfg.pool_stride 4
    cfg.pool_istride 8
    li      r14, 64
    vmax    p1, r14, p2, r13, 2, 4
    vargmax r12, p0, r10, 8, push=next
    store   p1, r0, r2, r0, 1, 72, pop=prev
    end
