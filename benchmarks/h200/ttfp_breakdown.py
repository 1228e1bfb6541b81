"""Where one reply's time to first packet goes, stage by stage, at batch 1 on the GPU.

Builds the engine's parts for a profile without starting the stage threads and times, for one
~50-token prompt: the Thinker prefill, the Talker's prompt and prefill, one Talker frame (decode +
code predictor + sampling tail) and a 4-frame streaming Code2Wav chunk. Then profiles both
prefills (torch.profiler) and prints their top operators by device and by host time.

    PYTHONPATH=. python3 benchmarks/h200/ttfp_breakdown.py --profile benchmarks/h200/dummy-decode-attention.yaml --out ttfp.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.h200.timing import median_wall_ms, synced_ms
from engine import Message, TextPart, load_profile
from engine.models.build import build_engine_parts
from engine.models.code2wav_stream import StreamBatch
from engine.models.sampler import RowSampling


def wall_ms(fn, iters: int = 5) -> dict[str, float]:
    cold = synced_ms(fn)
    return {"cold_ms": cold, "warm_ms": median_wall_ms(fn, iters, warmup=0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    parts = build_engine_parts("dummy", load_profile(args.profile, model="dummy"), None)
    thinker, talker, code2wav = (parts["stages"][n] for n in ("thinker", "talker", "code2wav"))
    words = " ".join(["please tell me about the weather"] * 6)
    prompt = parts["prompt_builder"].build((Message("user", (TextPart(words),)),)).token_ids
    tr, th = talker.runner, thinker.runner
    result: dict = {"gpu": torch.cuda.get_device_name(), "profile": str(args.profile), "prompt_tokens": len(prompt)}
    with torch.inference_mode():
        def thinker_prefill():
            slot = th.kv.allocate()
            try:
                return th.prefill([slot], [prompt], [[]], want_hidden=True)[0]
            finally:
                th.kv.free(slot)

        out = thinker_prefill()
        first = th.embed([1000])[0]
        speaker = "ethan" if "ethan" in tr.speaker_ids else next(iter(tr.speaker_ids))

        def talker_prefill():
            slot = tr.kv.allocate()
            try:
                embeds = tr.prompt_embeds(prompt, out.embeds, out.hidden, first, speaker)
                return tr.prefill([slot], [embeds])
            finally:
                tr.kv.free(slot)

        hidden = torch.randn(1, tr.codec_embedding.embedding_dim, device="cuda", dtype=tr.dtype)
        rows = [RowSampling(0.9, 0.8, 50, 1)]

        def talker_frame():
            logits, last = tr.decode([0], [60], hidden)
            code0 = logits.argmax(-1)
            return tr.residual_codes(last, code0, rows)

        codes = torch.randint(0, 2048, (1, 16, 4), device="cuda")
        chunk = StreamBatch(codes, torch.arange(1), torch.full((1,), 4), torch.zeros(1, dtype=torch.long))
        result["thinker_prefill"] = wall_ms(thinker_prefill)
        result["talker_prefill"] = wall_ms(talker_prefill)
        result["talker_frame"] = wall_ms(talker_frame)
        result["code2wav_chunk4"] = wall_ms(lambda: code2wav.stream.decode(chunk))
        print(json.dumps(result, indent=1), flush=True)
        for name, fn in (("thinker_prefill", thinker_prefill), ("talker_prefill", talker_prefill)):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            for key in ("cuda_time_total", "cpu_time_total"):
                table = prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60)
                result[f"{name}_top_{key}"] = table
                print(f"== {name} by {key}\n{table}", flush=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
