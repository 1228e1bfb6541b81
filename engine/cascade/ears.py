"""The cascade's listening: one utterance of 16 kHz mono speech -> its text, with Whisper tiny.en on the CPU
(CTranslate2's weights, through faster-whisper). It decodes as short voice turns want (English, a beam of 5, no
timestamps, no previous text as a prompt) and gives "" where Whisper would make words of silence or noise. The
server's VAD finds the turns, so Whisper's own VAD filter is not used."""

from __future__ import annotations

import atexit
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel

from engine.cascade.packages import WHISPER, ModelPackage

log = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 16_000
_HOP_SAMPLES = 160  # one mel frame: 10 ms
_FRAMES_PER_S = SAMPLE_RATE_HZ // _HOP_SAMPLES

# int8 weights (CTranslate2 quantizes the stored float16 at load) with a beam of 5: as accurate as float32 with
# a beam of 5 in less than half its time, and a quarter fewer word errors than greedy int8 for ~10% more time
# (on 80 espeak-ng clips: 20 questions, 4 voices, clean and at 10 dB SNR; one thread).
_COMPUTE_TYPE = "int8"
_BEAM = 5

# Whisper's window is 30 s, and faster-whisper pads every utterance to it, so a 2 s turn pays for a 30 s
# encoder pass. CTranslate2's encoder takes shorter windows, so each piece of audio goes in the smallest of these
# that leaves _TAIL_S of silence after it: on the same clips that makes no more word errors and runs ~5x faster.
# A window that barely fits the speech (its length + 1 s) loses words. Fixed sizes let turns share a batch.
_WINDOWS_S = (10, 20, 30)
_TAIL_S = 2
_PIECE_SAMPLES = (_WINDOWS_S[-1] - _TAIL_S) * SAMPLE_RATE_HZ  # a longer turn goes in pieces of this

# Whisper's own test for "nothing was said" (its defaults): the no-speech token is likely and the words that
# follow are not. Without it Whisper hears "you" or "." in silence, white or brown noise, hum, a tone, clicks.
_NO_SPEECH_PROB = 0.6
_MIN_AVG_LOGPROB = -1.0
# A decoding loop ("I'm out of the way, I'm out of the way, ..." from speech in noise) runs until the token
# budget ends it, and its transcript is dropped. Speech is ~3-5 tokens/s, so only loops reach the budget, and
# it bounds what they cost. No fallback to sampling at higher temperatures (Whisper's): it costs a decode per
# temperature, and on noise it makes up words all the same.
_TOKENS_PER_S = 8
_MIN_TOKENS = 16
_MAX_TOKENS = 224  # CTranslate2 decodes at most max_length / 2 tokens: Whisper's 448 positions, halved

class WhisperEars:
    """Owns one loaded Whisper model (weights, mel front end, tokenizer) and nothing per call. Calls may overlap, from
    any threads: CTranslate2 runs `workers` at once (a replica each, the weights shared), each on `cpu_threads`
    threads, and queues the rest; nothing in Python is written after `__init__`. Tiny.en's matrices are too small to
    gain from a second thread, so overlapping calls want workers rather than threads."""

    def __init__(self, model_dir: Path, *, cpu_threads: int, workers: int) -> None:
        if cpu_threads < 1 or workers < 1:
            raise ValueError(f"cpu_threads ({cpu_threads}) and workers ({workers}) must be >= 1")
        self._model = WhisperModel(str(model_dir), device="cpu", compute_type=_COMPUTE_TYPE,
                                   cpu_threads=cpu_threads, num_workers=workers)
        # CTranslate2's workers end before the interpreter tears its modules down, not during it: a model freed
        # in that teardown, beside other native runtimes (torch's, Ray's), is a crash on the way out
        atexit.register(self._model.model.unload_model)
        self._vocab = self._model.hf_tokenizer
        # tiny.en: no language or task token
        self._prompt = [self._token("<|startoftranscript|>"), self._token("<|notimestamps|>")]
        self._end = self._token("<|endoftext|>")  # this id and above are special tokens, never text
        self._n_mels = self._model.model.n_mels

    @classmethod
    def from_package(cls, package: ModelPackage = WHISPER, *, cpu_threads: int, workers: int) -> WhisperEars:
        """From the installed model package, every file's digest checked first (`PackageError` if one is off)."""
        return cls(package.directory(), cpu_threads=cpu_threads, workers=workers)

    def transcribe(self, audio: np.ndarray) -> str:
        """One utterance, float32 mono at 16 kHz -> its words, or "" for silence and noise. Audio past 28 s goes in 28 s
        pieces (a word that straddles a cut may be lost); no state is kept between calls."""
        return self.transcribe_many([audio])[0]

    def transcribe_many(self, utterances: Sequence[np.ndarray]) -> list[str]:
        """Each utterance's `transcribe`, batched per window size (each turn's words are still its own call's)."""
        pieces = [(turn, piece) for turn, audio in enumerate(utterances) for piece in _pieces(audio)]
        by_window: dict[int, list[int]] = {}
        for index, (_, piece) in enumerate(pieces):
            by_window.setdefault(_window_s(piece.size), []).append(index)
        texts = [""] * len(pieces)
        for window_s, indices in by_window.items():
            for index, text in zip(indices, self._decode(window_s, [pieces[i][1] for i in indices]), strict=True):
                texts[index] = text
        words: list[list[str]] = [[] for _ in utterances]
        for (turn, _), text in zip(pieces, texts, strict=True):
            if text:
                words[turn].append(text)
        return [" ".join(parts) for parts in words]

    def _decode(self, window_s: int, pieces: list[np.ndarray]) -> list[str]:
        frames = window_s * _FRAMES_PER_S
        # mel: [batch, 80, frames]; each piece's own frames, then zeros (faster-whisper's padding too)
        mel = np.zeros((len(pieces), self._n_mels, frames), np.float32)
        for row, piece in zip(mel, pieces, strict=True):
            own = piece.size // _HOP_SAMPLES
            # never with chunk_length: that rewrites the shared extractor's fields
            row[:, :own] = self._model.feature_extractor(piece)[:, :own]
        longest_s = max(piece.size for piece in pieces) / SAMPLE_RATE_HZ
        budget = min(_MAX_TOKENS, _MIN_TOKENS + math.ceil(_TOKENS_PER_S * longest_s))
        results = self._model.model.generate(
            ctranslate2.StorageView.from_array(mel), [self._prompt] * len(pieces), beam_size=_BEAM,
            max_length=2 * budget, return_scores=True, return_no_speech_prob=True)
        return [self._text(result, budget) for result in results]

    def _text(self, result: ctranslate2.models.WhisperGenerationResult, budget: int) -> str:
        tokens = [token for token in result.sequences_ids[0] if token < self._end]
        # the score is the mean log-probability per token; faster-whisper's mean counts the end token too
        avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > _NO_SPEECH_PROB and avg_logprob < _MIN_AVG_LOGPROB:
            return ""
        if len(result.sequences_ids[0]) >= budget:
            log.info("dropped a transcript that ran into its budget of %d tokens (a decoding loop)", budget)
            return ""
        text = self._vocab.decode(tokens).strip()
        if not any(char.isalnum() for char in text):
            return ""
        return without_echo(text)

    def _token(self, name: str) -> int:
        token = self._vocab.token_to_id(name)
        if token is None:
            raise ValueError(f"this Whisper tokenizer has no {name}: not an English-only Whisper model")
        return int(token)


def without_echo(text: str) -> str:
    """The transcript less its second saying of the same words: with no timestamps Whisper sometimes reads a short
    turn twice over its window's padding ("How many days are in a leap year? How many days are in a leap year?",
    tiny.en on an AMD EPYC, the turn through an 8 kHz phone line), and the model would hear the question twice. A
    caller who really said it twice meant it once."""
    words = text.split()
    half = len(words) // 2
    if len(words) % 2 == 0 and half >= 3 and _plain(words[:half]) == _plain(words[half:]):
        return " ".join(words[:half])
    return text


def _plain(words: list[str]) -> list[str]:
    return [word.strip(".,?!;:").lower() for word in words]


def _pieces(audio: np.ndarray) -> list[np.ndarray]:
    if audio.ndim != 1:
        raise ValueError(f"want mono samples (one axis), got shape {audio.shape}")
    audio = audio.astype(np.float32, copy=False)
    return [audio[start : start + _PIECE_SAMPLES] for start in range(0, audio.size, _PIECE_SAMPLES)]


def _window_s(samples: int) -> int:
    seconds = samples / SAMPLE_RATE_HZ + _TAIL_S
    return next((window for window in _WINDOWS_S if seconds <= window), _WINDOWS_S[-1])
