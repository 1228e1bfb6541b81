"""Speed-ups applied to finished models and runners from outside: CUDA graphs, torch.compile, Triton kernels."""
