"""Input pictures and videos at the edge: their limits, their URLs, and decoding them to pixels (and a video's sound)."""
