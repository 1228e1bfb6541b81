"""Tests for bench: pure helpers with hand-made inputs plus loopback end-to-end runs
against a minimal fake server (the ladder against real servers is in tests/bench/test_bench_ladder.py)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

import bench
from bench import (
    BenchConfig,
    RequestRecord,
    SSEDecoder,
    Stat,
    StreamTimer,
    playback_underruns,
    summarize_level,
)
from bench.speech import load_question, load_questions

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _pcm_b64(seconds: float) -> str:
    return base64.b64encode(b"\x00\x00" * int(round(seconds * bench.SAMPLE_RATE))).decode()


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": choices, **extra})


# ----------------------------------------------------------------------------- statistics

def test_stat_of_values_ignores_none() -> None:
    s = Stat.of([4.0, None, 1.0, 3.0, 2.0])
    assert s.mean == pytest.approx(2.5)
    assert s.p50 == pytest.approx(2.5)
    assert s.p99 == pytest.approx(3.97)  # numpy linear interpolation: 3 + 0.97 * (4 - 3)


def test_stat_of_empty_is_all_none() -> None:
    assert Stat.of([]) == Stat(None, None, None)
    assert Stat.of([None, None]) == Stat(None, None, None)


def test_summarize_level_counts_only_successes() -> None:
    ok1 = RequestRecord(0, 2, ok=True, ttft_s=0.1, ttfp_s=0.2, rtf=0.5, latency_s=1.0, prompt_tokens=20,
                        completion_tokens=50, audio_frames=10, audio_s=2.0, underruns=1, stall_ms=30.0,
                        chunk_gaps_ms=[10.0, 20.0])
    ok2 = RequestRecord(1, 2, ok=True, ttft_s=0.3, ttfp_s=0.4, rtf=1.5, latency_s=3.0, prompt_tokens=30,
                        completion_tokens=50, audio_frames=10, audio_s=4.0, underruns=0, stall_ms=10.0,
                        chunk_gaps_ms=[30.0])
    bad = RequestRecord(2, 2, ok=False, error="HTTP 500: boom", ttft_s=99.0, underruns=5)
    lv = summarize_level(2, [ok1, ok2, bad], wall_s=4.0, prompt_words=16)
    assert (lv.num_requests, lv.completed, lv.failures, lv.prompt_words) == (3, 2, 1, 16)
    assert lv.req_per_s == pytest.approx(0.5)
    assert lv.ttft_s.mean == pytest.approx(0.2)  # the failed record's 99 s is excluded
    assert lv.ttfp_s.p50 == pytest.approx(0.3)
    assert lv.rtf.mean == pytest.approx(1.0)
    assert lv.audio_s_mean == pytest.approx(3.0)
    assert (lv.underruns, lv.underrun_requests) == (1, 1)  # the failed record's 5 are excluded
    assert lv.stall_ms_mean == pytest.approx(20.0)
    assert lv.chunk_gap_ms.mean == pytest.approx(20.0) and lv.chunk_gap_ms.p50 == pytest.approx(20.0)
    assert lv.chunk_gap_ms.p99 == pytest.approx(29.8)
    assert (lv.prompt_tokens_mean, lv.completion_tokens_mean, lv.audio_frames_mean) == (25.0, 50.0, 10.0)


def test_summarize_level_all_failed() -> None:
    lv = summarize_level(1, [RequestRecord(0, 1, error="x")], wall_s=1.0)
    assert (lv.completed, lv.failures, lv.req_per_s) == (0, 1, 0.0)
    assert lv.ttfp_s == Stat() and lv.audio_s_mean is None and lv.chunk_gap_ms == Stat()
    assert lv.prompt_tokens_mean is None and lv.underrun_requests == 0


# ----------------------------------------------------------------------------- SSE parsing

def test_sse_decoder_events_comments_crlf_and_multiline() -> None:
    lines = [": keep-alive", "", "data: {\"a\": 1}\r", "", "event: x", "data: line1",
             "data:line2", "", "", "data: [DONE]", ""]
    dec = SSEDecoder()
    out = [d for d in (dec.feed(line) for line in lines) if d is not None]
    assert out == ['{"a": 1}', "line1\nline2", "[DONE]"]
    assert dec.flush() is None


def test_sse_decoder_flush_emits_event_without_trailing_blank_line() -> None:
    dec = SSEDecoder()
    assert dec.feed("data: [DONE]") is None
    assert dec.flush() == "[DONE]"


def test_stream_timer_measures_ttft_ttfp_rtf_and_usage() -> None:
    rec = RequestRecord(0, 1)
    timer = StreamTimer(rec, t_send=100.0)
    events = [
        (100.05, _chunk({"role": "assistant"})),
        (100.10, _chunk({"content": ""})),  # empty content must not count as first token
        (100.20, _chunk({"content": "Hi"})),
        (100.50, _chunk({"audio": {"id": "a1", "data": _pcm_b64(0.5), "transcript": "Hi"}})),
        (100.80, _chunk({"content": " there", "audio": {"data": _pcm_b64(0.25)}})),
        (101.00, _chunk({}, finish="stop")),
        (101.01, _chunk(usage={"prompt_tokens": 11, "completion_tokens": 7,
                               "completion_tokens_details": {"audio_tokens": 12}})),
        (101.02, "[DONE]"),
    ]
    for now, data in events:
        timer.on_data(data, now)
    timer.finish(now=105.0)  # connection close time is ignored once [DONE] arrived
    assert timer.done
    assert rec.ttft_s == pytest.approx(0.20)
    assert rec.ttfp_s == pytest.approx(0.50)
    assert rec.audio_s == pytest.approx(0.75)
    assert rec.rtf == pytest.approx(0.80 / 0.75)
    assert rec.latency_s == pytest.approx(1.02)
    assert (rec.finish_reason, rec.prompt_tokens, rec.completion_tokens, rec.audio_frames) == ("stop", 11, 7, 12)
    assert rec.chunk_gaps_ms == pytest.approx([300.0])  # between audio chunks only, not text events
    # playback: 0.5 s from t=0.5 plays until 1.0; the 2nd chunk arrives at 0.8 -> no stall
    assert (rec.underruns, rec.stall_ms) == (0, 0.0)


def test_stream_timer_text_only_has_no_audio_metrics() -> None:
    rec = RequestRecord(0, 1)
    timer = StreamTimer(rec, t_send=0.0)
    timer.on_data(_chunk({"content": "x"}), 0.3)
    timer.finish(0.4)
    assert not timer.done
    assert (rec.ttft_s, rec.ttfp_s, rec.rtf, rec.audio_s) == (0.3, None, None, 0.0)
    assert rec.latency_s == pytest.approx(0.4)


def test_stream_timer_raises_on_in_stream_error() -> None:
    timer = StreamTimer(RequestRecord(0, 1), t_send=0.0)
    with pytest.raises(bench.ServerStreamError, match="engine overloaded"):
        timer.on_data(json.dumps({"error": {"message": "engine overloaded"}}), 0.1)


# ----------------------------------------------------------------------------- playback model

def test_playback_no_audio() -> None:
    assert playback_underruns([]) == (0, 0.0)


def test_playback_continuous_stream_never_stalls() -> None:
    # Each 0.1 s chunk arrives before the previous one finishes playing.
    assert playback_underruns([(0.0, 0.1), (0.05, 0.1), (0.15, 0.1), (0.3, 0.1)]) == (0, 0.0)


def test_playback_counts_each_stall_and_resumes_from_arrival() -> None:
    arrivals = [(1.0, 0.1), (1.05, 0.1), (1.3, 0.1), (1.5, 0.2), (1.55, 0.1)]
    # buffer ends 1.2 -> stall 100 ms until 1.3, plays to 1.4 -> stall 100 ms until 1.5,
    # plays to 1.7; the last chunk arrives in time.
    count, stall_ms = playback_underruns(arrivals)
    assert count == 2
    assert stall_ms == pytest.approx(200.0)


# ----------------------------------------------------------------------------- request building / CLI

def test_build_payload_shapes() -> None:
    cfg = BenchConfig(max_tokens=33, seed=7)
    body = bench.build_payload(cfg, "m", 3, prompt_words=5)
    assert body["model"] == "m" and body["stream"] is True and body["max_tokens"] == 33
    assert body["modalities"] == ["text", "audio"] and body["seed"] == 7
    assert body["audio"] == {"format": "pcm16"}  # the server's default voice
    assert bench.build_payload(BenchConfig(voice="alloy"), "m", 0, prompt_words=1)["audio"]["voice"] == "alloy"
    assert body["stream_options"] == {"include_usage": True}
    assert len(body["messages"][0]["content"].split()) == 5
    assert body["messages"][0]["content"].startswith("#3 ")
    assert len(bench.build_payload(cfg, "m", 3, prompt_words=512)["messages"][0]["content"].split()) == 512
    text_only = bench.build_payload(BenchConfig(modalities=["text"], seed=None), "m", 0, prompt_words=4)
    assert "audio" not in text_only and "seed" not in text_only


def test_build_payload_with_input_audio_sends_the_files_in_turn() -> None:
    bodies = [bench.build_payload(BenchConfig(), "m", i, prompt_words=1, input_audio=["QQ==", "Qg=="]) for i in (4, 5)]
    assert [b["messages"][0]["content"] for b in bodies] == [
        [{"type": "text", "text": f"#{i}"}, {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]
        for i, data in ((4, "QQ=="), (5, "Qg=="))]


def test_questions_load_as_24khz_pcm16_and_chat_takes_the_file_as_is() -> None:
    questions = load_questions(REPO / "benchmarks" / "voice")
    assert [q.name for q in questions] == ["book", "egg", "sunset", "weather"]
    for q in questions:
        assert 2.0 <= q.duration_s <= 4.0, (q.name, q.duration_s)
        assert q.wav == (REPO / "benchmarks" / "voice" / f"{q.name}.wav").read_bytes()
        assert max(abs(v) for v in memoryview(q.pcm16).cast("h")) > 3000  # speech, not silence
    one = load_question(REPO / "benchmarks" / "voice" / "egg.wav")
    assert one == questions[1]


def test_a_question_that_is_not_16_bit_pcm_is_refused(tmp_path: Path) -> None:
    sf.write(tmp_path / "float.wav", np.zeros(1600, np.float32), 16_000, subtype="FLOAT")
    with pytest.raises(bench.BenchError, match="expected 16-bit PCM WAV"):
        load_question(tmp_path / "float.wav")
    with pytest.raises(bench.BenchError, match="no WAV files"):
        load_questions(tmp_path / "empty-dir-that-is-not-there")


def test_cli_arguments_parse() -> None:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    args = parser.parse_args(["--concurrency", "2,16", "--prompt-tokens", "16,128,512", "--modalities", "text",
                              "--label", "x"])
    cfg = bench.config_from_args(args, ["voice-gateway", "bench", "--concurrency", "2,16"])
    assert cfg.concurrency == [2, 16] and cfg.modalities == ["text"] and cfg.label == "x"
    assert cfg.prompt_tokens == [16, 128, 512]
    assert cfg.levels() == [(16, 2), (16, 16), (128, 2), (128, 16), (512, 2), (512, 16)]
    assert cfg.url == "http://127.0.0.1:8000" and cfg.warmup == 1 and cfg.model is None
    assert cfg.out_dir == Path("benchmarks/local")
    # unset sweep flags take BenchConfig's defaults: the DESIGN.md section 7 workload
    default = bench.config_from_args(parser.parse_args([]), [])
    assert default.concurrency == [1, 16, 32, 64] and default.max_tokens == 40 and default.prompt_tokens == [16]
    ladder = bench.config_from_args(parser.parse_args(["--ladder", "benchmarks/h200/ladder.yaml"]), [])
    assert ladder.out_dir == Path("benchmarks/local/ladder")
    assert parser.parse_args(["--rows", "baseline,stage-streams"]).rows == ["baseline", "stage-streams"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--concurrency", "0,4"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--modalities", "video"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--warmup", "-1"])


# ----------------------------------------------------------------------------- end to end

class _FakeOmni(BaseHTTPRequestHandler):
    """Minimal OpenAI-style server: streams text, three 0.1 s audio chunks, usage, [DONE]."""

    fail = 0  # answer every POST with this status
    requests: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._send_json(200, {"object": "list", "data": [{"id": "fake-omni", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if type(self).fail == 429:
            self.send_response(429)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if type(self).fail:
            self._send_json(type(self).fail, {"error": {"message": "broken", "type": "server_error"}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        audio = "audio" in body["modalities"]
        chunks = [_chunk({"role": "assistant"}), _chunk({"content": "Hello"})]
        if audio:
            chunks += [_chunk({"audio": {"id": "a", "data": _pcm_b64(0.1), "transcript": "Hello"}})
                       for _ in range(3)]
        chunks += [_chunk({}, finish="stop"),
                   _chunk(usage={"completion_tokens": 5,
                                 "completion_tokens_details": {"audio_tokens": 6 if audio else 0}}),
                   "[DONE]"]
        for data in chunks:
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()


@pytest.fixture
def fake_server() -> Iterator[tuple[str, type[_FakeOmni]]]:
    handler = type("Handler", (_FakeOmni,), {"fail": 0, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_run_bench_end_to_end_writes_json_and_png(fake_server, tmp_path: Path) -> None:
    url, handler = fake_server
    cfg = BenchConfig(url=url, concurrency=[1, 3], warmup=2, label="e2e", out_dir=tmp_path,
                      argv=["voice-gateway", "bench", "--label", "e2e"], prompt_tokens=[8])
    result = await bench.run_bench(cfg)

    # 2 warm-ups + max(2C, 4) requests per level
    assert len(handler.requests) == (2 + 4) + (2 + 6)
    assert {r["model"] for r in handler.requests} == {"fake-omni"}
    assert [lv.num_requests for lv in result.levels] == [4, 6]
    for lv in result.levels:
        assert lv.failures == 0 and lv.completed == lv.num_requests
        assert lv.audio_s_mean == pytest.approx(0.3)
        assert lv.ttfp_s.p50 is not None and lv.rtf.p99 is not None and lv.req_per_s > 0
        assert all(r.audio_frames == 6 and r.finish_reason == "stop" for r in lv.records)
        assert [r.index for r in lv.records] == list(range(lv.num_requests))  # warm-ups excluded

    data = json.loads((tmp_path / "e2e.json").read_text())
    assert data["schema_version"] == 2 and data["label"] == "e2e"
    assert data["command"] == "voice-gateway bench --label e2e"
    assert data["config"]["model"] == "fake-omni" and data["config"]["concurrency"] == [1, 3]
    assert data["server_models"]["data"][0]["id"] == "fake-omni"
    assert {"platform", "cpu_count", "python"} <= data["machine"].keys()
    assert "hostname" not in json.dumps(data["machine"]).lower()
    lv0 = data["levels"][0]
    assert set(lv0["ttfp_s"]) == {"mean", "p50", "p99"} and len(lv0["records"]) == 4
    assert lv0["prompt_words"] == 8 and lv0["chunk_gap_ms"]["p99"] is not None and lv0["audio_frames_mean"] == 6
    assert (tmp_path / "e2e.png").read_bytes().startswith(PNG_MAGIC)

    # text-only run (no audio metrics at all) must still plot, then compare both runs via the CLI
    text_cfg = BenchConfig(url=url, concurrency=[2], modalities=["text"], warmup=0, label="text",
                           out_dir=tmp_path, show_progress=False)
    text_result = await bench.run_bench(text_cfg)
    assert text_result.levels[0].ttfp_s == Stat() and text_result.levels[0].ttft_s.p50 is not None
    assert "audio" not in handler.requests[-1]

    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    argv = ["--compare", str(tmp_path / "e2e.json"), str(tmp_path / "text.json"),
            "--out-dir", str(tmp_path / "cmp")]
    n_before = len(handler.requests)
    assert bench.bench_main(parser.parse_args(argv), argv) == 0
    assert len(handler.requests) == n_before  # --compare sends no traffic
    assert (tmp_path / "cmp" / "compare.png").read_bytes().startswith(PNG_MAGIC)


async def test_run_bench_records_http_errors_as_failures(fake_server, tmp_path: Path) -> None:
    url, handler = fake_server
    handler.fail = 500
    cfg = BenchConfig(url=url, model="m", concurrency=[2], num_requests=3, warmup=0,
                      label="fail", out_dir=tmp_path, show_progress=False)
    result = await bench.run_bench(cfg)
    lv = result.levels[0]
    assert (lv.num_requests, lv.failures, lv.refused, lv.completed, lv.req_per_s) == (3, 3, 0, 0, 0.0)
    assert all(r.status == 500 and r.error == "HTTP 500: broken" and r.retry_after_s is None for r in lv.records)
    assert (tmp_path / "fail.png").exists()


async def test_run_bench_counts_refusals_apart_from_failures(fake_server, tmp_path: Path) -> None:
    url, handler = fake_server
    handler.fail = 429
    cfg = BenchConfig(url=url, model="m", concurrency=[2], num_requests=4, warmup=0,
                      label="refused", out_dir=tmp_path, show_progress=False)
    lv = (await bench.run_bench(cfg)).levels[0]
    assert (lv.num_requests, lv.refused, lv.failures, lv.completed) == (4, 4, 0, 0)
    assert all(r.status == 429 and r.retry_after_s == 0 for r in lv.records)


def test_bench_main_without_model_or_server_returns_2(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    # Port 9 (discard) on loopback is essentially never served: /v1/models fails fast.
    argv = ["--url", "http://127.0.0.1:9", "--out-dir", str(tmp_path), "--timeout", "5"]
    assert bench.bench_main(parser.parse_args(argv), argv) == 2
    assert not list(tmp_path.iterdir())


def test_bench_main_compares_realtime_runs_by_label_and_not_beside_chat(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    runs = Path(__file__).parents[2] / "benchmarks" / "cpu-tiny"
    argv = ["--compare", str(runs / "kept-slots" / "before.json"), str(runs / "kept-slots" / "after.json"),
            "--out-dir", str(tmp_path / "voice")]
    assert bench.bench_main(parser.parse_args(argv), argv) == 0
    assert (tmp_path / "voice" / "compare.png").read_bytes().startswith(PNG_MAGIC)
    argv = ["--compare", str(runs / "kept-slots" / "after.json"), str(runs / "async-chunk-on.json"),
            "--out-dir", str(tmp_path / "mixed")]
    assert bench.bench_main(parser.parse_args(argv), argv) == 2


def test_bench_main_compare_with_missing_json_returns_2(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_bench_arguments(parser)
    argv = ["--compare", str(tmp_path / "missing.json"), "--out-dir", str(tmp_path)]
    assert bench.bench_main(parser.parse_args(argv), argv) == 2


async def test_workers_spread_over_client_processes(fake_server, tmp_path: Path) -> None:
    url, handler = fake_server
    cfg = BenchConfig(url=url, model="m", concurrency=[3], num_requests=7, warmup=1, client_processes=2,
                      label="procs", out_dir=tmp_path, show_progress=False)
    lv = (await bench.run_bench(cfg)).levels[0]
    assert len(handler.requests) == 1 + 7
    assert [r.index for r in lv.records] == list(range(7)) and lv.failures == 0
    assert all(r.ttfp_s is not None and r.audio_frames == 6 for r in lv.records)
    assert lv.req_per_s > 0 and json.loads((tmp_path / "procs.json").read_text())["config"]["client_processes"] == 2


def test_spread_first_sends_are_seeded_and_within_the_spread() -> None:
    delays = bench.sweep.first_send_delays("0:[0]", 64, 5.0)
    assert all(0 <= d < 5.0 for d in delays) and max(delays) - min(delays) > 2.5
    assert delays == bench.sweep.first_send_delays("0:[0]", 64, 5.0)
    assert delays != bench.sweep.first_send_delays("0:[1]", 64, 5.0)  # another client process
    assert bench.sweep.first_send_delays("0:[0]", 3, 0.0) == [0.0, 0.0, 0.0]


async def test_a_spread_level_still_runs_every_request(fake_server, tmp_path: Path) -> None:
    url, handler = fake_server
    cfg = BenchConfig(url=url, model="m", concurrency=[3], num_requests=5, warmup=1, spread_s=0.2,
                      label="spread", out_dir=tmp_path, show_progress=False)
    lv = (await bench.run_bench(cfg)).levels[0]
    assert len(handler.requests) == 1 + 5 and lv.completed == 5
    assert json.loads((tmp_path / "spread.json").read_text())["config"]["spread_s"] == 0.2


# ----------------------------------------------------------------------------- package boundaries

def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_bench_imports_neither_the_server_nor_the_engine() -> None:
    # bench drives servers over HTTP and starts them as subprocesses; it never loads their code
    result = _python("import sys, bench, bench.cli, bench.ladder, bench.sweep\n"
                     "print(sorted({m.split('.')[0] for m in sys.modules} & {'voice_gateway', 'engine'}))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_voice_gateway_bench_loads_no_model_code() -> None:
    # the bench's client processes are spawned, and each imports `voice_gateway.cli` again as its main: torch and
    # transformers there took each level ~20 s before its first request on a GPU host
    result = _python("import sys, voice_gateway.cli\n"
                     "print(sorted({m.split('.')[0] for m in sys.modules} & {'engine', 'torch', 'transformers'}))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_voice_gateway_bench_without_the_extra_says_what_to_install() -> None:
    result = _python("import sys; sys.modules['matplotlib'] = None\n"  # as if not installed
                     "from voice_gateway.cli import main; sys.exit(main(['bench', '--help']))")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == "voice-gateway bench: matplotlib missing; pip install 'voice-gateway[bench]'"


def test_a_result_file_holds_each_record_on_one_line() -> None:
    from bench.result_file import dumps

    payload = {"label": "x", "levels": [{"concurrency": 2, "records": [{"index": 0, "gaps": [0.1, 0.2]},
                                                                        {"index": 1, "error": "\x00record 0"}]}]}
    text = dumps(payload)
    assert json.loads(text) == payload  # the same values, a record's own text left as it is
    assert '        {"index": 0, "gaps": [0.1, 0.2]},\n' in text and '"concurrency": 2,\n' in text
