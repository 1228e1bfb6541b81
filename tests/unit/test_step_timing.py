"""`voice-gateway steps` (engine/probes/step_timing.py) on the tiny model, on the CPU: every (rows, context, prompt) timed
through the Thinker's own step, what its rows read counted from the cache's shape, the JSON and the figure
written, and bad counts refused."""

from __future__ import annotations

import json
from pathlib import Path

from voice_gateway.cli import main


def test_every_rows_and_context_is_timed_and_written(tiny_checkpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    assert main(["steps", "tiny", "--rows", "1,3", "--contexts", "16,80", "--prompts", "0,256", "--replays", "2",
                 "--cache-dir", str(cache_dir), "--out-dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "steps.json").read_text())
    cells = [(1, 16), (1, 80), (3, 16), (3, 80)]
    assert [(r["rows"], r["context"], r["prompt"]) for r in report["rows"]] == [(*c, p) for p in (0, 256) for c in cells]
    assert all(r["step_ms"] > 0 for r in report["rows"])
    text = json.loads((tiny_checkpoint / "config.json").read_text())["thinker_config"]["text_config"]
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    # float32 keys and values of every layer and key/value head
    position = text["num_hidden_layers"] * text["num_key_value_heads"] * head_dim * 2 * 4
    assert [r["kv_gb"] for r in report["rows"]] == 2 * [round(n * c * position / 1e9, 6) for n, c in cells]
    assert report["command"].startswith("voice-gateway steps tiny") and report["machine"]["cpu_count"]
    assert (tmp_path / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_counts_are_refused(tmp_path: Path) -> None:
    assert main(["steps", "--rows", "0", "--out-dir", str(tmp_path)]) == 1
    assert main(["steps", "--contexts", "many", "--out-dir", str(tmp_path)]) == 1
    assert main(["steps", "--replays", "0", "--out-dir", str(tmp_path)]) == 1
    assert main(["steps", "--prompts", "0,100", "--out-dir", str(tmp_path)]) == 1  # not pieces of 128
    assert not (tmp_path / "steps.json").exists()
