"""Images and videos through the Omni engine: the same text and speech as transformers' own generate(), M-RoPE
positions as transformers places them, the vision tower batched, kept prefixes that hold an image, refusals."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import (
    AudioChunk,
    AudioPart,
    EngineError,
    EngineRequest,
    Finished,
    ImagePart,
    Message,
    SamplingParams,
    TextDelta,
    TextPart,
    VideoPart,
    create_engine,
)
from engine.handoff import ImageInput
from engine.intake.images import ImagePreprocessor
from engine.omni.runners.thinker import StepRow, ThinkerRunner
from engine.omni.runners.vision_layout import GridLayout
from engine.omni.runners.vision_tower import Normalisation, PatchMatmul, VisionTower, patches
from engine.omni.weights.checkpoint import load_stage
from engine.positions import Rope, placeholder_spans
from engine.profile import load_profile
from tests.equivalence import FRAMES, TEXT_TOKENS, assert_equals_generate

GREEDY = {"temperature": 0}
# generate() given image grids says, for its talker, that it applies the repetition penalty to new codes only:
# so does the engine (a greedy talker has no penalty to apply)
pytestmark = pytest.mark.filterwarnings("ignore:Passing `repetition_penalty`:UserWarning")


def _image(height: int, width: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)


def _engine(cache_dir: Path, device: str = "cpu", top: dict | None = None):
    """The tiny engine, greedy, replies of FRAMES frames; `top`: profile keys outside the stages."""
    on = {"device": device}
    profile = load_profile(model="tiny", platform="cpu", overrides=top or {}, stage_overrides={
        "thinker": on, "code2wav": on, "talker": {**on, "max_frames": FRAMES, "sampling": GREEDY,
                                                  "code_sampling": GREEDY}})
    return create_engine("tiny", profile, cache_dir)


async def _reply(engine, rid: str, messages: tuple[Message, ...]) -> tuple[list[int], list[np.ndarray], Finished]:
    stream = await engine.submit(EngineRequest(rid, messages, True, "ethan",
                                               SamplingParams(max_tokens=TEXT_TOKENS, temperature=0)))
    tokens, audio, finished = [], [], None
    async for event in stream:
        if isinstance(event, TextDelta):
            tokens += event.token_ids
        elif isinstance(event, AudioChunk):
            audio.append(event.samples)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None, f"{rid} did not finish"
    return tokens, audio, finished


def _video(frames: int, height: int, width: int, seed: int) -> VideoPart:
    return VideoPart(np.stack([_image(height, width, seed + i) for i in range(frames)]), fps=2.0)


def _patches(images) -> torch.Tensor:
    """The images' pixels as the tiny tower takes them (its 16-pixel patches, two frames deep)."""
    return torch.cat([patches(i, Normalisation(), temporal=2, patch=16) for i in images])


def _generate_inputs(prompt) -> dict:
    """A prompt's images, videos and speech as generate() takes them."""
    inputs: dict = {}
    images = [i for i in prompt.images if not i.is_video]
    videos = [i for i in prompt.images if i.is_video]
    if images:
        inputs.update(pixel_values=_patches(images), image_grid_thw=torch.tensor([i.grid_thw for i in images]))
    if videos:
        inputs.update(pixel_values_videos=_patches(videos),
                      video_grid_thw=torch.tensor([i.grid_thw for i in videos]),
                      video_second_per_grid=torch.tensor([i.time_step / 13 for i in videos]))
    if prompt.audio_features:
        longest = max(f.shape[-1] for f in prompt.audio_features)
        features = torch.zeros(len(prompt.audio_features), prompt.audio_features[0].shape[0], longest)
        mask = torch.zeros(len(prompt.audio_features), longest, dtype=torch.long)
        for i, f in enumerate(prompt.audio_features):
            features[i, :, : f.shape[-1]], mask[i, : f.shape[-1]] = f, 1
        inputs.update(input_features=features, feature_attention_mask=mask)
    return inputs


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_checkpoint).eval()


CONVERSATIONS = {
    "one image": (Message("user", (TextPart("What is in this picture?"), ImagePart(_image(100, 150, 1)))),),
    "two images": (
        Message("system", (TextPart("You describe pictures."),)),
        Message("user", (ImagePart(_image(64, 64, 2)), TextPart("and"), ImagePart(_image(90, 40, 3)))),
    ),
    "text only": (Message("user", (TextPart("Hello there"),)),),
    "a video": (Message("user", (_video(5, 64, 96, 20), TextPart("What happens here?"))),),
    "an image, then a video": (Message("user", (ImagePart(_image(64, 64, 30)), _video(4, 96, 64, 31),
                                                TextPart("Compare them."))),),
}
# Speech and images together: generate()'s talker then reads an `audio_config` its config lacks, so prompts
# with both are checked against the fixed reference (`reference_with_sound`) and by positions (`get_rope_index`).
WITH_SPEECH = (*CONVERSATIONS["two images"][:1], Message("user", (
    *CONVERSATIONS["two images"][1].content, AudioPart(np.random.default_rng(4).standard_normal(16_000).astype(np.float32) * 0.1),
    ImagePart(_image(48, 80, 5)), _video(6, 64, 64, 40))))


def every_conversation(engine) -> tuple[list, list]:
    """Each of CONVERSATIONS' prompts, and its reply, all asked at once (their steps shared)."""
    async def run():
        await engine.start()
        try:
            results = await asyncio.gather(*(_reply(engine, name, m) for name, m in CONVERSATIONS.items()))
            return [engine.intake.prompts.build(m) for m in CONVERSATIONS.values()], results
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_engine_with_images_equals_generate(cache_dir: Path, reference) -> None:
    """Replies with images, beside one without, in shared steps: the tokens and speech generate() makes."""
    prompts, results = every_conversation(_engine(cache_dir))
    for prompt, (tokens, audio, finished) in zip(prompts, results, strict=True):
        assert finished.timings.prompt_image_tokens == sum(i.tokens for i in prompt.images)
        assert_equals_generate(reference, "cpu", prompt.token_ids, tokens, audio, **_generate_inputs(prompt))
    assert len(prompts[1].images) == 2
    assert prompts[3].images[0].is_video and prompts[3].images[0].grid_thw[0] == 3  # 5 frames: 3 pairs


def _sound(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(round(16_000 * seconds)) * 0.1).astype(np.float32)


# A video with its sound (use_audio_in_video), beside a clip and an image: generate() takes the flag for every
# video of a prompt, so this prompt's one video has its sound
WITH_SOUND = (Message("system", (TextPart("You watch and listen."),)), Message("user", (
    TextPart("What happens?"), VideoPart(_video(6, 64, 96, 60).frames, 2.0, _sound(3.0, 61)),
    AudioPart(_sound(1.0, 62)), ImagePart(_image(48, 64, 63)))))


@pytest.fixture(scope="module")
def reference_with_sound(reference):
    """The reference whose talker can place a clip's positions: transformers' talker reads its encoder's window
    from an `audio_config` its own config lacks (it is the Thinker's)."""
    fixed = copy.deepcopy(reference)
    fixed.talker.config.audio_config = fixed.config.thinker_config.audio_config
    return fixed


def test_a_video_with_its_sound_equals_generate(cache_dir: Path, reference_with_sound) -> None:
    """Frames and sound interleaved by time: the layout, positions, text and speech of generate(use_audio_in_video)."""
    async def run():
        engine = _engine(cache_dir)
        await engine.start()
        try:
            return engine.intake.prompts.build(WITH_SOUND), await _reply(engine, "av", WITH_SOUND)
        finally:
            await engine.stop()

    prompt, (tokens, audio, finished) = asyncio.run(run())
    video = prompt.images[0]
    assert video.is_video and video.audio_tokens == 39 and len(prompt.audio_features) == 2
    assert finished.timings.prompt_image_tokens == video.tokens + prompt.images[1].tokens
    expected, _ = _rope_index(reference_with_sound, prompt, True)
    assert prompt.positions is not None
    np.testing.assert_array_equal(prompt.positions, expected[:, 0].long().numpy())
    assert_equals_generate(reference_with_sound, "cpu", prompt.token_ids, tokens, audio, use_audio_in_video=True,
                           **_generate_inputs(prompt))


def _rope_index(reference, prompt, use_audio_in_video: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' M-RoPE rows [3, 1, L] for a prompt (as generate() computes them), and the reply's shift."""
    thinker = reference.thinker
    rope_index = getattr(thinker, "get_rope_index", None) or thinker.model.get_rope_index
    inputs = _generate_inputs(prompt)
    ids = torch.tensor([prompt.token_ids])
    seqlens = inputs["feature_attention_mask"].sum(-1) if prompt.audio_features else None
    return rope_index(ids, inputs.get("image_grid_thw"), inputs.get("video_grid_thw"), torch.ones_like(ids),
                      use_audio_in_video, seqlens, inputs.get("video_second_per_grid"))


def test_the_thinker_hears_a_video_s_sound(cache_dir: Path, tiny_checkpoint: Path, reference_with_sound) -> None:
    """The tiny model's greedy replies do not change with a clip's sound, so this reads the Thinker's rows: the
    captured layer's rows of the prompt and its last logits equal transformers' thinker forward, and another
    sound over the same frames changes the rows its placeholders take, and only those."""
    prompts = _engine(cache_dir).intake.prompts
    loaded = load_stage(tiny_checkpoint, "thinker", device="cpu", dtype="float32")
    runner = ThinkerRunner(loaded.model, loaded.config, max_batch=2, max_len=256)
    frames, t = _video(4, 64, 64, 70).frames, np.arange(32_000) / 16_000
    rows, keys = [], []
    for slot, sound in enumerate((_sound(2.0, 71), (0.8 * np.sin(2 * np.pi * 440 * t)).astype(np.float32))):
        prompt = prompts.build((Message("user", (TextPart("Listen"), VideoPart(frames, 2.0, sound))),))
        assert prompt.positions is not None
        positions, _ = _rope_index(reference_with_sound, prompt, True)
        with torch.inference_mode():
            out = runner.step([StepRow(slot, prompt.token_ids, 0, tuple(prompt.audio_features), tuple(prompt.images),
                                       Rope.of(prompt.positions).at(0, len(prompt.token_ids)))])[0]
            # a forward without positions counts them 0, 1, 2, ...: generate() gives them as this does
            expected = reference_with_sound.thinker(input_ids=torch.tensor([prompt.token_ids]), position_ids=positions,
                                                    use_audio_in_video=True, output_hidden_states=True,
                                                    **_generate_inputs(prompt))
        torch.testing.assert_close(out.hidden, expected.hidden_states[runner.capture_layer + 1][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.logits, expected.logits[0, -1], rtol=1e-4, atol=1e-4)
        rows.append(out.embeds)
        keys.append(prompt.images[0].key)
    assert keys[0] != keys[1]  # a kept prefix that holds the frames with one sound is not taken for another
    sound_at = torch.tensor(prompt.token_ids) == runner.audio_token_id
    # the tiny audio tower's random weights answer any sound nearly alike (4e-5 apart on rows of ~1e-2): a
    # difference at all is the sound, as every other row is the same to the bit
    assert (rows[0][sound_at] - rows[1][sound_at]).abs().max() > 1e-5
    assert torch.equal(rows[0][~sound_at], rows[1][~sound_at])


def test_the_image_changes_the_reply(cache_dir: Path) -> None:
    """The pixels reach the model: another picture, with the same words, gives another reply."""
    async def run():
        engine = _engine(cache_dir)
        await engine.start()
        try:
            return [await _reply(engine, f"r{seed}", (Message("user", (TextPart("Look"), ImagePart(_image(64, 96, seed)))),))
                    for seed in (10, 11)]
        finally:
            await engine.stop()

    (_, first, _), (_, second, _) = asyncio.run(run())
    assert not np.allclose(np.concatenate(first), np.concatenate(second))


def test_positions_are_transformers_rope_index(cache_dir: Path, reference) -> None:
    """Text, speech and two images: the M-RoPE rows transformers' get_rope_index gives the whole prompt."""
    async def build():
        engine = _engine(cache_dir)
        return engine.intake.prompts.build(WITH_SPEECH)

    prompt = asyncio.run(build())
    assert prompt.audio_tokens and len(prompt.images) == 4
    expected, delta = _rope_index(reference, prompt, False)
    assert prompt.positions is not None
    np.testing.assert_array_equal(prompt.positions, expected[:, 0].long().numpy())
    assert int(prompt.positions.max()) + 1 - len(prompt.token_ids) == int(delta)


def test_a_still_video_is_its_frame_as_an_image(cache_dir: Path) -> None:
    """Two equal frames make one temporal patch: the image processor's own layout of that frame (it repeats an
    image over the patch), so the frames of a video are laid out as transformers lays out pixels."""
    frame = _image(80, 120, 50)
    prompts = _engine(cache_dir).intake.prompts
    video = prompts.videos.video(np.stack([frame, frame]), 2.0, -1, 13)
    image = prompts.videos(frame, -1)
    assert video.grid_thw == image.grid_thw and video.time_step == 13
    torch.testing.assert_close(_patches([video]), _patches([image]), rtol=0, atol=0)
    moving = prompts.videos.video(np.stack([frame, 255 - frame, frame, frame]), 2.0, -1, 13)
    assert moving.grid_thw[0] == 2 and moving.tokens == 2 * image.tokens


@pytest.mark.parametrize(("height", "width", "max_pixels", "mean_std"), [
    (720, 1280, 1280 * 720, (0.5, 0.5)),
    (720, 1280, 200_000, (0.5, 0.5)),  # shrunk to the budget
    (100, 150, 1280 * 720, ((0.48, 0.46, 0.41), (0.27, 0.26, 0.28))),  # another checkpoint's normalisation
    (9, 1500, 1280 * 720, (0.5, 0.5)),  # grown to the least budget, a long strip
])
def test_pixels_resized_then_cut_where_the_tower_runs_are_transformers(height, width, max_pixels, mean_std) -> None:
    """The image crosses to the engine resized, as uint8; `patches` there makes what transformers' Qwen2-VL image
    processor makes of the whole image."""
    pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    mean, std = ((m,) * 3 if isinstance(m, float) else m for m in mean_std)
    vision = SimpleNamespace(spatial_merge_size=2, patch_size=16, temporal_patch_size=2)
    pixels = _image(height, width, 60)
    ours = ImagePreprocessor(vision, min_pixels=56 * 56, max_pixels=max_pixels)(pixels, -1)
    theirs = pil.Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=56 * 56,
                                          max_pixels=max_pixels, image_mean=list(mean), image_std=list(std))(
        images=[pixels], return_tensors="pt")
    assert ours.pixels.dtype == torch.uint8 and list(ours.grid_thw) == theirs["image_grid_thw"][0].tolist()
    # the grid a graph is captured for at start-up, from the size alone
    assert ImagePreprocessor(vision, min_pixels=56 * 56, max_pixels=max_pixels).grid(height, width) == ours.grid_thw
    torch.testing.assert_close(patches(ours, Normalisation(mean, std), temporal=2, patch=16), theirs["pixel_values"],
                               rtol=0, atol=1e-6)


def test_the_patch_matmul_is_the_convolution(reference) -> None:
    """The tower's patch embedding as a matmul gives what transformers' Conv3d gives, for any count of patches."""
    conv = (getattr(reference.thinker, "visual", None) or reference.thinker.model.visual).patch_embed
    matmul = PatchMatmul(conv.proj)
    pixels = torch.randn(37, matmul.weight.shape[1])
    with torch.inference_mode():
        torch.testing.assert_close(matmul(pixels), conv(pixels), rtol=1e-5, atol=1e-5)


def test_vision_tower_batched_equals_one_by_one(cache_dir: Path, reference) -> None:
    async def build():
        return _engine(cache_dir).intake.prompts.build(WITH_SPEECH)

    images = asyncio.run(build()).images
    tower = VisionTower(copy.deepcopy(reference.thinker))  # it gives its tower the patch matmul
    with torch.inference_mode():
        together = tower(images)
        alone = [tower([image]) for image in images]
    torch.testing.assert_close(together.embeds, torch.cat([a.embeds for a in alone]), rtol=1e-5, atol=1e-5)
    for k, rows in enumerate(together.deepstack):
        torch.testing.assert_close(rows, torch.cat([a.deepstack[k] for a in alone]), rtol=1e-5, atol=1e-5)
    assert together.embeds.shape[0] == sum(i.tokens for i in images)


def test_vision_tower_laid_out_on_the_host_equals_transformers(cache_dir: Path, reference) -> None:
    """Host-made grid tensors and the per-layer attention over host lengths (engine/omni/runners/vision_layout.py)
    give transformers' own tower's rows: images of one size (one batched attention call), and of mixed sizes with
    a video (one call a sequence)."""
    async def build():
        return _engine(cache_dir).intake.prompts.build(WITH_SPEECH)

    mixed = asyncio.run(build()).images
    same = [ImageInput(torch.from_numpy(_image(64, 96, seed))[None], (1, 4, 6), -seed, 2) for seed in (1, 2, 3)]
    theirs = copy.deepcopy(reference.thinker)
    tower = VisionTower(copy.deepcopy(reference.thinker))
    plain = getattr(theirs, "visual", None) or theirs.model.visual
    for images in (mixed, same):
        pixels = torch.cat([patches(i, Normalisation(), temporal=tower.temporal, patch=tower.patch) for i in images])
        with torch.inference_mode():
            ours = tower(images)
            out = plain(pixels, grid_thw=torch.tensor([i.grid_thw for i in images]))
        embeds, deepstack = (out[0], out[1]) if isinstance(out, tuple) else (out.pooler_output, out.deepstack_features)
        torch.testing.assert_close(ours.embeds, embeds, rtol=1e-5, atol=1e-5)
        for k, rows in enumerate(ours.deepstack):
            torch.testing.assert_close(rows, deepstack[k], rtol=1e-5, atol=1e-5)
        with torch.inference_mode():  # a repeated layout is the one made before, and gives the same rows
            assert GridLayout.of(tower.tower, [tuple(i.grid_thw) for i in images], tower.device) is GridLayout.of(
                tower.tower, [tuple(i.grid_thw) for i in images], tower.device)
            torch.testing.assert_close(tower(images).embeds, ours.embeds, rtol=0, atol=0)
            # a second VisionTower over the same tower reads its own calls' layouts
            torch.testing.assert_close(VisionTower(SimpleNamespace(visual=tower.tower))(images).embeds, ours.embeds,
                                       rtol=0, atol=0)


def test_next_turn_reuses_the_prefix_that_holds_the_image(cache_dir: Path, reference) -> None:
    """A conversation's second turn resends its picture: the kept prefix holds it (the image's placeholders are
    not prefilled again), and the reply is what a full prefill gives."""
    picture = ImagePart(_image(256, 288, 7))  # 72 placeholders: a kept prefix is at least 64 tokens
    first = (Message("user", (TextPart("What colour is it?"), picture)),)

    async def run():
        engine = _engine(cache_dir)
        await engine.start()
        try:
            tokens, _, _ = await _reply(engine, "turn1", first)
            text = engine.intake.prompts.tokenizer.decode(tokens)
            second = (*first, Message("assistant", (TextPart(text),)), Message("user", (TextPart("Are you sure?"),)))
            return engine.intake.prompts.build(second), await _reply(engine, "turn2", second)
        finally:
            await engine.stop()

    prompt, (tokens, audio, finished) = asyncio.run(run())
    image_end = placeholder_spans(prompt.token_ids, 151655)[0][1]
    assert finished.timings.cached_tokens > image_end
    assert_equals_generate(reference, "cpu", prompt.token_ids, tokens, audio, **_generate_inputs(prompt))


@pytest.mark.parametrize("messages, message", [
    ((Message("user", (ImagePart(np.zeros((8, 8), np.uint8)),)),), "RGB uint8"),
    ((Message("user", (ImagePart(np.zeros((8, 8, 3), np.float32)),)),), "RGB uint8"),
    ((Message("user", (ImagePart(np.zeros((1, 64, 3), np.uint8)),)),), "at least 2x2"),
    ((Message("user", (ImagePart(np.zeros((2, 900, 3), np.uint8)),)),), "cannot use this image"),
    ((Message("user", (TextPart("hi"),)), Message("assistant", (ImagePart(_image(32, 32, 0)),))), "user messages"),
])
def test_images_the_engine_refuses(cache_dir: Path, messages, message: str) -> None:
    async def run():
        engine = _engine(cache_dir)
        await engine.start()
        try:
            with pytest.raises(EngineError, match=message):
                await engine.submit(EngineRequest("bad", messages, True, "ethan"))
            await _reply(engine, "after", CONVERSATIONS["text only"])  # the engine serves on
        finally:
            await engine.stop()

    asyncio.run(run())
