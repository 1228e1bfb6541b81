"""The same-run baseline row: plain transformers `generate(return_audio=True)`, one request at a time.

Full-size Qwen3-Omni with random bf16 weights on the GPU; the reply is forced to the workload's
40 text tokens and 125 codec frames (random weights never stop on their own). Audio exists only
when generate() returns, so TTFP is the whole call.

    PYTHONPATH=. python3 benchmarks/h200/generate_baseline.py --out baseline.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from engine.models.full_size import full_size_config_dict


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration

    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = Qwen3OmniMoeForConditionalGeneration._from_config(
            Qwen3OmniMoeConfig(**full_size_config_dict()), dtype=torch.bfloat16
        ).eval()
    load_s = time.perf_counter() - t0
    prompt = torch.tensor([[151644, 872, 198, *range(1000, 1030), 151645, 198, 151644, 77091, 198]], device="cuda")
    runs = []
    for i in range(args.runs + 1):  # the first is warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            sequences, wav = model.generate(
                prompt, speaker="ethan", thinker_max_new_tokens=40, thinker_min_new_tokens=40,
                talker_max_new_tokens=126, talker_min_new_tokens=126, return_audio=True,
            )
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        audio_s = wav.reshape(-1).shape[0] / 24_000
        if i:
            runs.append({"total_s": seconds, "ttfp_s": seconds, "audio_s": audio_s, "rtf": seconds / audio_s,
                         "text_tokens": sequences.shape[-1] - prompt.shape[-1]})
        print(f"run {i}: {seconds:.1f} s for {audio_s:.2f} s of audio", flush=True)
    report = {"what": "transformers generate(return_audio=True), c=1, full-size dummy bf16", "load_s": load_s,
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": runs}
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
