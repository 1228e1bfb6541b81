// WS /v1/realtime: JSON events both ways; mic as PCM16 24 kHz appends; reply audio as PCM16 deltas or, with our
// Opus extension, as binary messages (12-byte header + one raw 20 ms Opus packet) decoded by one WebCodecs
// AudioDecoder per session.

import { int16ToBase64, base64ToFloat32, openMicrophone, API_RATE } from "./audio.js";

const OPUS_RATE = 48000;
const U32 = 2 ** 32;

export function wsUrl(baseUrl, model) {
  const url = new URL("/v1/realtime", baseUrl);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  if (model) url.searchParams.set("model", model);
  url.searchParams.set("timing", "1"); // our response.timing event: where each reply's wait went
  return url.toString();
}

export class WebSocketTransport {
  /**
   * opts: {baseUrl, model, apiKey, audio (AudioEngine), opus (bool),
   *        onEvent(event), onAudio(itemId, Float32Array, rate), onMicLevel({rms, peak}), onClose(reason)}
   */
  constructor(opts) {
    this.opts = opts;
    this.kind = opts.opus ? "ws-opus" : "ws-pcm16";
    this.ws = null;
    this.mic = null;
    this.capture = null;
    this.micOpen = true; // false while push-to-talk is released
    this.decoder = null;
    this.audioItem = null; // the item the binary packets belong to (set by response.output_item.added)
    this.segments = []; // [{fromUs, item}]: which item decoded audio from a timestamp onwards belongs to
    this.tsHigh = 0; // wraps of the u32 48 kHz timestamp
    this.lastTs = null;
    this.lastSeq = null;
    this.counters = { packetsReceived: 0, packetsLost: 0, bytesReceived: 0, appendsSent: 0, decodeErrors: 0 };
    this.closed = false;
  }

  async connect(sessionUpdate) {
    const { baseUrl, model, apiKey } = this.opts;
    const protocols = ["realtime"];
    if (apiKey) protocols.push(`openai-insecure-api-key.${apiKey}`);
    const ws = new WebSocket(wsUrl(baseUrl, model), protocols);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    const created = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no session.created within 10 s")), 10000);
      ws.onmessage = (e) => {
        if (typeof e.data !== "string") return;
        const event = JSON.parse(e.data);
        this.opts.onEvent(event);
        if (event.type === "session.created") {
          clearTimeout(timer);
          resolve(event);
        } else if (event.type === "error") {
          clearTimeout(timer);
          reject(new Error(event.error?.message || "refused"));
        }
      };
      ws.onerror = () => { clearTimeout(timer); reject(new Error("WebSocket connection failed")); };
      ws.onclose = (e) => { clearTimeout(timer); reject(new Error(`WebSocket closed (${e.code} ${e.reason})`)); };
    });
    await created;
    ws.onmessage = (e) => this._onMessage(e.data);
    ws.onerror = null;
    ws.onclose = (e) => {
      if (!this.closed) this.opts.onClose(`WebSocket closed (${e.code}${e.reason ? " " + e.reason : ""})`);
      this._teardown();
    };
    if (this.opts.opus) this._makeDecoder();
    this.send(sessionUpdate);
    // The mic starts once the session is configured, so no audio reaches it under the wrong turn settings.
    this.mic = await openMicrophone();
    this.capture = this.opts.audio.attachCapture(this.mic, {
      emitPcm: true,
      onLevel: this.opts.onMicLevel,
      onPcm: (pcm) => this._sendPcm(pcm),
    });
  }

  _sendPcm(pcm) {
    if (!this.micOpen || !this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    this.send({ type: "input_audio_buffer.append", audio: int16ToBase64(pcm) });
    this.counters.appendsSent += 1;
  }

  /** Push-to-talk: whether mic audio is sent. Closing flushes the partial chunk first. */
  setMicOpen(open) {
    if (!open && this.micOpen && this.capture) this.capture.flush();
    this.micOpen = open;
  }

  /** Milliseconds until audio captured now has reached the server's buffer (one capture chunk). */
  get inputLagMs() {
    return 60;
  }

  send(event) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(event));
  }

  _onMessage(data) {
    if (typeof data !== "string") {
      this._onOpusPacket(data);
      return;
    }
    const event = JSON.parse(data);
    // a function call has no audio: the packets after it still belong to the reply's message
    if (event.type === "response.output_item.added" && event.item?.type !== "function_call") {
      this.audioItem = event.item?.id ?? null;
    }
    else if (event.type === "response.done") this.audioItem = null;
    else if (event.type === "response.output_audio.delta" || event.type === "response.audio.delta") {
      this.counters.bytesReceived += (event.delta.length * 3) >> 2;
      this.counters.packetsReceived += 1;
      this.opts.onAudio(event.item_id, base64ToFloat32(event.delta), API_RATE);
      return; // the app needs only the samples
    }
    this.opts.onEvent(event);
  }

  // ------------------------------------------------------------ Opus

  _makeDecoder() {
    if (typeof AudioDecoder === "undefined") throw new Error("WebCodecs AudioDecoder is not available");
    this.decoder = new AudioDecoder({
      output: (audioData) => this._onDecoded(audioData),
      error: (e) => {
        this.counters.decodeErrors += 1;
        this.opts.onEvent({ type: "error", error: { type: "client_error", code: "opus_decode", message: String(e) } });
        if (!this.closed) this._makeDecoder(); // a closed decoder stays closed: start a new one
      },
    });
    this.decoder.configure({ codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: 1 });
  }

  _onOpusPacket(buffer) {
    if (buffer.byteLength <= 12) return;
    const view = new DataView(buffer);
    const seq = view.getUint32(0);
    const ts = view.getUint32(4);
    this.counters.packetsReceived += 1;
    this.counters.bytesReceived += buffer.byteLength;
    if (this.lastSeq !== null) {
      const gap = (seq - this.lastSeq - 1 + U32) % U32;
      if (gap > 0 && gap < 1000) this.counters.packetsLost += gap;
    }
    this.lastSeq = seq;
    if (this.lastTs !== null && ts < this.lastTs && this.lastTs - ts > U32 / 2) this.tsHigh += 1;
    this.lastTs = ts;
    const item = this.audioItem;
    if (!item || !this.decoder || this.decoder.state !== "configured") return;
    const timestampUs = ((this.tsHigh * U32 + ts) * 1e6) / OPUS_RATE;
    const last = this.segments[this.segments.length - 1];
    if (!last || last.item !== item) this.segments.push({ fromUs: timestampUs, item });
    this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: timestampUs, data: new Uint8Array(buffer, 12) }));
  }

  _onDecoded(audioData) {
    try {
      const t = audioData.timestamp;
      let item = null;
      for (let i = this.segments.length - 1; i >= 0; i--) {
        if (this.segments[i].fromUs <= t + 1) {
          item = this.segments[i].item;
          if (i > 0) this.segments.splice(0, i); // older segments are done
          break;
        }
      }
      if (item === null) return;
      const samples = new Float32Array(audioData.numberOfFrames);
      audioData.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
      this.opts.onAudio(item, samples, audioData.sampleRate);
    } finally {
      audioData.close();
    }
  }

  async stats() {
    return { ...this.counters };
  }

  _teardown() {
    if (this.capture) this.capture.detach();
    this.capture = null;
    if (this.mic) for (const track of this.mic.getTracks()) track.stop();
    this.mic = null;
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = null;
  }

  close() {
    this.closed = true;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "client closed");
    this._teardown();
  }
}
