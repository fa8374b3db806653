; DMA: copy the 4 x 8 block at (row 2, col 4) of a 16 x 32 byte matrix (r1) into
; the scratchpad with a strided load, load it again (a tile-tag hit: no transfer),
; then store it densely at r2 and row-strided (16 bytes apart) at r2 + 64.
.equ COLS, 32
    li      r8, COLS
    addi    r9, r1, 2*COLS + 4
    load    p0, r0, r9, r8, 4, 8, tag=1
    load    p0, r0, r9, r8, 4, 8, tag=1          ; same transfer: hit
    sync                                          ; store waits for the loads
    store   p0, r0, r2, r0, 4, 8
    li      r10, 16
    addi    r11, r2, 64
    store   p0, r0, r11, r10, 4, 8
    end
