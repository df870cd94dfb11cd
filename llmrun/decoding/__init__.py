"""Decoding: sampling, the events a generation streams, the answer assembler, text streaming and stop
strings, reasoning and speculative drafts."""
