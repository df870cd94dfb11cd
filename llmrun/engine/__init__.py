"""The request engine: what every adapter (run, chat, batch, the server) builds on.

An adapter parses its input into a :class:`Request`; the :class:`Engine` loads the
model by name (and keeps it, or unloads it after a while), renders the prompt through
the chat template, streams :class:`~llmrun.decoding.events.Token` events and ends with
one :class:`Result`, the single shape that ``run --json``, batch JSONL lines and
server responses are built from. Many requests at once go through the
:class:`~llmrun.engine.scheduler.Scheduler` (continuous batching on one model).
"""
