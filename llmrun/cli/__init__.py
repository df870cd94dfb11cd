"""The command-line interface: Typer commands over llmrun's core."""
