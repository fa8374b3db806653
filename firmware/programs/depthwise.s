; Depthwise 3x3 convolution, stride 1, padding 1, of x (5x4x8 HWC int8) at r1 on the
; depthwise engine; its dwload block at r3: 9 tap windows of 8 lanes, the pad value
; (byte 72), 8 int32 biases (bytes 80..111). y = requant(conv + bias), 5x4x8, to r2.
    load    p0, r0, r1, r0, 1, 160, push=next
    load    p1, r0, r3, r0, 1, 112, push=next
    cfg.gemm_stride 8, pop=prev              ; a pixel: 8 channels
    cfg.in_stride 32, pop=prev               ; a row: 4 pixels
    cfg.qmul QMUL
    cfg.qshift QSHIFT
    cfg.qzp QZP
    dwload  p1, r0
    ; 5 output rows of 4 pixels from a 7x6 window: the input and a pad ring around it
    dwconv.overwrite p0, r0, r0, 4, 5, 1, 3, 3, 8, pt=1, pb=1, pl=1, pr=1
    vreq    p2, r0, r0, 20, 8, push=next
    store   p2, r0, r2, r0, 1, 160, pop=prev
    end
