"""Inside the forward pass (``llmrun look``): tokens as vectors, attention, and the logit lens.

:mod:`~llmrun.look.view` runs one captured pass (a backend that :class:`~llmrun.backends.trace.Looks`)
and assembles what is shown; :mod:`~llmrun.look.attention` reads attention maps (pure functions);
:mod:`~llmrun.look.report` is the documented JSON shape and :mod:`~llmrun.look.page` the self-contained
HTML page built from it.
"""
