"""What every Realtime event model is built on: the lenient base model and base64 audio fields."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer


def _decode_base64(value: object) -> bytes:
    if isinstance(value, bytes):  # a server event built by the session from raw audio
        return value
    if not isinstance(value, str):
        raise ValueError("expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"invalid base64: {exc}") from None


# Raw bytes in Python, base64 text on the wire.
AudioBytes = Annotated[
    bytes,
    BeforeValidator(_decode_base64),
    PlainSerializer(lambda data: base64.b64encode(data).decode("ascii"), return_type=str),
]


class EventModel(BaseModel):
    # Clients send settings we do not implement (tools, tracing, noise_reduction, speed...);
    # ignoring them is what lets unmodified clients connect.
    model_config = ConfigDict(extra="ignore")
