"""A long realtime run as benchmarks/ keeps it: the whole JSON (a record per turn, megabytes) is committed once,
then replaced by this summary, which names that commit's file (`summary_of`) and keeps everything but the records,
plus what the pages read from it: per range of turns, first audio and the engine's own first packet turn by turn,
where that packet's time went, the prompts and their cached share, and the turns behind playback.

`voice-gateway bench summarize RUN.json --of COMMIT:PATH` writes it beside the run as RUN-summary.json."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.config import BenchError

DEFAULT_RANGES = ((1, 5), (6, 20), (21, 40), (41, 60), (61, 80), (81, 100))
ABOUT = ("the run's JSON less each turn's record (levels[].records); turn_ranges from by_turn: per range of turns "
         "(1-based), each turn's first-audio p50 and the engine's own first packet p50 (min, median, max), the "
         "engine's first packet by part (mean over the range's turn means), the mean prompt tokens and cached share "
         "over the turns that completed, turns behind playback and failures")


def parse_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """"1-5,6-20": 1-based, inclusive, in order, not overlapping."""
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        try:
            first, last = (int(n) for n in part.split("-"))
        except ValueError:
            raise BenchError(f"--ranges: {part!r} is not FIRST-LAST (e.g. 1-5)") from None
        if not 1 <= first <= last or (ranges and first <= ranges[-1][1]):
            raise BenchError(f"--ranges: {part!r} must start at 1 or after the range before it, and end at or after "
                             "its start")
        ranges.append((first, last))
    return tuple(ranges)


def summarize_run(run: dict[str, Any], of: str, ranges: tuple[tuple[int, int], ...] = DEFAULT_RANGES) -> dict[str, Any]:
    """`run`, a realtime result (bench --realtime's JSON), without its records; `of` names where the whole is kept
    (COMMIT:PATH). Ranges past the run's last turn are left out."""
    if run.get("benchmark") != "realtime":
        raise BenchError(f"a realtime run's JSON is summarized, not {run.get('benchmark')!r}")
    if ":" not in of:
        raise BenchError(f"--of: COMMIT:PATH of the whole run, got {of!r}")
    out: dict[str, Any] = {"summary_of": of, "summary": ABOUT, **run}
    out["levels"] = [_level(dict(level), ranges) for level in run["levels"]]
    return out


def _level(level: dict[str, Any], ranges: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    records = level.pop("records")
    behind = sorted(r["turn"] + 1 for r in records if r.get("underruns"))
    level["first_turn_behind"] = behind[0] if behind else None
    last = max((t["turn"] + 1 for t in level["by_turn"]), default=0)
    level["turn_ranges"] = [_range(level["by_turn"], a, b) for a, b in ranges if a <= last]
    return level


def _range(by_turn: list[dict[str, Any]], first: int, last: int) -> dict[str, Any]:
    turns = [t for t in by_turn if first <= t["turn"] + 1 <= last]

    def spread(key: str) -> dict[str, float] | None:
        p50s = [t[key]["p50"] for t in turns if t[key]["p50"] is not None]
        return {"min": min(p50s), "median": statistics.median(p50s), "max": max(p50s)} if p50s else None

    def weighted(key: str) -> float | None:
        pairs = [(t[key], t["completed"]) for t in turns if t[key] is not None]
        done = sum(n for _, n in pairs)
        return sum(x * n for x, n in pairs) / done if done else None

    parts = [t["engine_first_packet_parts_mean_s"] for t in turns if t.get("engine_first_packet_parts_mean_s")]
    return {
        "turns": f"{first}-{last}",
        "first_audio_p50_s": spread("first_audio_s"),
        "engine_first_packet_p50_s": spread("engine_first_packet_s"),
        "engine_first_packet_parts_mean_s": {k: statistics.mean(p[k] for p in parts) for k in parts[0]} if parts else None,
        "input_tokens_mean": weighted("input_tokens_mean"),
        "cached_share_mean": weighted("cached_share_mean"),
        "completed": sum(t["completed"] for t in turns),
        "refused": sum(t["refused"] for t in turns),
        "underrun_turns": sum(t["underrun_turns"] for t in turns),
        "failures": sum(t["failures"] for t in turns),
    }


def summarize_file(path: Path, of: str, ranges: tuple[tuple[int, int], ...] = DEFAULT_RANGES,
                   out: Path | None = None) -> Path:
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot read {path}: {exc}") from None
    target = out or path.with_name(f"{path.stem}-summary.json")
    target.write_text(json.dumps(summarize_run(run, of, ranges), indent=1))
    return target
