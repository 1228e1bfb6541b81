"""The Thinker's audio tower at one shape per chunk count: what transformers' tower computes, laid out so that a
CUDA graph can capture it.

transformers' forward reads the clips' lengths back to the host several times and splits its attention into one
call per window: host time dwarfs the GPU work. Here every chunk is padded to a whole second (`CHUNK_FRAMES`
frames, `TOKENS` tokens after the convolutions), attention runs over a batch's tokens at once with a mask that
keeps each token in its clip's window (padding tokens see only themselves), and the host works the layout out
from the frame counts it already knows. Same sums, same rows: tests/unit/test_audio_tower.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

TOKENS = 13  # a whole chunk's tokens after the three stride-2 convolutions


def tokens_after_convs(frames: int) -> int:
    """Tokens a chunk of `frames` log-mel frames becomes (each stride-2 convolution rounds up)."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a batch of clips sits in `chunks` padded chunks: the log-mels, which window each token attends
    within (padding tokens each alone in one of their own), and which tokens are real, in clip order."""

    features: torch.Tensor  # [chunks, mel, chunk frames]
    windows: torch.Tensor  # [chunks * TOKENS] long
    real: torch.Tensor  # [rows] long: the real tokens' places, clip after clip


class PaddedTower:
    """Owns nothing but a reference to transformers' audio tower; reads its weights as they are."""

    def __init__(self, tower: Any) -> None:
        self.tower = tower
        self.chunk_frames = 2 * tower.n_window
        assert tokens_after_convs(self.chunk_frames) == TOKENS, tower.n_window
        # windows of attention, in whole chunks: transformers' n_window_infer frames
        self.window_chunks = tower.n_window_infer // self.chunk_frames

    def silence(self, chunks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s inputs for `chunks` chunks of padding: what warm-ups and captures run."""
        return (torch.zeros(chunks, self.tower.config.num_mel_bins, self.chunk_frames, device=device),
                -1 - torch.arange(chunks * TOKENS, device=device))

    def layout(self, clips: list[torch.Tensor], chunks: int) -> Layout:
        """Log-mels [mel, frames] -> their layout in `chunks` chunks (at least as many as they fill)."""
        mel = clips[0].shape[0]
        features = torch.zeros(chunks, mel, self.chunk_frames, dtype=clips[0].dtype)
        windows = -1 - torch.arange(chunks * TOKENS)  # padding: a window of its own
        # transformers' window is `window_chunks` of the batch's longest chunk: a clip of one short chunk
        # fits in one either way, so whole chunks' tokens measure it
        per_window = TOKENS * self.window_chunks
        real: list[torch.Tensor] = []
        at, window = 0, 0
        for clip in clips:
            pieces = -(-clip.shape[-1] // self.chunk_frames)
            for k in range(pieces):
                piece = clip[:, k * self.chunk_frames : (k + 1) * self.chunk_frames]
                features[at + k, :, : piece.shape[-1]] = piece
            # every chunk but the last is whole, so a clip's real tokens are one run from its first chunk on
            count = (pieces - 1) * TOKENS + tokens_after_convs(clip.shape[-1] - (pieces - 1) * self.chunk_frames)
            places = at * TOKENS + torch.arange(count)
            windows[places] = window + torch.arange(count) // per_window
            window += -(-count // per_window)
            real.append(places)
            at += pieces
        assert at <= chunks, (at, chunks)
        return Layout(features, windows, torch.cat(real))

    def forward(self, features: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
        """Chunks [chunks, mel, frames], token windows [chunks * TOKENS] -> rows [chunks * TOKENS, out]; graphable."""
        t = self.tower
        x = features.unsqueeze(1).to(t.conv2d1.weight.dtype)
        x = F.gelu(t.conv2d1(x))
        x = F.gelu(t.conv2d2(x))
        x = F.gelu(t.conv2d3(x))
        b, c, f, n = x.shape
        x = t.conv_out(x.permute(0, 3, 1, 2).reshape(b, n, c * f))
        x = x + t.positional_embedding.positional_embedding[:n].unsqueeze(0).to(x.dtype)
        hidden = x.reshape(b * n, -1)
        tokens = torch.arange(hidden.shape[0], device=hidden.device)
        allowed = (windows[:, None] == windows[None, :]) & ((windows >= 0)[None, :] | (tokens[:, None] == tokens[None, :]))
        for layer in t.layers:
            hidden = self._layer(layer, hidden, allowed)
        return t.proj2(t.act(t.proj1(t.ln_post(hidden))))

    @staticmethod
    def _layer(layer: Any, hidden: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        attn = layer.self_attn
        heads = attn.num_heads
        residual = hidden
        x = layer.self_attn_layer_norm(hidden)
        q, k, v = (proj(x).reshape(x.shape[0], heads, -1).transpose(0, 1) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=attn.scaling)
        hidden = residual + attn.out_proj(out.transpose(0, 1).reshape(x.shape[0], -1))
        residual = hidden
        hidden = residual + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
        if hidden.dtype == torch.float16:
            clamp = torch.finfo(hidden.dtype).max - 1000
            hidden = torch.clamp(hidden, min=-clamp, max=clamp)
        return hidden
