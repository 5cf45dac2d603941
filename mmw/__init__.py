"""mmw — MarkMyWords, the benchmark for LLM output watermarks, as a data-versioned pipeline."""

__version__ = "0.1.0"
