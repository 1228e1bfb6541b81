"""The front door's work: a request's prompt (prompt.py: chat messages in Qwen's format, audio features, images from
images.py), the grammar its reply is held to (constraints.py), and its voice and length (intake.py)."""
