"""What `voice-gateway bench` prints when a run ends: a sweep's, a realtime run's, a ladder's, its rounds' and a
soak's tables and lines (the JSON and figures are the record; these are for the person watching)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from bench.image import ImageInfo
from bench.stats import LevelResult, StageSteps
from bench.sweep import BenchResult
from bench.timeline import Window
from bench.video import VideoInfo
from bench.voice import VoiceResult
from bench.voice_stats import TurnStats, VoiceLevelResult


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _before_engine(lv: LevelResult | VoiceLevelResult) -> str:
    """What a level's requests waited before the engine began them, and the vision tower's share of its steps."""
    parts = []
    if (isinstance(lv, LevelResult) and lv.server_http_ttft_mean_s is not None
            and lv.server_ttft_mean_s is not None):
        parts.append(f"{_fmt(lv.server_http_ttft_mean_s - lv.server_ttft_mean_s)} s of the server's TTFT")
    if lv.server_image_decode_mean_s is not None:
        parts.append(f"each picture decoded in {_fmt(lv.server_image_decode_mean_s)} s")
    if lv.server_crossing_mean_s is not None:
        parts.append(f"crossing to the engine's process {_fmt(lv.server_crossing_mean_s)} s")
    if lv.server_vision_tower_calls:
        parts.append(f"then the vision tower {lv.server_vision_tower_calls} calls of "
                     f"{_fmt(1e3 * (lv.server_vision_tower_mean_s or 0.0), '.1f')} ms")
    return "; ".join(parts)


def print_summary(result: BenchResult, console: Console) -> None:
    table = Table(title=f"bench {result.label} ({result.config['model']})")
    for col in ("P", "C", "req/s", "refused", "fail", "TTFT mean/p99", "TTFP mean/p50/p99", "server TTFT/TTFP (from arrival)", "RTF mean/p99",
                "gap p99 ms", "audio s", "underruns", "client lag p99 ms"):
        table.add_column(col, justify="right")
    for lv in result.levels:
        table.add_row(str(lv.prompt_words), str(lv.concurrency), _fmt(lv.req_per_s, ".2f"), str(lv.refused),
                      str(lv.failures),
                      f"{_fmt(lv.ttft_s.mean)}/{_fmt(lv.ttft_s.p99)}",
                      f"{_fmt(lv.ttfp_s.mean)}/{_fmt(lv.ttfp_s.p50)}/{_fmt(lv.ttfp_s.p99)}",
                      f"{_fmt(lv.server_ttft_mean_s)}/{_fmt(lv.server_ttfp_mean_s)}"
                      f" ({_fmt(lv.server_http_ttft_mean_s)}/{_fmt(lv.server_http_ttfp_mean_s)})",
                      f"{_fmt(lv.rtf.mean)}/{_fmt(lv.rtf.p99)}", _fmt(lv.chunk_gap_ms.p99, ".0f"),
                      _fmt(lv.audio_s_mean, ".2f"), f"{lv.underruns} ({lv.underrun_requests} req)",
                      _fmt(lv.client_lag_ms.p99, ".1f"))
    console.print(table)
    shown = [_picture(result.image)] if result.image is not None else []
    shown += [_clip(result.video)] if result.video is not None else []
    if shown:
        means = "; ".join(f"P={lv.prompt_words} C={lv.concurrency} {_fmt(lv.image_tokens_mean, '.0f')} of "
                          f"{_fmt(lv.prompt_tokens_mean, '.0f')}" for lv in result.levels)
        console.print(f"{' and '.join(shown)} in each request: image tokens of prompt tokens (mean): {means}")
    for lv in result.levels:
        if lv.server_vision_tower_calls or lv.server_crossing_mean_s is not None:
            console.print(f"P={lv.prompt_words} C={lv.concurrency} before the engine: {_before_engine(lv)}")
    for lv in result.levels:
        if lv.server_steps:
            console.print(f"P={lv.prompt_words} C={lv.concurrency} steps: {_steps(lv.server_steps)}")


def _steps(steps: dict[str, StageSteps]) -> str:
    """Each stage's share of the level's wall time and its mean step, busiest first."""
    busiest = sorted(steps.items(), key=lambda item: -item[1].busy_share)
    return ", ".join(f"{name} {100 * s.busy_share:.0f} % ({s.mean_ms:.1f} ms x {s.steps})" for name, s in busiest)


def _picture(image: ImageInfo) -> str:
    which = "" if image.distinct == 1 else f" ({image.distinct} distinct, in turn)"
    return f"the {image.width}x{image.height} {image.format.upper()} of {image.size_bytes / 1024:.0f} KiB{which}"


def _clip(video: VideoInfo) -> str:
    length = "unstated length" if video.seconds is None else f"{video.seconds:g} s"
    return (f"the {video.width}x{video.height} {video.format.upper()} of {length} and "
            f"{video.size_bytes / 1024:.0f} KiB")


def _turn_row(lv_label: list[str], t: TurnStats) -> list[str]:
    return [*lv_label, "all" if t.turn is None else str(t.turn + 1), str(t.turns), f"{t.failures} ({t.refused})",
            f"{_fmt(t.first_audio_s.mean)}/{_fmt(t.first_audio_s.p50)}/{_fmt(t.first_audio_s.p99)}",
            _fmt(t.vad_wait_s.mean), f"{_fmt(t.speech_end_s.p50)}/{_fmt(t.speech_end_s.p99)}",
            f"{_fmt(t.engine_first_packet_s.mean)}/{_fmt(t.engine_first_packet_s.p99)}", _fmt(t.done_s.mean),
            _fmt(t.audio_s_mean, ".2f"),
            f"{_fmt(t.input_tokens_mean, '.0f')} ({_fmt(t.cached_tokens_mean, '.0f')})", f"{t.underruns} ({t.underrun_turns})"]


def print_voice_summary(result: VoiceResult, console: Console) -> None:
    table = Table(title=f"bench --realtime {result.label} ({result.config['model']})")
    for col in ("mode", "out", "C", "turn", "n", "fail (refused)", "first audio mean/p50/p99 s", "VAD wait s",
                "speech end -> audio p50/p99 s", "engine first packet mean/p99 s", "done s", "audio s",
                "in tokens (cached)", "underruns (turns)"):
        table.add_column(col, justify="left" if col in ("mode", "out", "turn") else "right")
    for lv in result.levels:
        label = [lv.mode, lv.output_format, str(lv.concurrency)]
        table.add_row(*_turn_row(label, lv.overall), style="bold")
        for t in lv.by_turn:
            table.add_row(*_turn_row(["", "", ""], t))
        table.add_section()
    console.print(table)
    for lv in result.levels:
        ratio = lv.later_turn_ratio
        opus = f"; {lv.overall.offset_errors} Opus packets out of place" if lv.output_format == "opus" else ""
        picture = "" if result.image is None else (
            f"; the conversation's pictures ({_picture(result.image)} each) took "
            f"{_fmt(lv.overall.image_tokens_mean, '.0f')} of {_fmt(lv.overall.input_tokens_mean, '.0f')} input "
            "tokens (mean)")
        console.print(f"{lv.mode} {lv.output_format} C={lv.concurrency}: {lv.turns_per_s:.2f} turns/s; slowest later "
                      f"turn / first turn p50 {_fmt(ratio.p50, '.2f')}, p99 {_fmt(ratio.p99, '.2f')}; server "
                      f"speech_stopped -> first audio mean {_fmt(lv.server_turn_latency_mean_s)} s; client lag p99 "
                      f"{_fmt(lv.client_lag_ms.p99, '.1f')} ms{opus}{picture}")
        if lv.turns_not_started:
            console.print(f"{lv.mode} {lv.output_format} C={lv.concurrency}: stopped at the time limit, "
                          f"{lv.turns_not_started} turns not started")
        if lv.server_vision_tower_calls or lv.server_crossing_mean_s is not None:
            console.print(f"{lv.mode} {lv.output_format} C={lv.concurrency} before the engine: {_before_engine(lv)}")
        if lv.server_steps:
            console.print(f"{lv.mode} {lv.output_format} C={lv.concurrency} steps: {_steps(lv.server_steps)}")
        if growth := _growth(lv.timeline):
            console.print(f"{lv.mode} {lv.output_format} C={lv.concurrency} steps over the call: {growth}")
        if parts := _parts_by_turn(lv.by_turn):
            console.print(f"{lv.mode} {lv.output_format} C={lv.concurrency} engine first packet by part, {parts}")


def _parts_by_turn(by_turn: list[TurnStats]) -> str:
    """Each part's mean at the first turn index that reports them and at the last (one turn: that one)."""
    shown = [(t.turn + 1, t.engine_first_packet_parts_mean_s) for t in by_turn
             if t.turn is not None and t.engine_first_packet_parts_mean_s]
    if not shown:
        return ""
    (first_turn, first), (last_turn, last) = shown[0], shown[-1]
    if first_turn == last_turn:
        return f"turn {first_turn}: " + ", ".join(f"{p} {_fmt(s)} s" for p, s in first.items())
    return f"turn {first_turn} -> {last_turn}: " + ", ".join(
        f"{p} {_fmt(s)} -> {_fmt(last.get(p))} s" for p, s in first.items())


def _growth(timeline: list[Window]) -> str:
    """Each stage's mean step in the first window that ended turns and in the last, with their median turns."""
    ended = [w for w in timeline if w.turn_median is not None]
    if len(ended) < 2:
        return ""
    first, last = ended[0], ended[-1]
    shared = sorted(set(first.steps) & set(last.steps))
    where = f"turn {first.turn_median + 1:.0f} -> {last.turn_median + 1:.0f}"  # type: ignore[operator]
    grown = [f"{k} {first.steps[k].mean_ms:.1f} -> {last.steps[k].mean_ms:.1f} ms" for k in shared]
    if first.prompt_tokens_per_step is not None and last.prompt_tokens_per_step is not None:
        grown.append(f"thinker prompt tokens a step {first.prompt_tokens_per_step:.0f} -> {last.prompt_tokens_per_step:.0f}")
    parts = sorted(set(first.engine_first_packet_parts_mean_s) & set(last.engine_first_packet_parts_mean_s))
    if parts:
        grown.append("first packet " + ", ".join(f"{p} {first.engine_first_packet_parts_mean_s[p]:.3f} -> "
                                                 f"{last.engine_first_packet_parts_mean_s[p]:.3f} s" for p in parts))
    return f"{where}: " + ", ".join(grown)


def print_ladder_summary(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="ladder: each row at its highest concurrency")
    for col in ("row", "status", "P", "C", "req/s", "TTFP mean", "TTFP p99", "server TTFP", "RTF mean", "fail"):
        table.add_column(col, justify="left" if col in ("row", "status") else "right")
    for row in rows:
        top = max((lv["concurrency"] for lv in row["levels"]), default=None)
        status = row["status"] if row["status"] == "ok" else f"[red]{row['status']}[/]"
        shown = [lv for lv in row["levels"] if lv["concurrency"] == top]
        if not shown:
            table.add_row(row["name"], status, *["-"] * 8)
        for lv in shown:
            table.add_row(row["name"], status, str(lv["prompt_words"]), str(lv["concurrency"]),
                          _fmt(lv["req_per_s"], ".2f"), _fmt(lv["ttfp_s"]["mean"]), _fmt(lv["ttfp_s"]["p99"]),
                          _fmt(lv.get("server_ttfp_mean_s")), _fmt(lv["rtf"]["mean"]), str(lv["failures"]))
    console.print(table)


def print_rounds_summary(rounds: dict[str, Any], console: Console) -> None:
    table = Table(title=f"ladder: {rounds['count']} rounds, each row against {rounds['reference']} in the same round")
    for col in ("row", "P", "C", "rounds", "TTFP mean", "stdev", f"minus {rounds['reference']}", "stderr", "min .. max"):
        table.add_column(col, justify="left" if col == "row" else "right")
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:+.0f} ms"

    for row in rounds["rows"]:
        for lv in row["levels"]:
            own, diff = lv["ttfp_mean_s"], lv["minus_reference_s"]
            table.add_row(row["name"], str(lv["prompt_words"]), str(lv["concurrency"]), str(own["n"]),
                          _fmt(own["mean"]), _fmt(own["stdev"]), ms(diff and diff["mean"]),
                          "-" if not diff or diff["stderr"] is None else f"{diff['stderr'] * 1000:.0f} ms",
                          "-" if not diff else f"{ms(diff['min'])} .. {ms(diff['max'])}")
    console.print(table)


def print_soak_summary(label: str, summary: dict[str, Any], console: Console) -> None:
    table = Table(title=f"soak {label}: {summary['requests']} requests in {summary['traffic_s']} s")
    for col in ("kind", "requests", "failed", "latency mean/p99 s"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for kind, row in summary["by_kind"].items():
        table.add_row(kind, str(row["requests"]), str(row["failed"]),
                      f"{_fmt(row['latency_s']['mean'])}/{_fmt(row['latency_s']['p99'])}")
    console.print(table)
    rss, fds = summary["rss_mib"], summary["fds"]
    console.print(f"RSS {rss['start']} -> {rss['end']} MiB (peak {rss['peak']}, {rss['slope_per_1k_requests']} MiB "
                  f"per 1000 requests late in the run); fds {fds['start']} -> {fds['end']} (peak {fds['peak']})")
