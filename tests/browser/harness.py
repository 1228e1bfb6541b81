"""Helpers of the browser tests: availability checks, the fake microphone WAV, and a runner for driver.py.

Each test re-runs driver.py under `unshare -n` (loopback only, as DESIGN.md asks for browser and WebRTC tests): the
driver starts the server and headless Chromium inside the namespace and writes what the page saw as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("driver.py")
CHROMIUM = "/usr/bin/chromium"
MIC_RATE = 48_000
UTTERANCE = "Hello there. What is the weather like today?"


def unavailable_reason() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (pip install playwright; never `playwright install`)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not available"
    if shutil.which("espeak-ng") is None:
        return "espeak-ng is not installed (it speaks the fake microphone's words)"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace (`unshare -n` needs root): {probe.stderr.strip()}"
    return None


def write_fake_mic(path: Path, lead_s: float, tail_s: float) -> Path:
    """espeak-ng speech between silences, as the 16-bit 48 kHz mono WAV Chromium's fake device wants.

    Chromium loops the file, so one loop is one user turn: `tail_s` decides whether the next turn starts while the
    reply still plays (barge-in) or well after it.
    """
    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-w", str(raw), UTTERANCE], check=True)
    speech, rate = sf.read(raw, dtype="float32")
    speech = soxr.resample(speech, rate, MIC_RATE).astype(np.float32)
    speech *= 0.7 / max(1e-6, float(np.abs(speech).max()))
    samples = np.concatenate([np.zeros(int(lead_s * MIC_RATE), np.float32), speech,
                              np.zeros(int(tail_s * MIC_RATE), np.float32)])
    sf.write(path, samples, MIC_RATE, subtype="PCM_16")
    # A 24-bit or missing file gives Chromium silence with no error: check what was written.
    info = sf.info(path)
    assert (info.samplerate, info.channels, info.subtype) == (MIC_RATE, 1, "PCM_16"), info
    back, _ = sf.read(path, dtype="float32")
    assert np.abs(back).max() > 0.3, "the fake microphone WAV is silent"
    assert np.sqrt(np.mean(back[int(lead_s * MIC_RATE) : -int(tail_s * MIC_RATE)] ** 2)) > 0.02
    return path




def run_driver(scenario: str, wav: Path, cache_dir: Path, out_dir: Path, model: str = "tiny") -> dict:
    """Run one driver scenario in a fresh network namespace; its result, or a test failure that says why."""
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable, str(DRIVER),
           "--scenario", scenario, "--wav", str(wav), "--cache-dir", str(cache_dir), "--out-dir", str(out_dir),
           "--model", model]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=480)
    result_path = out_dir / "result.json"
    if proc.returncode != 0 or not result_path.exists():
        pytest.fail(f"driver {scenario} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    result = json.loads(result_path.read_text())
    if result.get("driver_error"):
        pytest.fail(f"driver {scenario} failed:\n{result['driver_error']}\n{explain(result, out_dir)}")
    return result


def explain(result: dict, out_dir: Path) -> str:
    """What to read when an assertion fails: the page's stats, its console and the server log's tail."""
    page = result.get("page") or {}
    stats = {k: v for k, v in (page.get("stats") or {}).items() if k != "eventCounts"}
    log = out_dir / "server.log"
    log_tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no server log)"
    return (f"stats: {json.dumps(stats)}\nevents: {json.dumps((page.get('stats') or {}).get('eventCounts'))}\n"
            f"replies: {json.dumps(page.get('replies'), ensure_ascii=True)[:1500]}\n"
            f"console:\n" + "\n".join(result.get("console", [])[-40:]) + f"\nserver log:\n{log_tail}")
