// One connection's conversation: the server's turn events on one transport, the user turns (with their words when
// transcribed, and the camera frames that went with them) and assistant replies they make, the page's tools the
// assistant calls, barge-in, push-to-talk turns, the connection's counters and what the assistant is doing (activity).

import { WorkletPlayback } from "./playback-ws.js";
import { RtcPlayback } from "./playback-webrtc.js";
import { TurnFrames } from "./turn-frames.js";

const MIN_PTT_MS = 150; // the server refuses to commit less than 100 ms
const LINK_POLL_MS = 250;

/** The turn_detection of a session.update for turn mode `mode` ("vad" | "ptt"). */
export function turnDetection(mode, byWords) {
  if (mode !== "vad") return null;
  // a model that hears ahead ends a turn by what was said: its default, semantic_vad
  return { type: byWords ? "semantic_vad" : "server_vad", create_response: true, interrupt_response: true };
}

/** The session's tool_choice for the page option `option` (?tool_choice=): auto, none, required or a tool's name. */
export function toolChoice(option, tools) {
  if (option === "none" || option === "required") return option;
  if (tools.some((t) => t.name === option)) return { type: "function", name: option };
  return "auto";
}

export class Conversation {
  #responseId = null; // the active response, between response.created and response.done
  #responseItem = null; // its message item (none in a reply of calls alone)
  #views = new Map(); // item id -> the transcript's view of the reply
  #userTurn = null; // {view, startMs}: the user turn being spoken (startMs: server VAD's audio_start_ms)
  #unclaimed = null; // the view of the user turn just ended, until input_audio_buffer.committed names its item
  #userViews = new Map(); // user item id -> its turn's view, for the transcription events
  #callViews = new Map(); // function_call item id -> the transcript's view of the call
  #callsAnswered = 0; // outputs sent for the active response's calls: its end asks for the answer
  #ptt = null; // {startedAt}: the talk button is held
  #pollTimer = null;

  /**
   * kind: "webrtc" | "ws-opus" | "ws-pcm16"; transport: its connected-or-connecting transport; mode(): the
   * session's turn mode now; onChange(): `activity` changed; tools: the page's tools ({name, declaration, call});
   * toolChoice: the session's tool_choice; transcribe: whether the server transcribes the user's audio; byWords:
   * whether hands-free turns end by what was said (semantic_vad); camera: the page's Camera, whose frame goes with
   * each user turn while it is on.
   *
   * Public state, written only here: replies (item id -> {id, status, text, latencyMs, receivedMs, playedMs,
   * dropped}; receivedMs / playedMs / dropped by the playback tracker), counts, link (the transport's last
   * stats), promptImageTokens (the image tokens of the last response's prompt), activity (idle | listening |
   * ptt-ready | user-speaking | thinking | speaking), playback and frames.
   */
  constructor({ kind, transport, audio, transcript, latency, banner, mode, onChange, tools, toolChoice, transcribe,
                byWords, camera }) {
    Object.assign(this, { kind, transport, transcript, latency, banner, mode, onChange, tools, toolChoice, transcribe,
                          byWords });
    this.replies = new Map();
    this.counts = { responsesCompleted: 0, responsesCancelled: 0, responsesFailed: 0, userTurns: 0,
                    bargeIns: 0, truncationsSent: 0, truncationsAcked: 0 };
    this.link = { packetsReceived: 0, packetsLost: 0 }; // WS+Opus: binary packets; PCM16: audio deltas; WebRTC: RTP
    this.promptImageTokens = 0;
    this.activity = "idle";
    this.closed = false;
    const onHeard = (itemId, at) => this.#heard(itemId, at);
    this.playback = kind === "webrtc"
      ? new RtcPlayback({ audio, transport, replies: this.replies, onHeard })
      : new WorkletPlayback({ audio, replies: this.replies,
                              onHeard: (itemId, at) => { onHeard(itemId, at); this.#setActivity("speaking"); },
                              onProgress: (msg) => this.#onProgress(msg) });
    this.frames = new TurnFrames({ camera, kind, send: (event) => transport.send(event) });
    this.#pollTimer = setInterval(() => this.#pollLink(), LINK_POLL_MS);
  }

  /** The session.update that configures a new connection. */
  sessionUpdate() {
    const session = { type: "realtime", audio: { input: { turn_detection: turnDetection(this.mode(), this.byWords) } },
                      tools: this.tools.map((t) => t.declaration), tool_choice: this.toolChoice };
    if (this.transcribe) session.audio.input.transcription = { model: "whisper-1" }; // echoed: the Thinker transcribes
    if (this.kind === "ws-opus") session.audio.output = { format: { type: "audio/opus" } };
    else if (this.kind === "ws-pcm16") session.audio.output = { format: { type: "audio/pcm", rate: 24000 } };
    return { type: "session.update", session };
  }

  /** The connection is up: the mic follows the turn mode, and the conversation waits for a turn. */
  ready() {
    this.transport.setMicOpen(this.mode() === "vad");
    this.#settle();
  }

  /** The session's turn mode changed while connected. */
  modeChanged() {
    this.transport.send({ type: "session.update",
                          session: { type: "realtime",
                                     audio: { input: { turn_detection: turnDetection(this.mode(), this.byWords) } } } });
    this.ready();
  }

  close() {
    this.closed = true;
    clearInterval(this.#pollTimer);
    this.transport.close();
    this.#setActivity("idle");
  }

  handle(ev) {
    switch (ev.type) {
      case "input_audio_buffer.speech_started": return this.#speechStarted(ev);
      case "input_audio_buffer.speech_stopped": return this.#speechStopped(ev);
      case "response.created":
        this.#responseId = ev.response?.id ?? null;
        this.#responseItem = null;
        this.#callsAnswered = 0;
        return this.#setActivity("thinking");
      case "response.output_item.added":
        if (ev.item?.type === "function_call") return this.#callAdded(ev.item);
        this.#responseItem = ev.item?.id ?? null;
        if (this.#responseItem) this.#addReply(this.#responseItem);
        return this.latency.replyAdded(this.#responseItem);
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
      case "response.audio_transcript.delta":
      case "response.text.delta":
        return this.#appendText(ev.item_id, ev.delta);
      case "response.output_item.done":
        if (ev.item?.type === "function_call") this.#callDone(ev.item);
        return;
      case "response.done": return this.#responseDone(ev.response || {});
      case "response.timing": return this.latency.timing(ev);
      case "input_audio_buffer.committed": return this.#committed(ev.item_id);
      case "conversation.item.added": return this.#itemAdded(ev.item);
      case "conversation.item.input_audio_transcription.delta":
        return this.#userView(ev.item_id).appendWords(ev.delta || "");
      case "conversation.item.input_audio_transcription.completed":
        return this.#userView(ev.item_id).words(ev.transcript || "");
      case "conversation.item.input_audio_transcription.failed":
        return this.#userView(ev.item_id).notTranscribed(ev.error?.message || ev.error?.code || "failed");
      case "output_audio_buffer.started":
        this.playback.started(ev, this.#responseItem);
        return this.#setActivity("speaking");
      case "output_audio_buffer.stopped":
      case "output_audio_buffer.cleared":
        this.playback.stopped(ev.type === "output_audio_buffer.cleared");
        if (this.activity === "speaking") this.#settle();
        return;
      case "conversation.item.truncated":
        this.counts.truncationsAcked += 1;
        return;
      case "error": return this.banner.error(ev.error?.message || JSON.stringify(ev.error));
      default: return;
    }
  }

  // ------------------------------------------------------------ push-to-talk

  /** The talk button went down: cut the assistant off if it is talking, and send the mic from now on. */
  async pressTalk() {
    this.#ptt = { startedAt: performance.now() };
    if (this.#assistantBusy()) {
      if (this.#responseId) this.transport.send({ type: "response.cancel" });
      await this.#bargeIn();
    }
    this.transport.send({ type: "input_audio_buffer.clear" });
    this.transport.setMicOpen(true);
    this.#startUserTurn();
  }

  /** The talk button came up: commit what was said and ask for the reply, unless it was too short. */
  async releaseTalk() {
    const ptt = this.#ptt;
    if (!ptt || this.closed) return;
    this.#ptt = null;
    const releasedAt = performance.now();
    const heldMs = releasedAt - ptt.startedAt;
    // Audio captured just before the release is still on its way: close the mic and commit once it has arrived.
    await new Promise((r) => setTimeout(r, this.transport.inputLagMs));
    if (this.closed) return;
    this.transport.setMicOpen(false);
    const userTurn = this.#userTurn;
    this.#userTurn = null;
    if (heldMs < MIN_PTT_MS) {
      userTurn?.view.remove();
      this.#setActivity("ptt-ready");
      this.banner.info("Hold the button while you talk.");
      return;
    }
    userTurn?.view.finish(heldMs / 1000);
    this.#unclaimed = userTurn?.view ?? null;
    this.frames.committing(userTurn?.view);
    this.transport.send({ type: "input_audio_buffer.commit" });
    this.transport.send({ type: "response.create" });
    this.latency.speechEnded(releasedAt);
    this.#setActivity("thinking");
  }

  // ------------------------------------------------------------ turns

  #speechStarted(ev) {
    if (this.#assistantBusy()) this.#bargeIn();
    this.#startUserTurn(ev.audio_start_ms ?? 0);
    this.frames.speechStarted(this.#userTurn.view);
  }

  #speechStopped(ev) {
    const now = performance.now();
    const userTurn = this.#userTurn || { view: this.transcript.user(""), startMs: 0 };
    userTurn.view.finish(Math.max(0, ((ev.audio_end_ms ?? 0) - userTurn.startMs) / 1000));
    this.#unclaimed = userTurn.view;
    this.#userTurn = null;
    this.latency.speechEnded(now);
    this.#setActivity("thinking");
  }

  #startUserTurn(startMs = 0) {
    this.counts.userTurns += 1;
    this.#userTurn = { view: this.transcript.user("listening…"), startMs };
    this.#setActivity("user-speaking");
  }

  /** The server made the ended turn's audio item `itemId`: its words, if transcribed, go to that turn's view. */
  #committed(itemId) {
    if (!itemId || !this.#unclaimed) return;
    this.#userViews.set(itemId, this.#unclaimed);
    this.#unclaimed = null;
  }

  /** The server's echo of an item: one made of a user turn tells whether the turn's frame went with it. */
  #itemAdded(item) {
    const view = item?.role === "user" && this.#userViews.get(item.id);
    if (view) this.frames.itemAdded(item, view);
  }

  /** The view of user item `itemId`; one of its own for audio the page saw no turn for (an idle timeout's). */
  #userView(itemId) {
    let view = this.#userViews.get(itemId);
    if (!view) {
      view = this.transcript.user("");
      this.#userViews.set(itemId, view);
    }
    return view;
  }

  #addReply(itemId) {
    if (this.replies.has(itemId)) return;
    const reply = { id: itemId, status: "in_progress", text: "", latencyMs: null, receivedMs: 0, playedMs: 0,
                    dropped: false };
    this.replies.set(itemId, reply);
    this.#views.set(itemId, this.transcript.reply(reply));
  }

  #appendText(itemId, delta) {
    const reply = itemId && this.replies.get(itemId);
    if (!reply || !delta) return;
    reply.text += delta;
    this.#views.get(itemId).appendText(delta);
  }

  #setStatus(reply, status) {
    reply.status = status;
    this.#views.get(reply.id).render(reply);
  }

  #responseDone(response) {
    const status = response.status || "completed";
    this.promptImageTokens = response.usage?.input_token_details?.image_tokens ?? 0;
    if (status === "completed") this.counts.responsesCompleted += 1;
    else if (status === "cancelled") this.counts.responsesCancelled += 1;
    else this.counts.responsesFailed += 1;
    const itemId = response.output?.find((o) => o.type === "message")?.id || this.#responseItem;
    const reply = itemId && this.replies.get(itemId);
    if (reply) this.#setStatus(reply, status);
    if (status === "failed") {
      const err = response.status_details?.error;
      this.banner.error(`response failed: ${err?.message || err?.code || "unknown"}`);
    }
    this.#responseId = null;
    if (status !== "completed") this.latency.replyFailed(itemId);
    if (status === "completed" && this.#callsAnswered > 0) return this.#answerCalls(); // still thinking
    if (this.activity === "thinking") this.#settle();
  }

  // ------------------------------------------------------------ tool calls

  #callAdded(item) {
    this.#callViews.set(item.id, this.transcript.call(item.name || "?"));
  }

  /** A call is written: run it here, show it, and send its output (the answer is asked for at response.done). */
  #callDone(item) {
    const view = this.#callViews.get(item.id) || this.transcript.call(item.name || "?");
    if (item.status !== "completed") return view.cutOff(); // cut off: the server leaves it out of the next prompt
    const tool = this.tools.find((t) => t.name === item.name);
    const output = tool ? tool.call(item.arguments, item.call_id) : { error: `no tool named ${item.name}` };
    view.done(item.arguments, output);
    this.transport.send({ type: "conversation.item.create",
                          item: { type: "function_call_output", call_id: item.call_id, output: JSON.stringify(output) } });
    this.#callsAnswered += 1;
  }

  /**
   * The response that made the calls is over: ask for the reply that reads their outputs. A forced choice (required,
   * or a named tool) would force another call there, and so on forever: that reply may use no tool.
   */
  #answerCalls() {
    this.#callsAnswered = 0;
    const forced = this.toolChoice !== "auto" && this.toolChoice !== "none";
    this.transport.send(forced ? { type: "response.create", response: { tool_choice: "none" } }
                               : { type: "response.create" });
  }

  #heard(itemId, at) {
    const ms = this.latency.heard(itemId, at);
    const reply = ms !== null && this.replies.get(itemId);
    if (!reply) return;
    reply.latencyMs = ms;
    this.#views.get(itemId).render(reply);
  }

  #onProgress(msg) {
    if (this.activity === "speaking" && msg.bufferedMs === 0 && this.#responseId === null) this.#settle();
  }

  // ------------------------------------------------------------ barge-in

  #assistantBusy() {
    return this.#responseId !== null || this.playback.busy();
  }

  /** The user talks over the reply: stop it here at once and tell the server how much of it was heard. */
  async #bargeIn() {
    this.counts.bargeIns += 1;
    const generating = this.#responseId !== null ? this.#responseItem : null;
    for (const { reply, truncateMs } of await this.playback.interrupt(generating)) {
      this.#setStatus(reply, "interrupted");
      if (truncateMs !== null) this.#truncate(reply.id, truncateMs);
    }
  }

  #truncate(itemId, playedMs) {
    if (this.closed) return;
    this.transport.send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0,
                          audio_end_ms: Math.max(0, Math.floor(playedMs)) });
    this.counts.truncationsSent += 1;
  }

  // ------------------------------------------------------------ activity and stats

  /** Between turns: listening (hands-free) or waiting for the talk button. */
  #settle() {
    this.#setActivity(this.mode() === "vad" ? "listening" : "ptt-ready");
  }

  #setActivity(next) {
    this.activity = next;
    this.onChange();
  }

  async #pollLink() {
    try {
      const s = await this.transport.stats();
      this.link = { packetsReceived: s.packetsReceived, packetsLost: s.packetsLost };
      this.playback.linkStats(s);
    } catch { /* closing */ }
  }
}
