"""The sequencer's sub-components (:class:`hdl.sequencer.Sequencer` joins them).

:mod:`.loops` (the hardware loop stack), :mod:`.regions` (the region stack, its
meters and trace records) and :mod:`.tokens` (dispatch-time dependency-token counts).

Each takes the sequencer's step strobes (SPANS, CHECK, the fire) as
inputs; what a fire changes is decided in CHECK and registered inside the
sub-component that owns the state, so that the fire only selects it. The contracts
say in which cycle each output is valid.
"""
