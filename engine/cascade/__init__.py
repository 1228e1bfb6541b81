"""The cascade core: listen (Whisper) -> think (a small LLM) -> speak (a Piper voice), small models that
ship inside registry packages, behind the same engine interface as the staged Qwen3-Omni core."""
