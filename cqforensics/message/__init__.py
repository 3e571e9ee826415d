"""Stored messages: every stored message shape to one normalised form (``reference``, the
specification), the fast path for the two layouts that make up nearly every store (``fast``), and the commands
of the quorum queue's ``rabbit_fifo`` machine that carry them (``rabbit_fifo``)."""
