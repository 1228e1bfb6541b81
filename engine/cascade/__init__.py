"""The CPU assistant's cascade: listen (Whisper) -> think (a small LLM) -> speak (a Piper voice), small models that
ship inside registry packages; a backend beside the Omni engine (backend.py)."""
