"""`voice-gateway serve assistant` on loopback, its turns taken by what was said: a reply started on a probable end of
the user's turn, when the user goes on, sends nothing and leaves nothing in the conversation, and the whole sentence
is one turn, heard and answered."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.conftest import Server
from tests.integration.test_assistant_clients import AFTER_SPEECH_S, append_live
from tests.integration.test_assistant_server import assistant_server, words  # noqa: F401 (fixtures)
from tests.integration.test_realtime import RATE, client_for, events_until, silence
from voice_gateway.audio.resample import resample

pytestmark = pytest.mark.asyncio(loop_scope="session")
FIRST, SECOND = "What is the capital of France?", "And of Spain?"  # the first half is a whole question
PAUSE_S = 0.5


def _say(tmp_path: Path, text: str) -> np.ndarray:
    path = tmp_path / "say.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(path), text], check=True)
    samples, rate = sf.read(path, dtype="float32")
    audible = np.flatnonzero(np.abs(samples) > 1e-3)
    return resample(samples[audible[0] : audible[-1] + 1], rate, RATE)


async def test_a_reply_started_early_leaves_no_trace_when_the_user_goes_on(assistant_server: Server,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    speech = np.concatenate([silence(0.5), _say(tmp_path, FIRST), silence(PAUSE_S), _say(tmp_path, SECOND),
                             silence(AFTER_SPEECH_S)])
    async with client_for(assistant_server) as client, client.realtime.connect(model="assistant") as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.audio.input.turn_detection.type == "semantic_vad"
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 30,
                                           "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
        await events_until(conn, "session.updated")
        speaking = asyncio.create_task(append_live(conn, speech))
        events = await events_until(conn, "response.done", timeout_s=120)
        await speaking
        if not any(e.type == "conversation.item.input_audio_transcription.completed" for e in events):
            events += await events_until(conn, "conversation.item.input_audio_transcription.completed")
        [user_item] = [e.item_id for e in events if e.type == "input_audio_buffer.committed"]
        await conn.send({"type": "conversation.item.retrieve", "item_id": user_item})
        retrieved = (await events_until(conn, "conversation.item.retrieved"))[-1]

    kinds = [e.type for e in events]
    log = assistant_server.log()
    # the pause after the first half was a probable end: a reply started on it, and was dropped unseen
    assert "started on a probable end of turn" in log and "started early dropped" in log, log[-3000:]
    assert kinds.count("input_audio_buffer.speech_stopped") == 1, kinds
    assert kinds.count("input_audio_buffer.committed") == 1 and kinds.count("response.created") == 1, kinds
    stopped = kinds.index("input_audio_buffer.speech_stopped")
    assert "response.output_audio.delta" not in kinds[:stopped], kinds  # no audio before the turn ended
    # one turn holds both halves, heard as one, and one reply answers it
    [heard] = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    assert {"france", "spain"} <= set(words(heard.transcript)), heard.transcript
    assert retrieved.item.id == user_item
    done = events[kinds.index("response.done")].response
    assert done.status == "completed" and "response.output_audio.delta" in kinds, done
    assert done.usage.input_tokens > 0
