"""The realtime bench's pure parts: one turn's events and Opus packets folded into its record, the playback model
by sample offset, per-turn statistics, and its command line (the live runs are in
tests/bench/test_bench_realtime.py)."""

from __future__ import annotations

import argparse
import base64
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bench
from bench import BenchError, TurnRecord, TurnTimer, VoiceConfig, scheduled_underruns, summarize_voice_level
from bench.cli import voice_config_from_args
from bench.realtime_session import realtime_url, session_update, think_pause_s
from bench.timeline import Snapshot, windows
from bench.turn import TurnError
from tests.conftest import REPO
from voice_gateway.realtime.events import (
    RetentionRatio,
    SessionConfig,
    SessionUpdate,
    apply_session_update,
    parse_client_event,
)


def _event(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


def _delta(seconds: float) -> str:
    return _event("response.output_audio.delta", delta=base64.b64encode(b"\0\0" * int(seconds * 24_000)).decode())


def _packet(offset: int, sequence: int = 0) -> bytes:
    return struct.pack(">III", sequence, sequence * 960, offset) + b"\xfc"


def _done(status: str = "completed", response_id: str = "resp_1", **details: object) -> str:
    response = {"id": response_id, "status": status,
                "usage": {"input_tokens": 70, "output_token_details": {"audio_tokens": 16}}}
    if details:
        response["status_details"] = details
    return _event("response.done", response=response)


def _record() -> TurnRecord:
    return TurnRecord(session=3, turn=1, question="egg", speech_s=3.4)


# ----------------------------------------------------------------------------- one turn

def test_a_committed_turn_times_first_audio_from_the_commit() -> None:
    rec = _record()
    timer = TurnTimer(rec, vad=False)
    timer.on_message(_event("input_audio_buffer.committed", item_id="i"), 9.9)  # before input end: ignored
    timer.input_ended(10.0)
    for t in (10.3, 10.5, 10.9):  # 0.2 s chunks: the third is due at 10.7, so it is 0.2 s late
        timer.on_message(_delta(0.2), t)
    timer.on_message(_done(), 11.2)
    timer.finish()
    assert rec.ok and rec.status == "completed" and rec.vad_wait_s is None
    assert rec.first_audio_s == pytest.approx(0.3) and rec.done_s == pytest.approx(1.2)
    assert rec.audio_s == pytest.approx(0.6) and rec.pieces == 3
    assert (rec.underruns, rec.stall_ms) == (1, pytest.approx(200.0))
    assert (rec.input_tokens, rec.audio_frames) == (70, 16)
    assert rec.played_out_s == pytest.approx(0.3 + 0.6 + 0.2)


def test_server_vad_ends_the_input_at_speech_stopped_and_times_the_silence() -> None:
    rec = _record()
    timer = TurnTimer(rec, vad=True)
    timer.question_sent(5.0)
    timer.on_message(_event("input_audio_buffer.speech_stopped", audio_end_ms=3400, item_id="i"), 5.6)
    timer.on_message(_delta(0.5), 5.8)
    timer.on_message(_done(), 6.0)
    timer.finish()
    assert rec.vad_wait_s == pytest.approx(0.6) and rec.first_audio_s == pytest.approx(0.2)
    assert timer.input_end == 5.6


def test_response_timing_gives_the_turn_the_engines_first_packet_by_part() -> None:
    """Our extension's event follows response.done; one for another response (an earlier turn's, late) is not
    this turn's."""
    def timing(response_id: str, engine_ms: int) -> str:
        parts = {"queued_ms": 2, "thinker_ms": 50, "talker_prefill_ms": 5, "talker_frames_ms": 20, "code2wav_ms": 3}
        return _event("response.timing", response_id=response_id, turn_ms=None, reply_started_ms=1,
                      first_audio_ms=95, engine_first_packet_ms=engine_ms, first_packet_parts_ms=parts)

    rec = _record()
    timer = TurnTimer(rec, vad=False)
    timer.input_ended(0.0)
    timer.on_message(timing("resp_0", 500), 0.05)  # the turn before's, late
    timer.on_message(_delta(0.5), 0.1)
    assert not timer.awaits_timing
    timer.on_message(_done(response_id="resp_1"), 0.3)
    assert timer.done and timer.awaits_timing
    timer.on_message(timing("resp_0", 500), 0.31)
    assert timer.awaits_timing and rec.engine_first_packet_s is None
    timer.on_message(timing("resp_1", 80), 0.31)
    timer.finish()
    assert not timer.awaits_timing and rec.ok
    assert rec.engine_first_packet_s == pytest.approx(0.08)
    assert rec.first_packet_parts_s == pytest.approx({"queued": 0.002, "thinker": 0.05, "talker_prefill": 0.005,
                                                      "talker_frames": 0.02, "code2wav": 0.003})
    silent = TurnTimer(_record(), vad=False)  # no audio: no response.timing to wait for
    silent.input_ended(0.0)
    silent.on_message(_done(), 0.5)
    assert silent.done and not silent.awaits_timing


def test_speech_stopped_before_the_question_ended_is_an_error() -> None:
    timer = TurnTimer(_record(), vad=True)
    with pytest.raises(TurnError, match="before the question had been sent"):
        timer.on_message(_event("input_audio_buffer.speech_stopped", audio_end_ms=900, item_id="i"), 1.0)


def test_opus_packets_play_at_their_sample_offsets() -> None:
    rec = _record()
    timer = TurnTimer(rec, vad=False)
    timer.input_ended(0.0)
    # 20 ms packets: 0 and 480 on time, then 1440 (960 missing) late by 30 ms against its own offset
    for offset, t in ((0, 0.1), (480, 0.11), (1440, 0.19)):
        timer.on_message(_packet(offset), t)
    timer.on_message(_done(), 0.3)
    timer.finish()
    assert rec.pieces == 3 and rec.offset_errors == 1
    assert rec.audio_s == pytest.approx(0.08)  # up to the end of the last packet's offset
    assert (rec.underruns, rec.stall_ms) == (1, pytest.approx(30.0))


def test_error_events_failed_responses_and_silent_replies_end_the_turn() -> None:
    timer = TurnTimer(_record(), vad=False)
    timer.input_ended(0.0)
    with pytest.raises(TurnError) as err:
        timer.on_message(_event("error", error={"code": "server_overloaded", "message": "busy"}), 0.1)
    assert err.value.code == "server_overloaded"
    with pytest.raises(TurnError, match="response failed: engine_failed") as err:
        timer.on_message(_done("failed", type="failed", error={"code": "engine_failed", "message": "x"}), 0.2)
    silent = TurnTimer(_record(), vad=False)
    silent.input_ended(0.0)
    silent.on_message(_done(), 0.5)
    with pytest.raises(TurnError, match="no audio"):
        silent.finish()
    early = TurnTimer(_record(), vad=True)
    with pytest.raises(TurnError, match="before the input ended"):
        early.on_message(_packet(0), 0.1)
    with pytest.raises(TurnError, match="no Opus packet"):
        early.on_message(b"\0" * 12, 0.1)


def test_scheduled_underruns_equal_the_chunk_model_for_contiguous_audio() -> None:
    arrivals = [(0.0, 0.1), (0.05, 0.1), (0.35, 0.1), (0.4, 0.1), (0.9, 0.2)]
    starts = [(t, 0.1 * i) for i, (t, _) in enumerate(arrivals)]
    assert scheduled_underruns(starts) == pytest.approx(bench.playback_underruns(arrivals))
    assert scheduled_underruns(starts) == (2, pytest.approx(150.0 + 350.0))  # due 0.2 and 0.4 + 0.15
    assert scheduled_underruns([]) == (0, 0.0)


# ----------------------------------------------------------------------------- statistics

def _turn(session: int, turn: int, first_audio_s: float | None, **fields: Any) -> TurnRecord:
    return TurnRecord(session, turn, "q", 3.0, ok=first_audio_s is not None, first_audio_s=first_audio_s,
                      audio_s=1.0, input_tokens=50 * (turn + 1), **fields)


def test_voice_level_stats_by_turn_index_and_overall() -> None:
    records = [_turn(0, 0, 0.2), _turn(0, 1, 0.3, underruns=2), _turn(0, 2, 0.24),
               _turn(1, 0, 0.4), _turn(1, 1, None, error="boom"),
               _turn(2, 0, None, refused=True, error="busy")]
    lv = summarize_voice_level("commit", "opus", 3, 3, records, wall_s=2.0)
    assert (lv.overall.turns, lv.overall.completed, lv.overall.failures, lv.overall.refused) == (6, 4, 1, 1)
    assert lv.turns_per_s == pytest.approx(2.0)
    assert [t.turn for t in lv.by_turn] == [0, 1, 2]
    first, second, third = lv.by_turn
    assert first.first_audio_s.mean == pytest.approx(0.3) and first.refused == 1 and first.turns == 3
    assert (second.completed, second.failures, second.underruns, second.underrun_turns) == (1, 1, 2, 1)
    assert second.input_tokens_mean == 100 and third.first_audio_s.p50 == pytest.approx(0.24)
    # only the first conversation has a first turn and a later one: its slowest later turn took 1.5x its first
    assert lv.later_turn_ratio.mean == pytest.approx(1.5)
    assert lv.overall.vad_wait_s == bench.Stat()


def test_a_time_limit_counts_the_turns_it_left_not_started() -> None:
    """Four conversations of four turns: one whole, one stopped by the limit after two turns, one ended by its
    failed second turn (those two turns are its failure's), one never begun."""
    records = [*(_turn(0, t, 0.2) for t in range(4)), _turn(1, 0, 0.2), _turn(1, 1, 0.3),
               _turn(2, 0, 0.2), _turn(2, 1, None, error="boom")]
    lv = summarize_voice_level("commit", "pcm16", 4, 4, records[::-1], wall_s=2.0, turns=4)
    assert lv.turns_not_started == 2 + 4
    assert summarize_voice_level("commit", "pcm16", 4, 4, records, wall_s=2.0).turns_not_started == 0  # not asked


def test_a_long_run_summarized_by_ranges_of_turns(tmp_path: Path) -> None:
    """Two conversations of seven turns: the summary drops the records and keeps, per range reached, each turn's
    first-audio p50 spread, prompts weighted by completed turns, and turns behind; the whole run is named."""
    from dataclasses import asdict

    from bench.config import BenchError
    from bench.shrink import parse_ranges, summarize_file, summarize_run

    records = [_turn(s, t, 0.1 * (t + 1) + 0.01 * s, underruns=int(s == 1 and t == 6)) for s in (0, 1) for t in range(7)]
    level = asdict(summarize_voice_level("commit", "pcm16", 2, 2, records, wall_s=7.0, turns=7))
    run = {"benchmark": "realtime", "label": "long", "levels": [level]}
    out = summarize_run(run, "abc1234:benchmarks/x/long.json", parse_ranges("1-5,6-20,21-40"))
    assert out["summary_of"] == "abc1234:benchmarks/x/long.json" and "records" not in out["levels"][0]
    (lv,) = out["levels"]
    assert lv["first_turn_behind"] == 7 and [r["turns"] for r in lv["turn_ranges"]] == ["1-5", "6-20"]
    first, later = lv["turn_ranges"]
    assert first["first_audio_p50_s"]["min"] == pytest.approx(0.105)  # turn 1's p50 over both conversations
    assert first["first_audio_p50_s"]["median"] == pytest.approx(0.305) and first["completed"] == 10
    assert first["input_tokens_mean"] == pytest.approx(150.0)  # 50, 100, ..., 250
    assert (later["completed"], later["underrun_turns"], later["failures"]) == (4, 1, 0)
    assert run["levels"][0]["records"]  # the run itself is left as it was
    path = tmp_path / "long.json"
    path.write_text(json.dumps(run))
    assert summarize_file(path, "abc1234:benchmarks/x/long.json") == tmp_path / "long-summary.json"
    with pytest.raises(BenchError, match="COMMIT:PATH"):
        summarize_run(run, "long.json")
    for bad in ("5-1", "1-5,3-9", "x"):
        with pytest.raises(BenchError, match="--ranges"):
            parse_ranges(bad)
    # the command line: `voice-gateway bench summarize RUN.json [SUMMARY.json] --of COMMIT:PATH`
    done = subprocess.run([sys.executable, "-m", "voice_gateway.cli", "bench", "summarize", str(path),
                           str(tmp_path / "kept.json"), "--of", "abc1234:benchmarks/x/long.json", "--ranges", "1-3"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    kept = json.loads((tmp_path / "kept.json").read_text())
    assert [r["turns"] for r in kept["levels"][0]["turn_ranges"]] == ["1-3"]


# ----------------------------------------------------------------------------- command line

def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    return parser.parse_args(list(argv))


def test_realtime_flags_make_a_voice_config() -> None:
    args = _parse("--realtime", "--concurrency", "1,16,64", "--turns", "6", "--turn-mode", "commit,vad",
                  "--output-format", "opus", "--max-tokens", "12", "--input-speed", "2", "--client-processes", "4",
                  "--spread-s", "3.5", "--think-s", "2")
    cfg = voice_config_from_args(args, ["voice-gateway", "bench", "--realtime"])
    assert cfg.spread_s == 3.5 and cfg.think_s == 2.0
    assert (cfg.concurrency, cfg.turns, cfg.turn_mode, cfg.output_format) == ([1, 16, 64], 6, ["commit", "vad"], ["opus"])
    assert (cfg.max_tokens, cfg.input_speed, cfg.client_processes, cfg.chunk_ms) == (12, 2.0, 4, 40)
    assert cfg.levels()[:2] == [("commit", "opus", 1), ("commit", "opus", 16)] and len(cfg.levels()) == 6
    assert cfg.questions == Path("benchmarks/voice") and cfg.label.startswith("voice-")
    default = voice_config_from_args(_parse("--realtime"), [])
    assert (default.concurrency, default.turns, default.turn_mode, default.output_format) == (
        [1, 16, 64], 6, ["commit"], ["pcm16"])
    with pytest.raises(bench.BenchError, match="--realtime does not take --prompt-tokens"):
        voice_config_from_args(_parse("--realtime", "--prompt-tokens", "10"), [])
    with pytest.raises(SystemExit):
        _parse("--realtime", "--turn-mode", "semantic")
    with pytest.raises(bench.BenchError, match="input_speed"):
        VoiceConfig(input_speed=0)
    with pytest.raises(bench.BenchError, match="spread_s"):
        VoiceConfig(spread_s=-1)
    with pytest.raises(bench.BenchError, match="think_s"):
        VoiceConfig(think_s=-1)


def test_users_pause_a_seeded_while_before_each_turn() -> None:
    config = VoiceConfig(think_s=2.0, input_speed=4.0)
    pauses = [think_pause_s(config, index, turn) for index in range(8) for turn in range(1, 11)]
    assert all(0 <= p <= 0.5 for p in pauses) and len(set(pauses)) == len(pauses)  # at 4x: up to 0.5 s, all apart
    assert pauses == [think_pause_s(config, index, turn) for index in range(8) for turn in range(1, 11)]
    assert think_pause_s(VoiceConfig(), 3, 5) == 0.0


def test_realtime_only_flags_without_realtime_are_refused(tmp_path: Path) -> None:
    argv = ["--turns", "3", "--out-dir", str(tmp_path)]
    assert bench.bench_main(_parse(*argv), argv) == 2
    assert not list(tmp_path.iterdir())


def test_the_session_asks_for_its_mode_and_format() -> None:
    manual = session_update(VoiceConfig(max_tokens=9), "commit", "opus")["session"]
    assert manual["audio"]["input"]["turn_detection"] is None
    assert manual["audio"]["output"]["format"] == {"type": "audio/opus"} and manual["max_output_tokens"] == 9
    vad = session_update(VoiceConfig(), "vad", "pcm16")["session"]
    assert vad["audio"]["input"]["turn_detection"] == {"type": "server_vad"}
    assert vad["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert realtime_url("http://127.0.0.1:8000/", "tiny") == "ws://127.0.0.1:8000/v1/realtime?model=tiny&timing=1"


def test_a_retention_ratio_reaches_the_session_as_the_server_reads_it() -> None:
    """--retention-ratio R: the session's truncation keeps R of the room at a cut; none named, the server's auto."""
    def truncation(config: VoiceConfig) -> object:
        event = parse_client_event(json.dumps(session_update(config, "commit", "pcm16")))
        assert isinstance(event, SessionUpdate)
        return apply_session_update(SessionConfig(), event).truncation

    assert truncation(VoiceConfig()) == "auto"
    assert truncation(VoiceConfig(retention_ratio=0.5)) == RetentionRatio(type="retention_ratio", retention_ratio=0.5)
    with pytest.raises(BenchError, match="retention_ratio"):
        VoiceConfig(retention_ratio=1.5)


def test_timeline_windows_hold_the_turns_and_steps_between_two_snapshots() -> None:
    """bench/timeline.py: a window per pair of snapshots, its turns those that ended inside it, its steps and
    first packets the histograms' growth across it."""
    def sums(thinker_s: float, thinker_n: float, ttfp_s: float, ttfp_n: float,
             prompt_steps: float = 0, prompt_tokens: float = 0) -> dict[str, tuple[float, float]]:
        return {"engine_stage_step_seconds{phase=decode,stage=thinker}": (thinker_s, thinker_n),
                "engine_stage_step_seconds{phase=prefill,stage=thinker}": (0.1 * prompt_steps, prompt_steps),
                "engine_thinker_step_tokens{kind=prompt}": (prompt_tokens, thinker_n + prompt_steps),
                "engine_ttfp_seconds": (ttfp_s, ttfp_n)}

    shots = [Snapshot(100.0, sums(0, 0, 0, 0)), Snapshot(110.0, sums(1.0, 50, 0.6, 2, 4, 2000)),
             Snapshot(120.0, sums(1.0, 50, 0.6, 2, 4, 2000))]
    records = [TurnRecord(session=s, turn=t, question="q", speech_s=1.0, ok=ok, first_audio_s=fa, ended_at=at)
               for s, t, ok, fa, at in ((0, 0, True, 0.2, 101.0), (1, 0, True, 0.4, 109.0), (0, 1, False, None, 105.0),
                                        (0, 2, True, 0.5, 115.0), (1, 1, True, 0.5, 125.0))]
    first, second = windows(shots, records)
    assert (first.start_s, first.end_s, first.turns, first.turn_median) == (0.0, 10.0, 2, 0.0)
    assert first.first_audio_p50_s == pytest.approx(0.3) and first.engine_ttfp_mean_s == pytest.approx(0.3)
    assert first.steps["thinker/decode"].steps == 50 and first.steps["thinker/decode"].mean_ms == pytest.approx(20)
    assert first.prompt_tokens_per_step == pytest.approx(500)  # 2,000 prompt tokens over its 4 prompt steps
    # nothing stepped in the second; its one turn (the last ended after the final snapshot)
    assert (second.turns, second.turn_median, second.engine_ttfp_mean_s, second.steps) == (1, 2.0, None, {})
    assert second.prompt_tokens_per_step is None
    assert windows(shots[:1], records) == []


def test_the_summary_says_how_each_stage_step_grew_over_the_call() -> None:
    from bench.stats import StageSteps
    from bench.summary import _growth
    from bench.timeline import Window

    def window(turn: float | None, ms: float) -> Window:
        return Window(0.0, 10.0, 0 if turn is None else 4, turn, None, None, {"thinker/decode": StageSteps(9, ms, 0.5)})

    assert _growth([window(0, 12.0), window(None, 30.0), window(49, 19.5)]) == "turn 1 -> 50: thinker/decode 12.0 -> 19.5 ms"
    first, last = window(0, 12.0), window(49, 19.5)
    first.prompt_tokens_per_step, last.prompt_tokens_per_step = 130.0, 840.0
    assert _growth([first, last]).endswith("thinker/decode 12.0 -> 19.5 ms, thinker prompt tokens a step 130 -> 840")
    first.engine_first_packet_parts_mean_s, last.engine_first_packet_parts_mean_s = {"thinker": 0.05}, {"thinker": 0.2}
    assert _growth([first, last]).endswith("130 -> 840, first packet thinker 0.050 -> 0.200 s")
    assert _growth([window(0, 12.0)]) == ""
