"""The dummy full-size architecture has the released model's dimensions (built on the meta device: no memory)."""

from __future__ import annotations

import pytest

from engine.omni.weights.full_size import build_dummy_stage


@pytest.mark.parametrize(
    ("stage", "billions"),
    [("thinker", (30.0, 32.5)), ("talker", (2.5, 4.5)), ("code2wav", (0.1, 0.3))],
)
def test_stage_sizes(stage: str, billions: tuple[float, float]) -> None:
    model, config = build_dummy_stage(stage, device="meta", dtype="bfloat16")
    params = sum(p.numel() for p in model.parameters()) / 1e9
    assert billions[0] <= params <= billions[1], params
    assert config.talker_config.accept_hidden_layer == 24
    if stage == "thinker":
        text = getattr(model.model, "language_model", model.model)  # nested in transformers >= 5.2x
        assert len(text.layers) == 48
        assert text.layers[0].mlp.experts.gate_up_proj.shape == (128, 2 * 768, 2048)
        assert text.embed_tokens.weight.shape == (152064, 2048)
    if stage == "talker":
        assert len(model.model.layers) == 20
        assert model.model.layers[0].mlp.experts.gate_up_proj.shape == (128, 2 * 384, 1024)
        assert len(model.code_predictor.model.layers) == 5


def test_dummy_weights_front_door_builds_once(tmp_path) -> None:
    """`load_format: dummy` needs no checkpoint: the released config, and a tokenizer built once in the cache."""
    from engine.omni.weights.source import ModelSource

    source = ModelSource.open("dummy", "dummy", tmp_path)
    assert source.is_random_weights and source.frame_samples == 1920
    assert source.speakers == ("aiden", "chelsie", "ethan")
    assert source.config.thinker_config.text_config.num_hidden_layers == 48
    built = (source.path / "tokenizer.json").stat().st_mtime_ns
    again = ModelSource.open("dummy", "dummy", tmp_path)
    assert again.path == source.path and (again.path / "tokenizer.json").stat().st_mtime_ns == built
    assert again.tokenizer().convert_tokens_to_ids("<|im_start|>") == 151644
    assert [p.name for p in tmp_path.iterdir()] == [source.path.name]  # no half-built folder left behind


def test_the_talkers_experts_are_drawn_not_left_empty() -> None:
    """transformers leaves the Talker's stacked experts as `torch.empty`; dummy weights draw them as the Thinker's."""
    import torch

    from engine.omni.weights.checkpoint import stage_class
    from engine.omni.weights.full_size import draw_talker_experts
    from engine.omni.weights.omni_config import omni_config
    from engine.omni.weights.tiny import tiny_config_dict

    cls, sub = stage_class("talker", omni_config(tiny_config_dict()))
    talker = cls._from_config(sub, dtype=torch.float32)
    experts = [w for name, w in talker.named_parameters() if ".experts." in name]
    assert len(experts) == 2 * sub.text_config.num_hidden_layers
    with torch.no_grad():
        for weight in experts:
            weight.fill_(float("nan"))  # what torch.empty may hold
    draw_talker_experts(talker, std=0.02)
    drawn = torch.cat([w.detach().flatten() for w in experts])
    assert torch.isfinite(drawn).all() and abs(float(drawn.std()) - 0.02) < 0.002
    rows = torch.randn(1, 5, sub.text_config.hidden_size)
    with torch.no_grad():
        assert torch.isfinite(talker.model(inputs_embeds=rows, use_cache=False).last_hidden_state).all()
