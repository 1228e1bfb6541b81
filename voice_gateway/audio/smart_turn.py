"""Smart Turn v3 (BSD-2, pipecat-ai): an ONNX classifier of whether an utterance is complete, on onnxruntime.

The model reads the last 8 s of 16 kHz audio as Whisper log-mel features and returns P(the speaker is done). The
`semantic-vad` extra installs onnxruntime and the `pipecat-ai` wheel, which ships the model file; it is found from
the distribution's file list without importing pipecat, so an image may install that wheel without its
dependencies. Where onnxruntime or the file is absent, `load_smart_turn` says so once and returns None."""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SAMPLE_RATE_HZ = 16_000
WINDOW_SAMPLES = 8 * SAMPLE_RATE_HZ  # the model's input: the last 8 s, zero-padded at the front
_BUNDLED_PREFIX = "smart-turn-v3"  # pipecat-ai ships smart-turn-v3.<minor>-cpu.onnx
_SHIPPED_BY = "pipecat-ai"
_FALLBACK = ("turns end on the server VAD's silence instead (pip install 'voice-gateway[semantic-vad]' "
             "installs the model)")


def bundled_model_path() -> Path | None:
    try:
        files = importlib.metadata.files(_SHIPPED_BY) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = sorted(f for f in files if f.name.startswith(_BUNDLED_PREFIX) and f.name.endswith(".onnx"))
    return Path(str(found[-1].locate())) if found else None


class SmartTurnModel:
    """Owns one onnxruntime session and the Whisper feature extractor; `probability` is safe from any thread."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort
        from transformers import WhisperFeatureExtractor

        options = ort.SessionOptions()
        # one decision per pause, a few per turn: one thread keeps it off the engine's cores
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.path = path
        # the first decision is logged once per process: the log shows that the model ran, not only that it loaded
        self._first_decision = threading.Event()
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
        # the features the model was trained on: Whisper's, over an 8 s window
        self._features = WhisperFeatureExtractor(chunk_length=8)
        # onnxruntime's first run allocates and plans: pay it here, not at the first user's first pause
        self._run(np.zeros(SAMPLE_RATE_HZ, np.float32))

    def probability(self, samples_16k: np.ndarray) -> float:
        """P(complete) for the utterance that ends where `samples_16k` ends (float32 mono, any length)."""
        p = self._run(samples_16k)
        if not self._first_decision.is_set():
            self._first_decision.set()
            log.info("semantic_vad: Smart Turn's first decision in this process: P(complete)=%.2f after %.1f s "
                     "of audio (%s)", p, samples_16k.size / SAMPLE_RATE_HZ, self.path.name)
        return p

    def _run(self, samples_16k: np.ndarray) -> float:
        window = samples_16k[-WINDOW_SAMPLES:].astype(np.float32, copy=False)
        window = np.pad(window, (WINDOW_SAMPLES - window.size, 0))
        features: Any = self._features(window, sampling_rate=SAMPLE_RATE_HZ, padding="max_length",
                                       max_length=WINDOW_SAMPLES, truncation=True, do_normalize=True,
                                       return_tensors="np")
        # input_features: [1, 80 mel bins, 800 frames]; logits: [1, 1], already a sigmoid
        (logits,) = self._session.run(None, {"input_features": features.input_features.astype(np.float32)})
        return float(logits[0, 0])


@functools.cache
def load_smart_turn(path: Path | None = None) -> SmartTurnModel | None:
    """The model at `path` (default: the extra's file), loaded once per process; None, logged once, if missing."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        log.warning("semantic_vad: onnxruntime is not installed; %s", _FALLBACK)
        return None
    path = path or bundled_model_path()
    if path is None or not path.is_file():
        log.warning("semantic_vad: no Smart Turn model (%s); %s", path or f"{_SHIPPED_BY} is not installed", _FALLBACK)
        return None
    model = SmartTurnModel(path)
    log.info("semantic_vad: Smart Turn model %s loaded", path)
    return model
