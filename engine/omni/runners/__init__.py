"""Tensor work per stage: the model forwards, KV caches and the sampler; scheduling lives in engine/omni/stages."""
