// The page's voice session: connecting over the chosen transport (a server without WebRTC falls back to the
// WebSocket once), the turn mode, the connection state, and the current connection's Conversation.
//
// Dispatches "change" when state, mode or activity change, and "server-event" (detail: the event) for every
// event the current connection's server sends.

import { TRANSPORT_LABELS } from "./transport-picker.js";
import { WebSocketTransport } from "./transport-ws.js";
import { WebRtcTransport, CallsEndpointMissing } from "./transport-webrtc.js";
import { Conversation } from "./conversation.js";

export class Session extends EventTarget {
  #state = "idle"; // idle | connecting | connected | closed | error
  #mode; // "vad" (hands-free, server VAD) | "ptt" (push-to-talk)
  #kind = null; // the transport of the current or last connection
  #conversation = null; // the current or last connection's conversation

  /**
   * audio: the page's AudioEngine; audioElement: the muted <audio> WebRTC needs; picker: the TransportPicker;
   * model: the ModelInfo; transcript, latency, meter, banner: the views a conversation reports to; tools,
   * toolChoice, transcribe: what each conversation offers the assistant and asks of the server (see Conversation;
   * transcribe null: as the model suggests);
   * camera: the page's Camera, whose frames go with the user's turns.
   */
  constructor({ baseUrl, apiKey, mode, audio, audioElement, picker, model, transcript, latency, meter, banner, tools,
                toolChoice, transcribe, camera }) {
    super();
    Object.assign(this, { baseUrl, apiKey, audio, audioElement, picker, model, transcript, latency, meter, banner,
                          tools, toolChoice, transcribe, camera });
    this.#mode = mode === "ptt" ? "ptt" : "vad";
  }

  get state() { return this.#state; }
  get mode() { return this.#mode; }
  get kind() { return this.#kind; }
  get conversation() { return this.#conversation; }

  /** What the assistant is doing (see Conversation); idle unless connected. */
  get activity() {
    return this.#state === "connected" && this.#conversation ? this.#conversation.activity : "idle";
  }

  /** Connect over `kind` (or what the picker offers instead), ending the current connection first. */
  async connect(kind = this.picker.value) {
    if (this.#state === "connecting" || this.#state === "connected") await this.disconnect();
    kind = this.picker.choose(kind);
    this.#kind = kind;
    this.#setState("connecting");
    this.banner.hide();
    this.latency.reset();
    if (this.#conversation && this.transcript.hasTurns) this.transcript.divider(`new session · ${TRANSPORT_LABELS[kind]}`);
    let conversation = null;
    try {
      await this.audio.start();
      if (!this.model.info) await this.model.load();
      conversation = this.#open(kind);
      this.#conversation = conversation;
      await conversation.transport.connect(conversation.sessionUpdate());
      this.#setState("connected");
      conversation.ready();
    } catch (e) {
      if (e instanceof CallsEndpointMissing) this.picker.webrtcMissing();
      if (conversation) conversation.close();
      this.banner.error(`could not connect over ${TRANSPORT_LABELS[kind]}: ${e.message || e}`);
      this.#setState("error");
      throw e;
    }
  }

  /** The talk button in hands-free mode: connect, and without a WebRTC endpoint use the WebSocket, saying so. */
  async start() {
    try {
      await this.connect();
    } catch (e) {
      if (!(e instanceof CallsEndpointMissing)) return;
      await this.connect("ws-opus").catch(() => {});
      if (this.#state === "connected") this.banner.info("This server has no WebRTC endpoint: using the WebSocket.");
    }
  }

  /** The user picked another transport: a live session moves over to it. */
  switchTransport(kind) {
    if (this.#state === "connected") this.connect(kind).catch(() => {});
  }

  async disconnect() {
    const conversation = this.#conversation;
    if (conversation && !conversation.closed) conversation.close();
    await this.audio.clear();
    if (this.#state !== "idle") this.#setState("closed");
    this.meter.silence();
  }

  /** The page goes away: end the connection at once (the server frees it when the socket / peer closes). */
  leave() {
    const conversation = this.#conversation;
    if (conversation && !conversation.closed) conversation.close();
    this.audio.close();
  }

  setMode(mode) {
    this.#mode = mode === "ptt" ? "ptt" : "vad";
    if (this.#state === "connected") this.#conversation.modeChanged();
    this.dispatchEvent(new Event("change"));
  }

  /** Push-to-talk, once connected: the talk button went down / came up. */
  async pressTalk() {
    if (this.#state === "connected") await this.#conversation.pressTalk();
  }

  async releaseTalk() {
    if (this.#conversation) await this.#conversation.releaseTalk();
  }

  /** A message of the playback worklet (AudioEngine's onPlayback). */
  onPlayback(msg) {
    const conversation = this.#conversation;
    if (conversation && !conversation.closed) conversation.playback.onPlayback(msg);
  }

  /** A transport for `kind` and its conversation; the callbacks of a replaced one never reach the new one. */
  #open(kind) {
    let conversation = null;
    const only = (fn) => (...args) => {
      if (this.#conversation === conversation && !conversation.closed) fn(...args);
    };
    const common = {
      baseUrl: this.baseUrl, model: this.model.info?.id, apiKey: this.apiKey, audio: this.audio,
      onEvent: only((ev) => {
        this.dispatchEvent(new CustomEvent("server-event", { detail: ev }));
        conversation.handle(ev);
      }),
      onMicLevel: only((level) => this.meter.level(level)),
      onClose: only((reason) => this.#lost(reason)),
    };
    const transport = kind === "webrtc"
      ? new WebRtcTransport({ ...common, audioElement: this.audioElement, camera: this.camera,
                              onRemoteLevel: only((level) => conversation.playback.level(level)) })
      : new WebSocketTransport({ ...common, opus: kind === "ws-opus",
                                 onAudio: only((itemId, samples, rate) => conversation.playback.received(itemId, samples, rate)) });
    conversation = new Conversation({
      kind, transport, audio: this.audio, transcript: this.transcript, latency: this.latency, banner: this.banner,
      mode: () => this.#mode, onChange: () => this.dispatchEvent(new Event("change")),
      tools: this.tools, toolChoice: this.toolChoice, camera: this.camera,
      // a model that hears ahead transcribes anyway: its words show unless the page was told otherwise
      transcribe: this.transcribe ?? this.model.listensAhead, byWords: this.model.listensAhead,
    });
    return conversation;
  }

  /** The transport went away by itself. */
  #lost(reason) {
    this.#conversation.close();
    this.audio.clear();
    this.banner.error(reason);
    this.#setState("closed");
  }

  #setState(next) {
    this.#state = next;
    this.dispatchEvent(new Event("change"));
  }
}
