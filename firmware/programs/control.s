; Control flow and marks: nested hardware loops, a counted branch loop with a
; region per iteration, a hardware loop left by a branch, plus misspec / ptsel /
; tinv / sync.
; Results: r2 = 12 (3 x 4 inner iterations), r3 = 30, r4 = 0, r5 = 1, r6 = 23
; (3 iterations of the left loop, then 2 x 10), five trace records of region 9,
; one misspeculation.
    li      r2, 0
    li      r3, 0
    loop    3, outer_end
    loop    4, inner_end
    addi    r2, r2, 1
inner_end:
    addi    r3, r3, 10
outer_end:
    li      r4, 5
again:
    region.begin 9
    addi    r4, r4, -1
    region.end 9
    br.ne   r4, r0, again
    cmp.lt  r5, r4, r2
    li      r6, 0
    li      r7, 3
    loop    10, brk_end         ; left by the branch in its third iteration
    addi    r6, r6, 1
    br.eq   r6, r7, broke
brk_end:
    nop
broke:
    loop    2, after_end        ; faults (LOOP) unless leaving popped the loop above
    addi    r6, r6, 10
after_end:
    misspec
    ptsel   1
    tinv    0
    sync
    end
