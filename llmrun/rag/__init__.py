"""Retrieval-augmented generation: documents → chunks → embeddings → a vector store → prompts."""
