"""The Talker's code predictor: the 15 residual codebooks of a frame, given its codebook 0.

`predictor(past_hidden [B, H], code0 [B], rows) -> (codes [B, G], summed codec embedding [B, H])`:
`TransformersCodePredictor` runs transformers' modules (the eager reference), whose DynamicCache gives every pass
new shapes; `StaticCodePredictor` runs one fixed-shape step per position, which torch.compile can fuse and a CUDA
graph capture: one token per row against a zeroed buffer of all 16 positions, masked from the current one on,
beside the token's own key and value, which the step returns for its caller to write. The compiled step only
reads the buffer: a write into one layer's view of it makes inductor copy the whole buffer out and back every
step. q/k/v and gate/up are each one GEMM over fused weights the transformers modules keep views of. transformers'
first pass takes two tokens; here they are two single-token steps, the same computation under causal attention."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from engine.omni.runners.kv_cache import cache_kwarg
from engine.omni.runners.sampler import RowTensors, sample_tensors, token_terms


class FrameAttention(Protocol):
    """One layer's attention at `position` of a frame, a token per row: qkv [B, (Hq + 2 Hkv) D], the q/k
    RMSNorm weights [D] and epsilon, the rotary table cos/sin [positions, D], the frame's buffer keys/values
    [B, Hkv, positions, D] (read before `position` only) -> (output [B, Hq D], the position's key and value
    [B, Hkv, D]). `frame_attention` below in torch; engine/omni/accel/predictor_attention.py in one kernel."""

    def __call__(
        self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float, cos: torch.Tensor,
        sin: torch.Tensor, position: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, num_heads: int,
        num_kv_heads: int, scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


class CodePredictor(Protocol):
    def __call__(self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: RowTensors) -> tuple[torch.Tensor, torch.Tensor]:
        ...


class TransformersCodePredictor:
    """transformers' predictor modules through a growing DynamicCache: new shapes every pass."""

    def __init__(self, predictor: Any, codec_embedding: torch.nn.Embedding) -> None:
        self.predictor = predictor
        self.codec_embedding = codec_embedding
        self.num_groups = predictor.config.num_code_groups
        self._cache_kw = cache_kwarg(predictor.model)

    def __call__(self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: RowTensors) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.predictor.config)
        kw = {self._cache_kw: cache, "use_cache": True}
        first = self.codec_embedding(code0)
        step_input = torch.stack([past_hidden, first], dim=1)
        codes, total = [code0], first
        for group in range(self.num_groups - 1):
            hidden = self.predictor.model(inputs_embeds=step_input, **kw).last_hidden_state[:, -1]
            code = sample_tensors(self.predictor.lm_head[group](hidden), rows, draw_offset=group)
            codes.append(code)
            embed = self.predictor.model.codec_embedding[group](code)
            total = total + embed
            step_input = embed[:, None]
        return torch.stack(codes, dim=1), total


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: float32 statistics, the weight applied in the model's dtype."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def frame_attention(
    qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
    position: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, num_heads: int, num_kv_heads: int, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`FrameAttention` in torch, as transformers computes it (eager attention, in the model's dtype)."""
    batch, head_dim = qkv.shape[0], cos.shape[-1]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    cos, sin = cos.index_select(0, position), sin.index_select(0, position)
    q = _rotate(_rms_norm(q.view(batch, num_heads, head_dim), q_norm, eps), cos, sin)
    k = _rotate(_rms_norm(k.view(batch, num_kv_heads, head_dim), k_norm, eps), cos, sin)
    v = v.view(batch, num_kv_heads, head_dim)
    earlier = torch.arange(keys.shape[2], device=keys.device) < position
    # [B, kv heads, query heads per kv head, D] against the buffer's positions, then against its own key
    q = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.cat([(q @ keys.transpose(-1, -2)).masked_fill(~earlier, float("-inf")), q @ k[:, :, :, None]],
                       dim=-1) * scale
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    attn = weights[..., :-1] @ values + weights[..., -1:] * v[:, :, None]
    return attn.reshape(batch, num_heads * head_dim), k, v


def _fuse(modules: list[Any]) -> torch.Tensor:
    """One weight for several Linear layers of the same input; the layers keep views into it."""
    fused = torch.cat([m.weight.detach() for m in modules])
    offset = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = torch.nn.Parameter(fused[offset : offset + rows], requires_grad=False)
        offset += rows
    return fused


class _Layer:
    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        if any(m.bias is not None for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)):
            raise ValueError("static code predictor: attention biases are not supported")
        self.qkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
        self.gate_up = _fuse([mlp.gate_proj, mlp.up_proj])
        self.o, self.down = attn.o_proj.weight, mlp.down_proj.weight
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = attn.q_norm.weight, attn.k_norm.weight
        self.eps = attn.q_norm.variance_epsilon
        if attn.k_norm.variance_epsilon != self.eps:
            raise ValueError("static code predictor: q and k norms with different epsilons are not supported")
        self.intermediate = mlp.gate_proj.weight.shape[0]


class StaticCodePredictor:
    """predictor(past_hidden [B, H], code0 [B], rows) -> codes [B, G], summed codec embedding [B, H]."""

    def __init__(self, predictor: Any, codec_embedding: Any, *, compiled: bool = False,
                 attention: FrameAttention = frame_attention) -> None:
        config = predictor.config
        model = predictor.model
        if getattr(config, "sliding_window", None) and "sliding_attention" in (config.layer_types or ()):
            if config.sliding_window < config.num_code_groups:
                raise ValueError("static code predictor: a sliding window shorter than a frame is not supported")
        self.num_groups = config.num_code_groups
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.layers = [_Layer(layer) for layer in model.layers[: config.num_hidden_layers]]
        self.norm = model.norm
        self.lm_heads = [head.weight for head in predictor.lm_head]
        self.embeddings = [codec_embedding, *model.codec_embedding]
        self.device, self.dtype = self.lm_heads[0].device, self.lm_heads[0].dtype
        # transformers' rotary embedding for the 16 positions, in the model dtype as it hands them over
        cos, sin = model.rotary_emb(self.lm_heads[0][None], torch.arange(self.num_groups, device=self.device)[None])
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()
        self.position_ids = [torch.tensor([p], device=self.device) for p in range(self.num_groups)]
        self.attention = attention
        self.token_terms = token_terms(self.lm_heads[0].shape[0], self.device)
        self.step, self.sample = self._step, sample_tensors
        self.compiled = compiled
        if compiled:
            self.step = torch.compile(self._step, fullgraph=True)
            self.sample = torch.compile(sample_tensors, fullgraph=True)

    def __call__(self, past_hidden: torch.Tensor, code0: torch.Tensor, rows: RowTensors) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._start_frame(past_hidden)
        first = self.embeddings[0](code0)
        codes, total, step_input = [code0], first, first
        for group in range(self.num_groups - 1):
            hidden = self._run_step(step_input, group + 1, keys, values)
            logits = F.linear(hidden, self.lm_heads[group])
            settings = RowTensors(rows.temperature, rows.top_p, rows.top_k, rows.seeds, rows.draws + group)
            self._dynamic_batch((logits, 0), *((getattr(settings, f.name), 0) for f in dataclasses.fields(settings)))
            code = self.sample(logits, settings, 0, self.token_terms)
            codes.append(code)
            step_input = self.embeddings[group + 1](code)
            total = total + step_input
        return torch.stack(codes, dim=1), total

    def teacher_forced_logits(self, past_hidden: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """Every group's logits [B, G - 1, V] for a given frame codes [B, G]: what a test compares with
        transformers' predictor run over the same frame, free of sampling's near-ties."""
        keys, values = self._start_frame(past_hidden)
        logits = []
        for group in range(self.num_groups - 1):
            step_input = self.embeddings[group](codes[:, group])
            hidden = self._run_step(step_input, group + 1, keys, values)
            logits.append(F.linear(hidden, self.lm_heads[group]))
        return torch.stack(logits, dim=1)

    def _start_frame(self, past_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A frame's KV buffers, with position 0 (the Talker's hidden state) written."""
        shape = (len(self.layers), past_hidden.shape[0], self.num_kv_heads, self.num_groups, self.head_dim)
        # zeroed, not empty: a masked position still multiplies its value by a weight of 0
        keys = torch.zeros(shape, device=self.device, dtype=self.dtype)
        values = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self._run_step(past_hidden, 0, keys, values)
        return keys, values

    def _run_step(self, x: torch.Tensor, position: int, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """The step at `position`, then its key and value written there (the last position's never read)."""
        self._dynamic_batch((x, 0), (keys, 1), (values, 1))
        hidden, key, value = self.step(x, self.position_ids[position], keys, values)
        if position < self.num_groups - 1:
            keys[:, :, :, position] = key
            values[:, :, :, position] = value
        return hidden

    def _dynamic_batch(self, *dims: tuple[torch.Tensor, int]) -> None:
        """Compile once for every batch size above 1 (torch.compile would first specialise on the first it saw)."""
        if self.compiled and dims[0][0].shape[dims[0][1]] > 1:
            for tensor, dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)

    def _step(
        self, x: torch.Tensor, position: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One token per row at `position` (a [1] tensor), attending to the buffer's earlier positions and
        to itself -> the final-normed hidden state [B, H] and every layer's key and value for `position`
        [L, B, kv heads, D]; reads `keys` and `values`, never writes them."""
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            qkv = F.linear(layer.input_norm(x), layer.qkv)
            attn, k, v = self.attention(qkv, layer.q_norm, layer.k_norm, layer.eps, self.cos, self.sin, position,
                                        keys[i], values[i], self.num_heads, self.num_kv_heads, self.scaling)
            new_keys.append(k)
            new_values.append(v)
            x = x + F.linear(attn, layer.o)
            gate, up = F.linear(layer.post_norm(x), layer.gate_up).split(layer.intermediate, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        return self.norm(x), torch.stack(new_keys), torch.stack(new_values)
