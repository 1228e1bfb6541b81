"""Code2Wav's tensor work, streamed: each chunk of a reply decodes only its new frames.

Each request owns a slot of carried state: the last `sliding_window - 1` keys and values of every pre-transformer
layer, the last `kernel - 1` inputs of every causal convolution, and the last input of every transposed
convolution (whose look-ahead of one input makes the 555-sample tail). A reply decoded chunk by chunk is the
one-shot decode of its frames, whatever the chunking (tests keep a windowed decode as the reference). Rows are
right-padded: every layer is causal, so padding never reaches a valid sample, and each state is read back at the
row's own end. On a GPU a step is padded up to its `batch_buckets` / `frame_buckets` bucket, each met once at
start-up (`warm_up`; cuDNN's first meeting of a shape is slow) and capturable as a CUDA graph."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

from engine.omni.runners.replay import capture

_CausalConv = hf.Qwen3OmniMoeCausalConvNet
_TransConv = hf.Qwen3OmniMoeCausalTransConvNet


@dataclass(slots=True)
class StreamBatch:
    """One step's rows: codes [B, Q, T] right-padded, and per row its slot, new-frame count and history."""

    codes: torch.Tensor
    slots: torch.Tensor  # [B] long
    new_frames: torch.Tensor  # [B] long, >= 1
    past_frames: torch.Tensor  # [B] long, frames this slot has decoded before


class StreamingCode2Wav:
    """Decodes chunks for up to `num_slots` concurrent replies, carrying state per slot."""

    def __init__(
        self, code2wav: Any, num_slots: int, *, batch_buckets: tuple[int, ...] = (),
        frame_buckets: tuple[int, ...] = (), max_step_frames: int | None = None,
    ) -> None:
        self.model = code2wav
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.frame_buckets = tuple(sorted(frame_buckets))
        self.max_step_frames = max_step_frames  # rows x widest chunk a step of several rows holds at most
        cfg = code2wav.config
        param = next(code2wav.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.num_slots = num_slots
        self.num_quantizers = cfg.num_quantizers
        self.window = cfg.sliding_window
        self.samples_per_frame = int(code2wav.total_upsample)
        # every one-shot call returns samples_per_frame * T - tail_samples samples for T frames: the
        # causal transposed convolutions drop their look-ahead; a reply's last chunk ends there too
        self.tail_samples = self._measure_tail()
        transformer = code2wav.pre_transformer
        assert set(cfg.layer_types[: cfg.num_hidden_layers]) == {"sliding_attention"}, cfg.layer_types
        attn = transformer.layers[0].self_attn
        self.scratch_slot = num_slots  # padding rows of a bucket write their state here
        # (rows, frames) -> (graph, its static input batch, its static (audio, valid) outputs)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, StreamBatch, tuple[torch.Tensor, torch.Tensor]]] = {}
        kv_shape = (num_slots + 1, cfg.num_key_value_heads, self.window - 1, attn.head_dim)
        self.kv = [(self._zeros(kv_shape), self._zeros(kv_shape)) for _ in transformer.layers]
        # one state tensor per stateful convolution, keyed by the module, in forward order
        self.conv_state: dict[nn.Module, torch.Tensor] = {}
        for module in code2wav.modules():
            if isinstance(module, _CausalConv) and module.padding:
                assert module.stride == 1, "strided causal convolutions are not streamed"
                self.conv_state[module] = self._zeros((num_slots + 1, module.conv.in_channels, module.padding))
            elif isinstance(module, _TransConv) and module.conv.kernel_size[0] > module.conv.stride[0]:
                assert module.conv.kernel_size[0] == 2 * module.conv.stride[0], "look-ahead of one input expected"
                self.conv_state[module] = self._zeros((num_slots + 1, module.conv.in_channels, 1))

    @torch.inference_mode()
    def _measure_tail(self) -> int:
        tails = {frames * self.samples_per_frame
                 - self.model(torch.zeros(1, self.num_quantizers, frames, dtype=torch.long, device=self.device)).shape[-1]
                 for frames in (1, 3)}
        assert len(tails) == 1, f"Code2Wav's tail depends on length: {tails}"
        tail = tails.pop()
        assert 0 <= tail < self.samples_per_frame, tail
        return tail

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    @torch.inference_mode()
    def decode(self, batch: StreamBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (float32 audio [B, L] right-padded, valid samples per row [B]); row b continues its reply exactly where
        its previous chunk stopped."""
        rows, _, frames = batch.codes.shape
        padded = self._pad(batch, _bucket(rows, self.batch_buckets), _bucket(frames, self.frame_buckets))
        graphed = self.graphs.get((padded.codes.shape[0], padded.codes.shape[2]))
        if graphed is None:
            wav, valid = self._decode(padded)
            return wav[:rows], valid[:rows]
        graph, static, (wav, valid) = graphed
        for name in ("codes", "slots", "new_frames", "past_frames"):
            getattr(static, name).copy_(getattr(padded, name))
        graph.replay()
        return wav[:rows].clone(), valid[:rows].clone()

    @torch.inference_mode()
    def capture_graphs(self) -> int:
        """A CUDA graph per bucket, largest first into one pool; -> how many. A failed capture keeps none and raises."""
        try:
            return self._capture_graphs()
        except Exception:
            self.graphs.clear()
            raise

    def _capture_graphs(self) -> int:
        pool = None
        capture_stream = torch.cuda.Stream(self.device)
        quantizers = self.model.config.num_quantizers
        for rows, frames in sorted(self.step_shapes(), reverse=True):
            slots, lengths, starts = (torch.full((rows,), value, dtype=torch.long, device=self.device)
                                      for value in (self.scratch_slot, frames, 0))
            static = StreamBatch(torch.zeros(rows, quantizers, frames, dtype=torch.long, device=self.device),
                                 slots, lengths, starts)
            graph, outputs = capture(functools.partial(self._decode, static), pool, capture_stream)
            pool = graph.pool()
            self.graphs[(rows, frames)] = (graph, static, outputs)
        return len(self.graphs)

    @torch.inference_mode()
    def warm_up(self) -> int:
        shapes = self.step_shapes()
        for rows, frames in shapes:
            codes = torch.zeros(rows, self.model.config.num_quantizers, frames, dtype=torch.long)
            scratch = torch.full((rows,), self.scratch_slot)
            self._decode(StreamBatch(codes, scratch, torch.full((rows,), frames), torch.zeros(rows, dtype=torch.long)))
        return len(shapes)

    def step_shapes(self) -> list[tuple[int, int]]:
        return step_shapes(self.batch_buckets, self.frame_buckets, self.max_step_frames)

    def _pad(self, batch: StreamBatch, rows: int, frames: int) -> StreamBatch:
        n, quantizers, t = batch.codes.shape
        if (rows, frames) == (n, t):
            return batch
        codes = torch.zeros(rows, quantizers, frames, dtype=batch.codes.dtype, device=batch.codes.device)
        codes[:n, :, :t] = batch.codes

        def extend(values: torch.Tensor, fill: int) -> torch.Tensor:
            return torch.cat([values.cpu(), torch.full((rows - n,), fill, dtype=values.dtype)])

        return StreamBatch(codes, extend(batch.slots, self.scratch_slot), extend(batch.new_frames, 1),
                           extend(batch.past_frames, 0))

    def _decode(self, batch: StreamBatch) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.device
        slots, new, past = (t.to(dev) for t in (batch.slots, batch.new_frames, batch.past_frames))
        fresh = past == 0
        model = self.model
        hidden = model.code_embedding(batch.codes.to(dev) + model.code_offset).mean(1)
        hidden = self._transformer(hidden, slots, new, past)
        hidden = hidden.transpose(1, 2)
        valid = new
        for transconv, convnext in model.upsample:
            hidden = transconv(hidden)  # kernel == stride: each frame on its own, no state
            valid = valid * transconv.conv.stride[0]
            hidden = self._convnext(convnext, hidden, slots, fresh, valid)
        for block in model.decoder:
            if isinstance(block, _CausalConv):
                hidden = self._causal_conv(block, hidden, slots, fresh, valid)
            elif isinstance(block, hf.Qwen3OmniMoeCode2WavDecoderBlock):
                hidden, valid = self._decoder_block(block, hidden, slots, fresh, valid)
            else:
                hidden = block(hidden)
        return hidden[:, 0].clamp(min=-1, max=1).float(), valid

    # -- state routing --------------------------------------------------------------------

    def _causal_conv(self, conv: Any, x: torch.Tensor, slots, fresh, valid) -> torch.Tensor:
        if not conv.padding:
            return conv.conv(x)
        pool = self.conv_state[conv]
        history = torch.where(fresh[:, None, None], 0, pool[slots])
        joined = torch.cat([history, x], dim=-1)
        pool[slots] = _take(joined, valid, conv.padding)  # the last `padding` valid inputs
        return conv.conv(joined)

    def _trans_conv(self, conv: Any, x: torch.Tensor, slots, fresh, valid):
        pool = self.conv_state[conv]
        previous = torch.where(fresh[:, None, None], 0, pool[slots])
        joined = torch.cat([previous, x], dim=-1)
        pool[slots] = _take(joined, valid, 1)
        out = conv(joined)  # output i pairs inputs i and i + 1 of `joined`
        stride = conv.conv.stride[0]
        # a fresh row had no previous input: its first `stride` outputs pair a made-up zero
        shifted = F.pad(out[..., stride:], (0, stride))
        out = torch.where(fresh[:, None, None], shifted, out)
        return out, valid * stride - fresh.long() * stride

    def _convnext(self, block: Any, x, slots, fresh, valid) -> torch.Tensor:
        h = self._causal_conv(block.dwconv, x, slots, fresh, valid).transpose(1, 2)
        h = block.pwconv2(block.act(block.pwconv1(block.norm(h))))
        return x + (block.gamma * h).transpose(1, 2)

    def _decoder_block(self, block: Any, x, slots, fresh, valid):
        for layer in block.block:
            if isinstance(layer, _TransConv):
                x, valid = self._trans_conv(layer, x, slots, fresh, valid)
            elif isinstance(layer, hf.Qwen3OmniMoeCode2WavDecoderResidualUnit):
                h = self._causal_conv(layer.conv1, layer.act1(x), slots, fresh, valid)
                x = x + layer.conv2(layer.act2(h))
            else:
                x = layer(x)
        return x, valid

    def _transformer(self, hidden: torch.Tensor, slots, new, past) -> torch.Tensor:
        """Sliding-window attention over [carried keys | new keys]; a query at position p sees (p - window, p]."""
        transformer = self.model.pre_transformer
        steps = hidden.shape[1]
        carried = self.window - 1
        positions = past[:, None] + torch.arange(steps, device=self.device)
        cos, sin = transformer.rotary_emb(hidden, positions)
        # key column c of [carried | new] sits at position past - carried + c; query i at past + i
        query = torch.arange(steps, device=self.device)[:, None]
        column = torch.arange(carried + steps, device=self.device)[None, :]
        distance = query + carried - column
        mask = (distance >= 0) & (distance < self.window)
        mask = mask[None] & (past[:, None, None] - carried + column[None] >= 0)
        mask = mask[:, None]  # [B, 1, T, carried + T]
        for layer, (key_pool, value_pool) in zip(transformer.layers, self.kv, strict=True):
            residual = hidden
            attn = layer.self_attn
            h = layer.input_layernorm(hidden)
            shape = (*h.shape[:-1], -1, attn.head_dim)
            q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = hf.apply_rotary_pos_emb(q, k, cos, sin)
            keys = torch.cat([key_pool[slots], k], dim=2)
            values = torch.cat([value_pool[slots], v], dim=2)
            key_pool[slots] = _take(keys, new, carried, dim=2)
            value_pool[slots] = _take(values, new, carried, dim=2)
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=attn.num_key_value_groups > 1
            )
            hidden = residual + layer.self_attn_layer_scale(attn.o_proj(out.transpose(1, 2).flatten(2)))
            hidden = hidden + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(hidden)))
        return transformer.norm(hidden)


def step_shapes(batch_buckets: tuple[int, ...], frame_buckets: tuple[int, ...],
                max_step_frames: int | None) -> list[tuple[int, int]]:
    """The padded (rows, frames) a step can take: a step holds at most `max_step_frames` (rows x its widest chunk), so
    the widest buckets of many rows never occur and are neither warmed nor captured."""
    shapes = []
    largest = batch_buckets[-1] if batch_buckets else 1
    for i, frames in enumerate(frame_buckets):
        narrowest = frame_buckets[i - 1] + 1 if i else 1  # the least a chunk padded to `frames` holds
        most = largest if max_step_frames is None else min(largest, max(1, max_step_frames // narrowest))
        shapes += [(rows, frames) for rows in batch_buckets if rows <= _bucket(most, batch_buckets)]
    return shapes


def _bucket(size: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `size`; `size` itself past the largest."""
    return next((b for b in buckets if b >= size), size)


def _take(joined: torch.Tensor, valid: torch.Tensor, size: int, dim: int = -1) -> torch.Tensor:
    """Per row b, the `size` entries of `joined` ([carried state of `size` | new entries]) along `dim` that end at
    `size + valid[b]`: the row's last `size` valid ones."""
    dim = dim % joined.dim()
    index = valid[:, None] + torch.arange(size, device=joined.device)  # [B, size]
    shape = [1] * joined.dim()
    shape[0], shape[dim] = index.shape
    index = index.view(shape).expand(*joined.shape[:dim], size, *joined.shape[dim + 1 :])
    return joined.gather(dim, index)
