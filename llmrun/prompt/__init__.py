"""Prompts: chat templates (sandboxed Jinja, rendered as transformers renders them) and their
tokenization with special tokens guarded."""
