"""Phone calls: a carrier's media stream (Twilio, Telnyx, Plivo) driving a realtime session, its answer webhook,
call control, and the app's sideband onto a live call."""

from voice_gateway.phone.book import CallBook
from voice_gateway.phone.config import PhoneConfig
from voice_gateway.phone.control_routes import router as control_router
from voice_gateway.phone.incoming import router as incoming_router
from voice_gateway.phone.stream import attach_sideband
from voice_gateway.phone.stream import router as media_router

__all__ = ["CallBook", "PhoneConfig", "attach_sideband", "control_router", "incoming_router", "media_router"]
