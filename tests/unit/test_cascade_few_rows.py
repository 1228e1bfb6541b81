"""The language model's linear layers read float16 weights for steps of a few rows (engine/cascade/few_rows.py):
close to float32 there, exactly float32 past them, and each row independent of the others in its step."""

from __future__ import annotations

import torch
from torch import nn

from engine.cascade.few_rows import FEW_ROWS, FewRowsInHalf, few_rows_in_half


def _linear(bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(64, 96, bias=bias)


def test_a_few_rows_are_close_to_float32_and_many_rows_are_float32() -> None:
    linear = _linear()
    layer = FewRowsInHalf(linear)
    with torch.inference_mode():
        few, many = torch.randn(FEW_ROWS, 64), torch.randn(FEW_ROWS + 1, 64)
        out = layer(few)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, linear(few), rtol=1e-2, atol=1e-2)
        assert not torch.equal(out, linear(few))  # it did read the float16 weights
        assert torch.equal(layer(many), linear(many))


def test_each_row_is_its_own_whatever_else_the_step_holds() -> None:
    layer = FewRowsInHalf(_linear(bias=False))
    with torch.inference_mode():
        rows = torch.randn(3, 1, 64)  # [rows, tokens, features], as a packed step holds them
        together = layer(rows)
        alone = torch.cat([layer(rows[i : i + 1]) for i in range(3)])
    assert torch.equal(together, alone)


def test_a_model_is_wrapped_once_and_casting_it_keeps_the_half_weights() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 4), nn.ReLU()))
    few_rows_in_half(model)
    few_rows_in_half(model)
    wrapped = [m for m in model.modules() if isinstance(m, FewRowsInHalf)]
    assert len(wrapped) == 2 and all(not isinstance(m.linear, FewRowsInHalf) for m in wrapped)
    model.to(torch.float32)
    assert all(m.half_weight.dtype == torch.float16 for m in wrapped)
    assert model(torch.randn(1, 8)).shape == (1, 4)
