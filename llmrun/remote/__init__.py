"""Remote engines: OpenAI-compatible servers (vLLM, llama-server, Ollama, LM Studio, ``llmrun serve``)
driven with the same commands as a local model. ``endpoint`` names one (pure), ``wire`` speaks the API
(pure), ``client`` talks HTTP, ``fleet`` spreads requests over several."""
