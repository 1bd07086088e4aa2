"""Block ids: which repeated block a traced event or storage belongs to, an index of
`StepTrace.blocks` (trainwise/trace/blocks.py tracks them while the step runs). A module of
its own, without torch, so that the estimate reading a trace needs no torch."""

NO_BLOCK = -1  # the work of no repeated block (embeddings, the head, the optimizer's own)
