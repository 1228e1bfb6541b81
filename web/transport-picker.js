// The transport choice: the select, which transports this browser (and, once tried, the server) offers, and the
// header pill that names the connection's state.

export const TRANSPORT_LABELS = {
  webrtc: "WebRTC",
  "ws-opus": "WebSocket + Opus",
  "ws-pcm16": "WebSocket + PCM16",
};

const STATE_LABELS = { idle: "not connected", connecting: "connecting…", closed: "disconnected", error: "error" };

const hasWebCodecs = () => typeof AudioDecoder !== "undefined";

export class TransportPicker {
  /** select: the transport <select>; pill: the connection-state pill; onChange(kind): the user picked `kind`. */
  constructor({ select, pill, initial, onChange }) {
    this.select = select;
    this.pill = pill;
    this.webrtcAvailable = typeof RTCPeerConnection !== "undefined"; // false too once the server lacks the endpoint
    for (const [value, label] of Object.entries(TRANSPORT_LABELS)) {
      const option = document.createElement("option");
      option.value = value;
      option.textContent = label;
      select.appendChild(option);
    }
    if (!this.webrtcAvailable) this.#markWebrtcUnavailable();
    if (!hasWebCodecs()) this.#relabel("ws-opus", "WebSocket + Opus (no WebCodecs here)");
    this.choose(initial || "webrtc");
    select.addEventListener("change", () => onChange(select.value));
  }

  get value() {
    return this.select.value;
  }

  /** The transport that will serve a request for `kind` here, now shown as the choice. */
  choose(kind) {
    if (!(kind in TRANSPORT_LABELS)) kind = "webrtc";
    if (kind === "ws-opus" && !hasWebCodecs()) kind = "ws-pcm16";
    if (kind === "webrtc" && !this.webrtcAvailable) kind = hasWebCodecs() ? "ws-opus" : "ws-pcm16";
    this.select.value = kind;
    return kind;
  }

  /** The server answered that it has no /v1/realtime/calls. */
  webrtcMissing() {
    this.webrtcAvailable = false;
    this.#markWebrtcUnavailable();
  }

  /** The session's state and transport kind: the pill's text, and no switching while connecting. */
  show(state, kind) {
    this.pill.dataset.state = state;
    this.pill.textContent = state === "connected" ? TRANSPORT_LABELS[kind] : STATE_LABELS[state];
    this.select.disabled = state === "connecting";
  }

  #markWebrtcUnavailable() {
    this.#relabel("webrtc", "WebRTC (not on this server)");
  }

  #relabel(kind, text) {
    const option = this.select.querySelector(`option[value="${kind}"]`);
    if (!option) return;
    option.disabled = true;
    option.textContent = text;
  }
}
