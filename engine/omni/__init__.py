"""The staged Qwen3-Omni engine: Thinker -> Talker -> Code2Wav (stages/), their tensor work (runners/), speed-ups
applied from outside (accel/), checkpoints (weights/), and the backend that builds them (backend.py)."""
