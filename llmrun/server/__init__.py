"""``llmrun serve``: the OpenAI HTTP API over the engine (the only web-framework importer)."""
