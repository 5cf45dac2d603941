"""Generation engines (transformers, batched with left padding, resumable) and model loading."""
