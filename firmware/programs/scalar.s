; Scalar unit: r1 = n (argument).
; Results: r2 = 1 + 2 + ... + n, r3 = n! mod 2**32, r4 = (r2 <u r3), r6 = r2 - r3.
    li      r2, 0
    li      r3, 1
    li      r5, 0               ; i
    loopr   r1, done
    addi    r5, r5, 1
    add     r2, r2, r5
    mul     r3, r3, r5
done:
    cmp.ltu r4, r2, r3
    sub     r6, r2, r3
    end
