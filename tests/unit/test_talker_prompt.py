"""The Talker prompt built from host-side layout equals the device-mask formulation it replaced
(transformers' talker prompt: user turns projected, then the assistant header), text and audio rows."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from engine import create_engine, load_profile
from engine.omni.runners.talker import PromptLayout

IM_START, USER, ASSISTANT, SYSTEM, AUDIO = 1, 2, 3, 4, 9


def _mask_layout(ids: list[int]) -> tuple[list[int], list[bool], int]:
    """The old device formulation, on the CPU: user row positions, their multimodal flags, the header."""
    t = torch.tensor(ids)
    positions = torch.arange(len(t))
    starts = torch.where(t == IM_START, positions, torch.full_like(positions, -1)).cummax(0).values
    roles = t[(starts.clamp_min(0) + 1).clamp_max(len(t) - 1)]
    user = (roles == USER) & (starts >= 0)
    header = int(torch.nonzero((t[:-1] == IM_START) & (t[1:] == ASSISTANT))[-1])
    return positions[user].tolist(), (t[user] == AUDIO).tolist(), header


def test_layout_matches_the_mask_formulation_on_random_turns() -> None:
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.choice([5, 6, 7, AUDIO]) for _ in range(rng.randrange(0, 3))]  # before any turn
        for _ in range(rng.randrange(1, 5)):
            ids += [IM_START, rng.choice([USER, SYSTEM, ASSISTANT])]
            ids += [rng.choice([5, 6, 7, AUDIO]) for _ in range(rng.randrange(0, 6))]
        ids += [IM_START, ASSISTANT, 8]
        layout = PromptLayout.of(ids, IM_START, USER, ASSISTANT, frozenset({AUDIO}))
        rows, multimodal, header = _mask_layout(ids)
        assert [i for a, b in layout.user_spans for i in range(a, b)] == rows
        assert list(layout.multimodal) == multimodal and layout.header == header


def _old_prompt_embeds(runner, token_ids, embeds, hidden, first_text, speaker) -> torch.Tensor:
    ids = torch.tensor(token_ids)
    positions = torch.arange(len(ids))
    starts = torch.where(ids == runner.im_start_id, positions, torch.full_like(positions, -1)).cummax(0).values
    roles = ids[(starts.clamp_min(0) + 1).clamp_max(len(ids) - 1)]
    user = (roles == runner.user_token_id) & (starts >= 0)
    multimodal = torch.isin(ids, torch.tensor(sorted(runner._multimodal_id_set)))
    talker = runner.talker
    rows = torch.where(multimodal[user].unsqueeze(-1), talker.hidden_projection(hidden[user]),
                       talker.text_projection(embeds[user]))
    header = int(torch.nonzero((ids[:-1] == runner.im_start_id) & (ids[1:] == runner.assistant_token_id))[-1])
    assistant = talker.text_projection(torch.cat([embeds[header:], first_text[None]]))
    text_track = torch.cat([assistant[:3], runner.tts_pad.expand(4, -1), runner.tts_bos[None], assistant[3:4]])
    codec_ids = torch.tensor(runner.codec_prefix + [runner.speaker_ids[speaker]] + runner.codec_suffix)
    codec_track = torch.cat([torch.zeros(3, text_track.shape[-1]), runner.codec_embedding(codec_ids)])
    return torch.cat([rows, text_track + codec_track])


@torch.inference_mode()
def test_prompt_embeds_equal_the_mask_formulation(tiny_checkpoint: Path, cache_dir: Path) -> None:
    engine = create_engine("tiny", load_profile(model="tiny", platform="cpu"), cache_dir)
    runner = engine.core.core.stages["talker"].runner
    audio = min(runner._multimodal_id_set)
    im, user, assistant = runner.im_start_id, runner.user_token_id, runner.assistant_token_id
    system = 872  # any id that is not a role: a system-like turn the Talker skips
    ids = [im, system, 10, 11, 12, im, user, 13, audio, audio, 14, im, system, 15, im, user, 16, im, assistant, 17]
    gen = torch.Generator().manual_seed(0)
    thinker_hidden = engine.core.core.stages["thinker"].runner.thinker.config.text_config.hidden_size
    embeds = torch.randn(len(ids), thinker_hidden, generator=gen)
    hidden = torch.randn(len(ids), thinker_hidden, generator=gen)
    first_text = torch.randn(thinker_hidden, generator=gen)
    for speaker in list(runner.speaker_ids)[:2]:
        new = runner.prompt_embeds(ids, embeds, hidden, first_text, speaker)
        old = _old_prompt_embeds(runner, ids, embeds, hidden, first_text, speaker)
        assert torch.equal(new, old)
    # the layout put two audio rows among the user rows, so both projections were exercised
    assert sum(PromptLayout.of(ids, im, user, assistant, runner._multimodal_id_set).multimodal) == 2
    # the Thinker hands its rows over piece by piece: each piece's user rows, joined, are the whole prompt's
    layout = runner.layout(ids)
    whole = runner.user_rows(layout, embeds, hidden)
    for cuts in ([0, 9, len(ids)], [0, 1, 8, 9, 10, 16, len(ids)], list(range(len(ids) + 1))):
        pieces = [runner.user_rows(layout, embeds[a:b], hidden[a:b], a) for a, b in zip(cuts, cuts[1:], strict=False)]
        assert torch.allclose(torch.cat(pieces), whole, atol=1e-6)
