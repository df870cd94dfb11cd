"""llmrun: run quantized LLMs locally, with the inference pipeline made visible."""

import logging

__version__ = "0.1.0"

# A library stays quiet unless the application configures logging (llmrun --debug does).
logging.getLogger("llmrun").addHandler(logging.NullHandler())
