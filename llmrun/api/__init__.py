"""Wire formats, free of any web framework: OpenAI and Ollama bodies and batch files in, Requests out, Results back."""
