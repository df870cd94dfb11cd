"""Structured output: answers constrained to JSON, a JSON Schema or a grammar while they are decoded.

:mod:`~llmrun.structured.formats` says what an answer must look like (pure); :mod:`~llmrun.structured.grammar`
enforces it token by token through llguidance, imported only when a constrained request runs.
"""

from llmrun.structured.formats import ANY_JSON, Format, from_schema, load_grammar, load_schema, response_format

__all__ = ["ANY_JSON", "Format", "from_schema", "load_grammar", "load_schema", "response_format"]
