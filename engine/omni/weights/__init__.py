"""Checkpoints and tokenizers: finding, building and strictly loading each stage's weights."""
