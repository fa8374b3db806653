; Control flow and marks: nested hardware loops, a counted branch loop with a
; region per iteration, plus misspec / ptsel / tinv / sync.
; Results: r2 = 12 (3 x 4 inner iterations), r3 = 30, r4 = 0, r5 = 1,
; five trace records of region 9, one misspeculation.
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
    misspec
    ptsel   1
    tinv    0
    sync
    end
