"""The sequencer's sub-components (:class:`hdl.sequencer.Sequencer` joins them).

:mod:`.loops` (the hardware loop stack), :mod:`.regions` (the region stack, its
meters and trace records), :mod:`.tokens` (dispatch-time dependency-token counts),
:mod:`.bounds` (the configuration registers the bounds checks read),
:mod:`.spans` (the partition checks' byte spans) and :mod:`.dispatch` (the FIRE
step: resolved queue entries and the handshake that sends them).

Each takes the sequencer's step strobes (SPANS, PRODUCTS, CHECK, the fire) as
inputs; what a fire changes is decided in CHECK and registered inside the
sub-component that owns the state, so that the fire only selects it. The contracts
say in which cycle each output is valid.
"""
