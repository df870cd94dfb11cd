"""Quantizing a model with a quality report: jobs, evaluation against the source, the texts it is measured on."""
