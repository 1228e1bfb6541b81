"""The language model's linear layers for the CPU's two regimes: a step of a few rows (one conversation's next
token) reads every weight to do little arithmetic, so it reads them in float16, half the bytes; a step of many
rows (a prompt) is arithmetic, which this CPU does fastest in float32. Owns each layer's float16 copy.

Measured on the 2-core machine (SmolLM2-135M's 211 layers, one thread): float32 takes 43 ms for one row, 72 for
two, 93 for three and 65 for four; float16 16, 28, 42 and 55 ms; at 8 rows float16 is slower (111 against 74 ms),
its products being done without float16 arithmetic. Activations, the KV cache and every other operation stay
float32: a row's inputs are rounded to float16 for the product only, and rows stay independent of each other."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

FEW_ROWS = 4  # at most this many rows in a step: its products read the float16 weights


class FewRowsInHalf(nn.Module):
    """`linear` with its weights also in float16, for inputs of at most `FEW_ROWS` rows."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        # plain attributes, not buffers: casting the model (`.to(dtype)`) leaves them float16
        self.half_weight = linear.weight.detach().to(torch.float16)
        self.half_bias = None if linear.bias is None else linear.bias.detach().to(torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() > FEW_ROWS * x.shape[-1]:
            return self.linear(x)
        return F.linear(x.to(torch.float16), self.half_weight, self.half_bias).to(x.dtype)


def few_rows_in_half(model: nn.Module) -> nn.Module:
    """`model` with each of its float32 linear layers wrapped (in place): the layers a tied embedding shares keep
    the embedding as it is, their copy is the product's alone."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
            setattr(model, name, FewRowsInHalf(child))
        elif not isinstance(child, FewRowsInHalf):
            few_rows_in_half(child)
    return model
