"""Browser test fixtures: the fake microphone WAVs (see harness.py for the runner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.harness import write_fake_mic


@pytest.fixture(scope="session")
def fake_mic_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One turn every ~12.5 s: the reply (at most 3.84 s on the tiny model) ends long before the next one."""
    return write_fake_mic(tmp_path_factory.mktemp("mic") / "speech.wav", lead_s=1.0, tail_s=9.0)


@pytest.fixture(scope="session")
def barge_in_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user speaks again 1 s after the previous utterance: over the reply, which plays for ~3.8 s."""
    return write_fake_mic(tmp_path_factory.mktemp("mic-barge") / "speech.wav", lead_s=1.0, tail_s=1.0)


@pytest.fixture(scope="session")
def two_response_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One turn every ~34 s: room for two responses of a turn (a tool call's, its grammar's first build included,
    and the answer; or the transcript's and the reply's) on a slow CPU before the next turn barges in."""
    return write_fake_mic(tmp_path_factory.mktemp("mic-two") / "speech.wav", lead_s=1.0, tail_s=30.0)
