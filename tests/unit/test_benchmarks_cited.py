"""The benchmark results the docs cite are the files kept under benchmarks/, and the headline numbers of the
performance pages (docs/performance.md and its topics, docs/performance/) are the values in those files: every
`benchmarks/...` path README.md or a docs page names exists, every file under benchmarks/ is named, and each figure
in `FIGURES` is written on one page only, which cites its file, and equals its JSON value rounded as written.
README's results are a table of at most six rows, each linking the page that is its numbers' home: the page
writes every number of the row, and each bold (measured) one is a figure of that page checked here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# the overview, then a page per topic: a headline number has one home among them
PERFORMANCE = (DOCS / "performance.md", *sorted((DOCS / "performance").glob("*.md")))

# A path under benchmarks/ as the pages write it. Not one inside another path or after a commit
# (`853b89e:benchmarks/...` names a file of history), and not a pattern (`dummy-<row>.yaml`, `*.json`).
_CITED = re.compile(r"(?<![\w:/.-])benchmarks/[\w./-]*[\w/](?![\w./<*{-])")

# Folders kept whole, whose files the pages may name by the folder alone (none at present).
KEPT_WHOLE: tuple[str, ...] = ()


@dataclass(frozen=True)
class Figure:
    """One number of a performance page: `quote` is the text around it as the page has it, `number` the
    number as written there, `key` the path to its value in `file` (`/`-separated; `name=x` picks the
    list item whose `name` is x), and `scale` what the value is multiplied by for the unit written."""

    quote: str
    number: str
    file: str
    key: str
    scale: float = 1.0


_GPU = "benchmarks/h200/gpu-profile/"
_OVERLOAD = "benchmarks/h200/overload/"
_LADDER = "benchmarks/h200/ladder/ladder.json"
_HISTORY = "benchmarks/h200/switch-history/ladder.json"
_VOICE = "benchmarks/h200/voice-traffic/"
_C64 = "levels/concurrency=64"
_STEP = "benchmarks/h200/one-step/"
_RAMP = _STEP + "gentle-ramp/"
_SHIPPED = _STEP + "shipped-profile/"
_SPLIT_KV = "benchmarks/h200/long-call/context-8192-split-kv/long-c32-t80-summary.json"
_H100 = "benchmarks/h100/long-call/fp8-32-slots/"
_RANGE = "levels/0/turn_ranges/turns="
_KERNEL = "benchmarks/h200/ladder-128-kernel/"
_FIRST = "benchmarks/h100/finishing-first/"

FIGURES = (
    # One step for everybody
    Figure("6686bcc) | 16.86 | 1.235 s (1.323)", "16.86", _STEP + "thinker/chat640-c64-waves.json", "levels/0/req_per_s"),
    Figure("| 16.86 | 1.235 s (1.323)", "1.235", _STEP + "thinker/chat640-c64-waves.json", "levels/0/ttfp_s/mean"),
    Figure("1.235 s (1.323) | 0.378", "1.323", _STEP + "thinker/chat640-c64-waves.json", "levels/0/ttfp_s/p99"),
    Figure("(1.323) | 0.378 |", "0.378", _STEP + "thinker/chat640-c64-waves.json", "levels/0/rtf/mean"),
    Figure("| 0.378 | 4/192 |", "4", _STEP + "thinker/chat640-c64-waves.json", "levels/0/underrun_requests"),
    Figure("| 10.2 | 0.306 s (0.474)", "10.2", _STEP + "thinker/chat640-c64-steady.json", "levels/0/req_per_s"),
    Figure("| 10.2 | 0.306 s (0.474)", "0.306", _STEP + "thinker/chat640-c64-steady.json", "levels/0/ttfp_s/mean"),
    Figure("| 0.538 | 229/256 |", "229", _STEP + "thinker/chat640-c64-steady.json", "levels/0/underrun_requests"),
    Figure("c=64 at 22.07 req/s, 0.304 s", "22.07", _STEP + "thinker/chat10-c64.json", "levels/0/req_per_s"),
    Figure("c=64 at 22.07 req/s, 0.304 s", "0.304", _STEP + "thinker/chat10-c64.json", "levels/0/ttfp_s/mean"),
    Figure("f9cda99) | 12.57 | 1.124 s (1.763)", "12.57", _STEP + "all-stages/chat640-c64-waves.json", "levels/0/req_per_s"),
    Figure("| 12.57 | 1.124 s (1.763)", "1.124", _STEP + "all-stages/chat640-c64-waves.json", "levels/0/ttfp_s/mean"),
    Figure("1.124 s (1.763) | 0.486", "1.763", _STEP + "all-stages/chat640-c64-waves.json", "levels/0/ttfp_s/p99"),
    Figure("(1.763) | 0.486 |", "0.486", _STEP + "all-stages/chat640-c64-waves.json", "levels/0/rtf/mean"),
    Figure("| 0.486 | 119/192 |", "119", _STEP + "all-stages/chat640-c64-waves.json", "levels/0/underrun_requests"),
    Figure("| 9.80 | 0.357 s (0.610)", "9.80", _STEP + "all-stages/chat640-c64-steady.json", "levels/0/req_per_s"),
    Figure("| 9.80 | 0.357 s (0.610)", "0.357", _STEP + "all-stages/chat640-c64-steady.json", "levels/0/ttfp_s/mean"),
    Figure("| 0.561 | 235/256 |", "235", _STEP + "all-stages/chat640-c64-steady.json", "levels/0/underrun_requests"),
    Figure("| PCM16, packed stages | 0.320 s (0.710)", "0.320", _STEP + "all-stages/realtime-c64.json",
           "levels/0/overall/first_audio_s/p50"),
    Figure("| PCM16, packed stages | 0.320 s (0.710) | 114/384", "114", _STEP + "all-stages/realtime-c64.json",
           "levels/0/overall/underrun_turns"),
    Figure("| Opus, packed stages | 0.332 s (0.458)", "0.332", _STEP + "all-stages/realtime-c64.json",
           "levels/1/overall/first_audio_s/p50"),
    Figure("| Opus, packed stages | 0.332 s (0.458) | 282/384", "282", _STEP + "all-stages/realtime-c64.json",
           "levels/1/overall/underrun_turns"),
    # the gentle ramp and the step budget
    *(Figure(f"{row}/chat640-c64-waves.json`) | {rps}", rps, f"{_RAMP}{row}/chat640-c64-waves.json", "levels/0/req_per_s")
      for row, rps in (("slack-budget", "5.65"), ("budget-4096", "13.34"), ("budget-2048", "13.66"))),
    *(Figure(f"| {ttfp} s ({p99}) | {rtf} | {behind}/192 |", number, f"{_RAMP}{row}/chat640-c64-waves.json", key)
      for row, ttfp, p99, rtf, behind in (("slack-budget", "5.184", "10.52", "0.981", "1"),
                                          ("budget-4096", "0.975", "1.656", "0.468", "65"),
                                          ("budget-2048", "0.861", "1.865", "0.457", "98"))
      for number, key in ((ttfp, "levels/0/ttfp_s/mean"), (p99, "levels/0/ttfp_s/p99"), (rtf, "levels/0/rtf/mean"),
                          (behind, "levels/0/underrun_requests"))),
    *(Figure(f"| {rps} | {ttfp} s ({p99}) | {rtf} | {behind}/256 |", number, f"{_RAMP}{row}/chat640-c64-steady.json", key)
      for row, rps, ttfp, p99, rtf, behind in (("slack-budget", "11.08", "0.298", "0.459", "0.487", "23"),
                                               ("budget-4096", "10.44", "0.289", "0.403", "0.523", "0"),
                                               ("budget-2048", "10.17", "0.305", "0.444", "0.540", "6"))
      for number, key in ((rps, "levels/0/req_per_s"), (ttfp, "levels/0/ttfp_s/mean"), (p99, "levels/0/ttfp_s/p99"),
                          (rtf, "levels/0/rtf/mean"), (behind, "levels/0/underrun_requests"))),
    *(Figure(f"{name} | {p50} s ({p99}) | {behind}/384", number, f"{_RAMP}{row}/realtime-c64.json", f"levels/{level}/{key}")
      for name, row, level, p50, p99, behind in (
          ("budget shrunk by slack (`benchmarks/h200/one-step/gentle-ramp/slack-budget/realtime-c64.json`)",
           "slack-budget", 0, "0.332", "0.785", "0"),
          ("4,096-token budget (`benchmarks/h200/one-step/gentle-ramp/budget-4096/realtime-c64.json`)",
           "budget-4096", 0, "0.338", "0.764", "33"),
          ("2,048-token budget (`benchmarks/h200/one-step/gentle-ramp/budget-2048/realtime-c64.json`)",
           "budget-2048", 0, "0.340", "0.823", "28"),
          ("Opus, + gentle ramp, budget shrunk by slack", "slack-budget", 1, "0.379", "0.575", "12"),
          ("Opus, gentle ramp, 4,096-token budget", "budget-4096", 1, "0.421", "0.828", "39"),
          ("Opus, gentle ramp, 2,048-token budget", "budget-2048", 1, "0.352", "0.688", "4"))
      for number, key in ((p50, "overall/first_audio_s/p50"), (p99, "overall/first_audio_s/p99"),
                          (behind, "overall/underrun_turns"))),
    Figure("21.85 req/s, 0.236 s, none behind", "21.85", _RAMP + "budget-2048/chat10-c64.json", "levels/0/req_per_s"),
    Figure("21.85 req/s, 0.236 s, none behind", "0.236", _RAMP + "budget-2048/chat10-c64.json", "levels/0/ttfp_s/mean"),
    # the seed's sweep, as shipped: c=1 and c=16 levels alternate per length, as do c=32 and c=64
    *(Figure(f"| {tokens} | {c1} s | {c16} s |", number, _RAMP + "sweep/chat-sweep-c1-c16.json", f"levels/{level}/ttfp_s/mean")
      for i, (tokens, c1, c16) in enumerate((("19", "0.073", "0.123"), ("181", "0.079", "0.171"),
                                             ("353", "0.082", "0.178"), ("699", "0.086", "0.260")))
      for number, level in ((c1, 2 * i), (c16, 2 * i + 1))),
    *(Figure(f"| {c32} s{extra} | {rps} | {ttfp} s ({p99}) | {rtf} | {behind}/128 |", number,
             _RAMP + "sweep/chat-sweep-c32-c64.json", f"levels/{level}/{key}")
      for i, (c32, extra, rps, ttfp, p99, rtf, behind) in enumerate((
          ("0.154", "", "24.41", "0.227", "0.255", "0.260", "0"), ("0.274", "", "21.04", "0.369", "0.490", "0.300", "0"),
          ("0.371", "", "20.03", "0.532", "0.774", "0.313", "0"),
          ("0.534", " (4/64 behind)", "16.56", "0.807", "1.323", "0.374", "12")))
      for number, level, key in ((c32, 2 * i, "ttfp_s/mean"), (rps, 2 * i + 1, "req_per_s"),
                                 (ttfp, 2 * i + 1, "ttfp_s/mean"), (p99, 2 * i + 1, "ttfp_s/p99"),
                                 (rtf, 2 * i + 1, "rtf/mean"), (behind, 2 * i + 1, "underrun_requests"))),
    # Where the GPU profile stands
    Figure("| c=1 TTFP <= 0.15 s | 0.077 s", "0.077", _OVERLOAD + "overload-c1.json", "levels/0/ttfp_s/mean"),
    Figure("0.077 s (p99 0.097 s)", "0.097", _OVERLOAD + "overload-c1.json", "levels/0/ttfp_s/p99"),
    Figure("| c=64 >= 15 req/s | 25.41 req/s", "25.41", _OVERLOAD + "overload-c64.json", "levels/0/req_per_s"),
    Figure("| 0.277 s (p99 0.373 s)", "0.277", _OVERLOAD + "overload-c64.json", "levels/0/ttfp_s/mean"),
    Figure("0.277 s (p99 0.373 s)", "0.373", _OVERLOAD + "overload-c64.json", "levels/0/ttfp_s/p99"),
    Figure("| c=64 RTF <= 0.35 | 0.251", "0.251", _OVERLOAD + "overload-c64.json", "levels/0/rtf/mean"),
    Figure("| 0.267 s (p99 0.385 s), 0 of 206", "0.267", _OVERLOAD + "overload-c128.json", "levels/0/ttfp_s/mean"),
    Figure("0.267 s (p99 0.385 s)", "0.385", _OVERLOAD + "overload-c128.json", "levels/0/ttfp_s/p99"),
    Figure("0 of 206 underran", "206", _OVERLOAD + "overload-c128.json", "levels/0/completed"),
    Figure("306 of 512 refused", "306", _OVERLOAD + "overload-c128.json", "levels/0/refused"),
    Figure("22.05 req/s served", "22.05", _OVERLOAD + "overload-c128.json", "levels/0/req_per_s"),
    Figure("c=1 TTFP 0.079 s (p99 0.108 s)", "0.079", _GPU + "gpu-profile-c1.json", "levels/0/ttfp_s/mean"),
    Figure("c=1 TTFP 0.079 s (p99 0.108 s)", "0.108", _GPU + "gpu-profile-c1.json", "levels/0/ttfp_s/p99"),
    Figure("c=64 24.66 req/s", "24.66", _GPU + "gpu-profile-c64.json", "levels/0/req_per_s"),
    Figure("TTFP 0.292 s (p50 0.280,\np99 0.405)", "0.292", _GPU + "gpu-profile-c64.json", "levels/0/ttfp_s/mean"),
    Figure("TTFP 0.292 s (p50 0.280,\np99 0.405)", "0.405", _GPU + "gpu-profile-c64.json", "levels/0/ttfp_s/p99"),
    Figure("RTF 0.258, no underrun", "0.258", _GPU + "gpu-profile-c64.json", "levels/0/rtf/mean"),
    Figure("30.1 s to its only audio", "30.1", _HISTORY, "rows/name=baseline/levels/concurrency=1/ttfp_s/mean"),
    # What each switch bought: the ladder
    Figure("| 0.095 s | 22.23 |", "22.23", _LADDER, f"rows/name=cuda-graphs/{_C64}/req_per_s"),
    Figure("| 22.23 | 0.466 s (0.532)", "0.466", _LADDER, f"rows/name=cuda-graphs/{_C64}/ttfp_s/mean"),
    Figure("| 0.083 s | 20.34 |", "20.34", _LADDER, f"rows/name=first-packet/{_C64}/req_per_s"),
    Figure("| 20.34 | 0.671 s (1.051)", "0.671", _LADDER, f"rows/name=first-packet/{_C64}/ttfp_s/mean"),
    Figure("| 0.086 s | 23.83 |", "23.83", _LADDER, f"rows/name=engine-process/{_C64}/req_per_s"),
    Figure("| 23.83 | 0.309 s (0.371)", "0.309", _LADDER, f"rows/name=engine-process/{_C64}/ttfp_s/mean"),
    Figure("| 0.081 s | 24.98 |", "0.081", _LADDER, "rows/name=gpu-profile/levels/concurrency=1/ttfp_s/mean"),
    Figure("| 0.081 s | 24.98 |", "24.98", _LADDER, f"rows/name=gpu-profile/{_C64}/req_per_s"),
    Figure("| 24.98 | 0.288 s (0.332)", "0.288", _LADDER, f"rows/name=gpu-profile/{_C64}/ttfp_s/mean"),
    Figure("| 0.288 s (0.332) | 0.254 |", "0.254", _LADDER, f"rows/name=gpu-profile/{_C64}/rtf/mean"),
    # The history
    Figure("slot KV cache | 10.92 |", "10.92", _HISTORY, f"rows/name=decode-attention/{_C64}/req_per_s"),
    Figure("in the decode graphs | 18.86 |", "18.86", _HISTORY, f"rows/name=compiled-decode/{_C64}/req_per_s"),
    Figure("of its own | 24.86 | 0.344 s", "0.344", _HISTORY, f"rows/name=engine-process/{_C64}/ttfp_s/mean"),
    Figure("Code2Wav deferral | 23.82 | 0.287 s", "0.287", _HISTORY, f"rows/name=code2wav-defers/{_C64}/ttfp_s/mean"),
    # Ray's cost
    Figure("| `held/` | 0.528 s | +5 ms", "+5", "benchmarks/cpu-tiny/ray/held/ladder.json",
           "rounds/rows/name=engine-process/levels/0/minus_reference_s/mean", 1000),
    Figure("| +21 ms (stderr 12) |", "+21", "benchmarks/cpu-tiny/ray/held/ladder.json",
           "rounds/rows/name=ray-one-replica/levels/0/minus_reference_s/mean", 1000),
    Figure("| -13 ms (stderr 18) |", "-13", "benchmarks/cpu-tiny/ray/held-2/ladder.json",
           "rounds/rows/name=ray-one-replica/levels/0/minus_reference_s/mean", 1000),
    # Voice traffic
    Figure("| 700 | 13.09 | 1.5 s (2.243)", "13.09", _VOICE + "chat-sweep.json",
           "levels/prompt_words=640,concurrency=64/req_per_s"),
    Figure("| Opus, before (`benchmarks/h200/voice-traffic/realtime-c64-opus.json`) | 0.478 s", "0.478",
           _VOICE + "realtime-c64-opus.json", "levels/0/overall/first_audio_s/p50"),
    Figure("| 0.478 s (0.701) | 285/384 |", "285", _VOICE + "realtime-c64-opus.json", "levels/0/overall/underrun_turns"),
    Figure("| c=1, commit, PCM16 (`realtime-c1.json`) | 6 | 0.102 s", "0.102", _VOICE + "realtime-c1.json",
           "levels/0/overall/first_audio_s/p50"),
    Figure("takes 0.214 s against 0.178 s", "0.214", _VOICE + "chat-input-audio.json", "levels/0/ttfp_s/mean"),
    Figure("takes 0.214 s against 0.178 s", "0.178", _VOICE + "chat-text-44-c16.json", "levels/0/ttfp_s/mean"),
    # CPU
    Figure("0.263 s against\n2.856 s at c=1", "0.263", "benchmarks/cpu-tiny/async-chunk-on.json", "levels/0/ttfp_s/mean"),
    Figure("0.263 s against\n2.856 s at c=1", "2.856", "benchmarks/cpu-tiny/async-chunk-off.json", "levels/0/ttfp_s/mean"),
    Figure("+24.06 MiB per 1,000 requests", "24.06", "benchmarks/cpu-tiny/soak/soak.json",
           "summary/rss_mib/slope_per_1k_requests"),
    Figure("1200 mixed requests", "1200", "benchmarks/cpu-tiny/soak/soak.json", "summary/requests"),
    # the seed's sweep as shipped: the levels by prompt length (words asked) and concurrency
    *(Figure(f"| {tokens} | {c1} s | {c16} s | {c32} s | {rps} | {ttfp} s ({p99}) | {rtf} | 0/128 |"
             if tokens != "699" else f"| 699 | {c1} s | {c16} s | {c32} s | {rps} | **{ttfp} s ({p99})** | {rtf} | **0/128** |",
             number, _SHIPPED + "chat-sweep.json", f"levels/prompt_words={words},concurrency={c}/{key}")
      for tokens, words, c1, c16, c32, rps, ttfp, p99, rtf in (
          ("19", 10, "0.099", "0.138", "0.220", "23.63", "0.311", "0.376", "0.267"),
          ("181", 160, "0.108", "0.215", "0.282", "20.04", "0.471", "0.628", "0.314"),
          ("353", 320, "0.110", "0.214", "0.301", "20.37", "0.488", "0.687", "0.310"),
          ("699", 640, "0.104", "0.269", "0.388", "18.25", "0.590", "0.927", "0.344"))
      for number, c, key in ((c1, 1, "ttfp_s/mean"), (c16, 16, "ttfp_s/mean"), (c32, 32, "ttfp_s/mean"),
                             (rps, 64, "req_per_s"), (ttfp, 64, "ttfp_s/mean"), (p99, 64, "ttfp_s/p99"),
                             (rtf, 64, "rtf/mean"), ("0", 64, "underrun_requests"))),
    *(Figure("| 699, arriving steadily (256) | | | | 9.56 | 0.345 s (0.619) | 0.578 | 61/256 |", number,
             _SHIPPED + "chat640-c64-steady.json", f"levels/0/{key}")
      for number, key in (("9.56", "req_per_s"), ("0.345", "ttfp_s/mean"), ("0.619", "ttfp_s/p99"),
                          ("0.578", "rtf/mean"), ("61", "underrun_requests"))),
    # long calls at the GPU profile's context: the fourth run's summary
    Figure("(median 0.62) against", "0.62", _SPLIT_KV, f"{_RANGE}61-80/first_audio_p50_s/median"),
    Figure("(median 0.15), ~4.1x", "0.15", _SPLIT_KV, f"{_RANGE}1-5/first_audio_p50_s/median"),
    Figure("cached share after turn 2 93 %", "93", _SPLIT_KV, f"{_RANGE}3-80/cached_share_mean", 100),
    Figure("207 of 2,560 turns", "207", _SPLIT_KV, "levels/0/overall/underrun_turns"),
    Figure("one before turn 51 (at turn 43)", "43", _SPLIT_KV, "levels/0/first_turn_behind"),
    *(Figure(f"| {turns} | {low}-{high} s | {tokens} | {cached} % | {behind} | 0 |", number, file, f"{_RANGE}{turns}/{key}",
             scale)
      for file, turns, low, high, tokens, cached, behind in (
          (_SPLIT_KV, "1-5", "0.132", "0.165", "243", "52", "0"), (_SPLIT_KV, "61-80", "0.351", "0.862", "4,879", "93", "134"),
          (_H100 + "long-c32-t80-summary.json", "61-80", "0.247", "0.681", "4,810", "93", "104"),
          (_H100 + "long-c32-t80-think2-summary.json", "61-80", "0.179", "0.521", "4,789", "93", "97"))
      for number, key, scale in ((low, "first_audio_p50_s/min", 1.0), (high, "first_audio_p50_s/max", 1.0),
                                 (cached, "cached_share_mean", 100.0), (behind, "underrun_turns", 1.0))),
    # 128 voices: the code predictor's attention kernel, three runs of the bf16-128 row
    *(Figure(f"| {run} | 19 | 128 | 256 / 0 | {rps} | {ttfp} s ({p99}) | {rtf} | 0 |", number, file, f"{level}/{key}")
      for run, file, level, rps, ttfp, p99, rtf in (
          ("1", _KERNEL + "run-1/bf16-128.json", "levels/0", "39.40", "0.316", "0.341", "0.322"),
          ("2", _KERNEL + "run-2/ladder.json", "rows/name=bf16-128/levels/concurrency=128,prompt_words=10",
           "38.13", "0.354", "0.393", "0.332"),
          ("3", _KERNEL + "run-3/bf16-128.json", "levels/0", "36.77", "0.348", "0.432", "0.345"))
      for number, key in ((rps, "req_per_s"), (ttfp, "ttfp_s/mean"), (p99, "ttfp_s/p99"), (rtf, "rtf/mean"),
                          ("0", "underrun_requests"))),
    # the assistant on two cores
    *(Figure(f"| {users} | {p50} s ({p99}) |", number, "benchmarks/cpu-small/assistant-realtime.json",
             f"levels/concurrency={users}/overall/{key}")
      for users, p50, p99 in (("1", "0.565", "0.642"), ("4", "0.627", "1.380"))
      for number, key in ((p50, "first_audio_s/p50"), (p99, "first_audio_s/p99"))),
    Figure("| 0 of 10 | <= 0.9 s", "0", "benchmarks/cpu-small/assistant-realtime.json",
           "levels/concurrency=1/overall/underrun_turns"),
    Figure("| 1 of 40 (44 ms) |", "1", "benchmarks/cpu-small/assistant-realtime.json",
           "levels/concurrency=4/overall/underrun_turns"),
    # the assistant at a conversation's pace: streamed questions, the server's turn detection, before and after
    *(Figure(f"| {users} | {before} s ({before_p99}) | {after} s ({after_p99}) |", number,
             f"benchmarks/cpu-small/pace/{tree}.json", f"levels/{level}/overall/speech_end_s/{key}")
      for users, level, before, before_p99, after, after_p99 in (("1", 0, "2.031", "2.360", "1.118", "1.295"),
                                                                  ("4", 1, "2.180", "2.898", "1.605", "2.508"))
      for tree, p50, p99 in (("before", before, before_p99), ("after", after, after_p99))
      for number, key in ((p50, "p50"), (p99, "p99"))),
    *(Figure(f"turn decision: last chunk -> `speech_stopped` | {before} s | {after} s", number,
             f"benchmarks/cpu-small/pace/{tree}.json", "levels/0/overall/vad_wait_s/mean")
      for before, after in (("0.593", "0.720"),)
      for tree, number in (("before", before), ("after", after))),
    *(Figure(f"`speech_stopped` -> first audio | {before} s | {after} s", number,
             f"benchmarks/cpu-small/pace/{tree}.json", "levels/0/overall/first_audio_s/p50")
      for before, after in (("1.430", "0.385"),)
      for tree, number in (("before", before), ("after", after))),
    # the first clause sooner: Piper's first frames streamed, the language model's few-row steps in float16
    *(Figure(f"| {users} | {before} s ({before_p99}) | {after} s ({after_p99}) |", number,
             f"benchmarks/cpu-small/pace/first-clause-{tree}.json", f"levels/{level}/overall/speech_end_s/{key}")
      for users, level, before, before_p99, after, after_p99 in (("1", 0, "1.149", "1.308", "0.816", "0.920"),
                                                                  ("4", 1, "1.748", "2.238", "1.204", "2.049"))
      for tree, p50, p99 in (("before", before, before_p99), ("after", after, after_p99))
      for number, key in ((p50, "p50"), (p99, "p99"))),
    Figure("end of speech -> first audio heard p50 0.730 s", "0.730", "benchmarks/cpu-small/pace/browser-demo.json",
           "total_ms/p50", scale=0.001),
    # long calls on an H100, with and without the users' pauses
    *(Figure("130 and 137 of 2,560 turns behind", number, f"benchmarks/h100/long-call/fp8-32-slots/{name}-summary.json",
             "levels/0/overall/underrun_turns") for number, name in (("130", "long-c32-t80"), ("137", "long-c32-t80-think2"))),
    # turns that finish first, on an H100 as shipped
    *(Figure(f"| {turns} | {first_audio} s | {engine} s |", number, _FIRST + "h100-long-c32-t80-summary.json",
             f"{_RANGE}{turns}/{key}/median")
      for turns, first_audio, engine in (("1-5", "0.132", "0.126"), ("61-80", "0.666", "0.650"))
      for number, key in ((first_audio, "first_audio_p50_s"), (engine, "engine_first_packet_p50_s"))),
    Figure("31 fell behind playback", "31", _FIRST + "h100-long-c32-t80-summary.json", "levels/0/overall/underrun_turns"),
    Figure("first audio 0.468 s** (p50 0.385", "0.468", _FIRST + "h100-chat640-c64-waves.json", "levels/0/ttfp_s/mean"),
    Figure("first audio 0.468 s** (p50 0.385", "0.385", _FIRST + "h100-chat640-c64-waves.json", "levels/0/ttfp_s/p50"),
    Figure("0.296 s (p99 0.506), RTF 0.444", "0.296", _FIRST + "h100-chat640-c64-steady.json", "levels/0/ttfp_s/mean"),
    Figure("RTF 0.444, 12 of\n256 behind", "12", _FIRST + "h100-chat640-c64-steady.json",
           "levels/0/underrun_requests"),
)


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def _cited() -> set[str]:
    return {path for page in _pages() for path in _CITED.findall(page.read_text())}


def _kept() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def lookup(data: Any, key: str) -> Any:
    """The value at `key` in a loaded JSON: `/`-separated keys and list indices; `a=x,b=y` picks the one list
    item whose fields a and b read x and y."""
    for part in key.split("/"):
        if isinstance(data, list) and "=" in part:
            want = dict(pair.split("=", 1) for pair in part.split(","))
            found = [item for item in data if all(str(item.get(k)) == v for k, v in want.items())]
            assert len(found) == 1, f"{part!r} picks {len(found)} items"
            data = found[0]
        elif isinstance(data, list):
            data = data[int(part)]
        else:
            data = data[part]
    return data


def as_written(value: float, number: str, scale: float = 1.0) -> bool:
    """Whether `value` x `scale`, rounded to the decimals `number` is written with, reads `number`."""
    decimals = len(number.partition(".")[2])
    return round(value * scale, decimals) == float(number)


def test_cited_paths_exist() -> None:
    missing = sorted(path for path in _cited() if not (REPO / path).exists())
    assert not missing, f"README.md or docs/ name benchmark paths that are not in the tree: {missing}"


def test_every_kept_file_is_cited() -> None:
    cited = _cited()
    uncited = [path for path in _kept()
               if path not in cited and not any(path.startswith(folder) and folder in cited for folder in KEPT_WHOLE)]
    assert not uncited, f"files under benchmarks/ that README.md and docs/ do not name: {uncited}"


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f"{f.number}@{f.file.rsplit('/', 1)[-1]}")
def test_headline_figure_is_its_file_value(figure: Figure) -> None:
    homes = [path for path in PERFORMANCE if figure.quote in path.read_text()]
    assert len(homes) == 1, f"{figure.quote!r} is written on {len(homes)} performance pages, not one"
    name, page = homes[0].relative_to(REPO), homes[0].read_text()
    assert figure.number in figure.quote
    assert f"`{figure.file}`" in page or f"`{figure.file.rsplit('/', 1)[-1]}`" in page, \
        f"{name} does not cite {figure.file}"
    value = lookup(json.loads((REPO / figure.file).read_text()), figure.key)
    assert as_written(value, figure.number, figure.scale), \
        f"{figure.file} {figure.key} = {value!r}, {name} writes {figure.number}"


# The README's results: a short table whose every row links the page that is its numbers' home.
README = REPO / "README.md"
_NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_PAGE_LINK = re.compile(r"\]\((docs/[\w./-]+\.md)(?:#([\w-]+))?\)")


def results_rows(readme: str) -> list[list[str]]:
    """The rows of the table under README's `## Results`, as their cells (the header and its rule left out)."""
    section = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


def slug(heading: str) -> str:
    """A heading's anchor as the docs build makes it (Python-Markdown's toc)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def numbers(text: str) -> set[str]:
    return set(_NUMBER.findall(text))


_ROWS = results_rows(README.read_text())


def test_readme_results_are_a_table_of_at_most_six_rows() -> None:
    assert 0 < len(_ROWS) <= 6, f"README's results table has {len(_ROWS)} rows"


@pytest.mark.parametrize("row", _ROWS, ids=lambda row: row[0][:40])
def test_readme_result_row_is_written_on_its_page(row: list[str]) -> None:
    text = " | ".join(row)
    links = _PAGE_LINK.findall(text)
    assert len(links) == 1, f"a results row links one page, its numbers' home: {links}"
    path, anchor = links[0]
    page = (REPO / path).read_text()
    if anchor:
        headings = {slug(line.lstrip("#").strip()) for line in page.splitlines() if line.startswith("#")}
        assert anchor in headings, f"{path} has no heading #{anchor}"
    written = _PAGE_LINK.sub("]", text)
    missing = sorted(numbers(written) - numbers(page))
    assert not missing, f"README's row writes {missing}, which {path} does not"
    checked = {figure.number for figure in FIGURES if figure.quote in page}
    bold = {number for part in _BOLD.findall(written) for number in numbers(part)}
    assert bold, "a results row's measured numbers are bold"
    unchecked = sorted(bold - checked)
    assert not unchecked, f"README's bold {unchecked} are no figure of {path} that FIGURES checks against its file"


def test_a_readme_number_its_page_does_not_write_fails() -> None:
    readme = "x\n## Results\n\n| | measured | where |\n|---|---|---|\n| c=64 | **25.42** | [p](docs/performance.md) |\n"
    [row] = results_rows(readme)
    assert numbers(" | ".join(row)) - numbers((DOCS / "performance.md").read_text()) == {"25.42"}
    assert slug("At the GPU profile's 8,192-token context") == "at-the-gpu-profiles-8192-token-context"


def test_a_figure_off_by_its_last_digit_fails() -> None:
    levels = {"levels": [{"concurrency": 64, "ttfp_s": {"mean": 0.27704}}]}
    value = lookup(levels, "levels/concurrency=64/ttfp_s/mean")
    assert as_written(value, "0.277")
    assert not as_written(value, "0.278")
    assert as_written(value, "0.28") and not as_written(value, "0.29")
    assert as_written(value, "277", 1000)
