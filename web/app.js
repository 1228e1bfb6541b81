// The voice demo page: picks a transport, runs turns (server VAD or push-to-talk), plays replies, handles barge-in,
// measures per-turn latency, and exposes what it saw on window.voiceDemo for tests.
//
// Latency of a turn = speech end -> first reply audio heard:
//   speech end : arrival of input_audio_buffer.speech_stopped (hands-free) or the talk button's release (push-to-talk)
//   heard      : WebSocket modes: the playback worklet rendering the reply's first frame (+ the context's reported
//                output latency); WebRTC: the first non-silent remote audio after output_audio_buffer.started, or
//                the started event itself if the remote track stays silent (e.g. no audio output at all).

import { AudioEngine, dbfs } from "./audio.js";
import { WebSocketTransport } from "./transport-ws.js";
import { WebRtcTransport, CallsEndpointMissing } from "./transport-webrtc.js";

const params = new URLSearchParams(location.search);
const BASE_URL = params.get("server") || location.origin;
const API_KEY = params.get("key") || null;
const TRANSPORTS = {
  webrtc: "WebRTC",
  "ws-opus": "WebSocket + Opus",
  "ws-pcm16": "WebSocket + PCM16",
};
const REMOTE_AUDIBLE_RMS = 1e-3; // -60 dBFS: the remote track carries sound
const MIN_PTT_MS = 150; // the server refuses to commit less than 100 ms
const MIC_PATH = "M12 15a3.5 3.5 0 0 0 3.5-3.5v-6a3.5 3.5 0 1 0-7 0v6A3.5 3.5 0 0 0 12 15Zm6-3.5a1 1 0 1 0-2 0 4 4 0 0 1-8 0 "
  + "1 1 0 1 0-2 0 6 6 0 0 0 5 5.91V20H8.5a1 1 0 1 0 0 2h7a1 1 0 1 0 0-2H13v-2.59a6 6 0 0 0 5-5.91Z";

const $ = (id) => document.getElementById(id);
const el = {
  model: $("model"), notice: $("random-notice"), conn: $("conn-state"), transport: $("transport"),
  mode: $("mode"), talk: $("talk"), talkLabel: $("talk-label"), ring: $("ring"), hint: $("hint"),
  meterFill: $("meter-fill"), meterDb: $("meter-db"), end: $("end"), turns: $("turns"), empty: $("empty"),
  banner: $("banner"), audioEl: $("remote-audio"), statsList: $("stats"), latLast: $("lat-last"),
  latMedian: $("lat-median"), latBars: $("lat-bars"),
};

// ---------------------------------------------------------------- what the page saw (window.voiceDemo.stats)

const stats = {};
const FRESH_STATS = () => ({
  transport: null,
  turns: 0, // responses finished (response.done), whatever their status
  responsesCompleted: 0,
  responsesCancelled: 0,
  responsesFailed: 0,
  lastResponseStatus: null,
  userTurns: 0,
  audioSamplesPlayed: 0, // WS: frames rendered by the playback worklet (context rate); WebRTC: decoded samples
  audioMsPlayed: 0,
  audioMsReceived: 0,
  packetsReceived: 0, // WS+Opus: binary packets; WS+PCM16: audio deltas; WebRTC: RTP packets
  packetsLost: 0,
  underruns: 0,
  jitterBufferMs: null, // WebRTC: the receiver's mean jitter-buffer delay
  lastLatencyMs: null,
  medianLatencyMs: null,
  latenciesMs: [],
  bargeIns: 0,
  truncationsSent: 0,
  truncationsAcked: 0,
  sessionId: null,
  sampleRate: null,
  micLevelDb: -100,
  remoteLevelDb: -100,
  eventCounts: {},
});
Object.assign(stats, FRESH_STATS(), { errors: [] }); // errors: everything that went wrong while the page was open

/** Counters start again with each connection; errors are kept for the page's life. */
function resetStats() {
  Object.assign(stats, FRESH_STATS());
  renderLatency();
}

let state = "idle"; // idle | connecting | connected | closed | error
let activity = "idle"; // listening | user-speaking | thinking | speaking | ptt-ready
let mode = params.get("mode") === "ptt" ? "ptt" : "vad";
let modelInfo = null;
let webrtcAvailable = typeof RTCPeerConnection !== "undefined";
const audio = new AudioEngine({ onPlayback: (msg) => onPlayback(msg) });
let transport = null;
let session = null; // per-connection bookkeeping, see newSession()

function newSession(kind) {
  return {
    kind,
    responseId: null, // the active response (between response.created and response.done)
    responseItem: null,
    items: new Map(), // assistant item id -> {el, text, meta, receivedMs, playedMs, dropped, latencyMs, status}
    userEl: null, // the user turn being spoken
    pending: null, // {speechEndAt, item}: a turn waiting for its first audio
    rtc: { playing: false, item: null, startedAt: 0, heard: false, audibleAtStart: 0 },
    remoteAudibleFrames: 0, // frames of the remote track the meter found not silent, since connecting
    ptt: { pressed: false, startedAt: 0 },
    playedBase: audio.progress.played,
    underrunBase: audio.progress.underruns,
  };
}

function recordError(message) {
  const text = String(message);
  stats.errors.push(text);
  showBanner(text, "error");
  console.warn("[voice-demo]", text);
}

// ---------------------------------------------------------------- connect / disconnect

function effectiveTransport(kind) {
  if (kind === "ws-opus" && typeof AudioDecoder === "undefined") return "ws-pcm16"; // no WebCodecs: PCM16
  if (kind === "webrtc" && !webrtcAvailable) return typeof AudioDecoder === "undefined" ? "ws-pcm16" : "ws-opus";
  return kind;
}

function sessionUpdate(kind) {
  const session = { type: "realtime", audio: { input: { turn_detection: turnDetection() } } };
  if (kind === "ws-opus") session.audio.output = { format: { type: "audio/opus" } };
  else if (kind === "ws-pcm16") session.audio.output = { format: { type: "audio/pcm", rate: 24000 } };
  return { type: "session.update", session };
}

function turnDetection() {
  return mode === "vad" ? { type: "server_vad", create_response: true, interrupt_response: true } : null;
}

async function connect(kind = el.transport.value) {
  if (state === "connecting" || state === "connected") await disconnect();
  kind = effectiveTransport(kind in TRANSPORTS ? kind : "webrtc");
  el.transport.value = kind;
  setState("connecting");
  hideBanner();
  resetStats();
  stats.transport = kind;
  if (session && el.turns.children.length) addDivider(`new session · ${TRANSPORTS[kind]}`);
  session = newSession(kind);
  try {
    await audio.start();
    stats.sampleRate = audio.sampleRate;
    if (!modelInfo) await loadModel();
    // Callbacks of a transport that has been replaced are ignored: late events never touch the new session.
    const s = session;
    const only = (fn) => (...args) => { if (session === s) fn(...args); };
    const common = {
      baseUrl: BASE_URL, model: modelInfo?.id, apiKey: API_KEY, audio,
      onEvent: only(onServerEvent), onMicLevel: only(onMicLevel), onClose: only(onTransportClosed),
    };
    transport = kind === "webrtc"
      ? new WebRtcTransport({ ...common, audioElement: el.audioEl, onRemoteLevel: only(onRemoteLevel) })
      : new WebSocketTransport({ ...common, opus: kind === "ws-opus", onAudio: only(onReplyAudio) });
    await transport.connect(sessionUpdate(kind));
    transport.setMicOpen(mode === "vad");
    setState("connected");
    setActivity(mode === "vad" ? "listening" : "ptt-ready");
  } catch (e) {
    if (e instanceof CallsEndpointMissing) {
      webrtcAvailable = false;
      markWebrtcUnavailable();
    }
    const t = transport;
    transport = null;
    if (t) t.close();
    recordError(`could not connect over ${TRANSPORTS[kind]}: ${e.message || e}`);
    setState("error");
    throw e;
  }
}

async function disconnect() {
  const t = transport;
  transport = null;
  if (t) t.close();
  await audio.clear();
  if (state !== "idle") setState("closed");
  setActivity("idle");
  meter(-100);
}

function onTransportClosed(reason) {
  if (!transport) return;
  transport = null;
  audio.clear();
  recordError(reason);
  setState("closed");
  setActivity("idle");
}

function markWebrtcUnavailable() {
  const option = el.transport.querySelector('option[value="webrtc"]');
  if (option) {
    option.disabled = true;
    option.textContent = "WebRTC (not on this server)";
  }
}

// ---------------------------------------------------------------- server events

function onServerEvent(ev) {
  stats.eventCounts[ev.type] = (stats.eventCounts[ev.type] || 0) + 1;
  if (!session) return;
  switch (ev.type) {
    case "session.created":
    case "session.updated":
      stats.sessionId = ev.session?.id ?? stats.sessionId;
      break;
    case "input_audio_buffer.speech_started":
      onSpeechStarted(ev);
      break;
    case "input_audio_buffer.speech_stopped":
      onSpeechStopped(ev);
      break;
    case "response.created":
      session.responseId = ev.response?.id ?? null;
      setActivity("thinking");
      break;
    case "response.output_item.added":
      session.responseItem = ev.item?.id ?? null;
      if (session.responseItem) assistantTurn(session.responseItem);
      if (session.pending && !session.pending.item) session.pending.item = session.responseItem;
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
    case "response.audio_transcript.delta":
    case "response.text.delta":
      appendText(ev.item_id, ev.delta);
      break;
    case "response.done":
      onResponseDone(ev.response || {});
      break;
    case "output_audio_buffer.started":
      onRtcStarted(ev);
      break;
    case "output_audio_buffer.stopped":
      onRtcStopped(false);
      break;
    case "output_audio_buffer.cleared":
      onRtcStopped(true);
      break;
    case "conversation.item.truncated":
      stats.truncationsAcked += 1;
      break;
    case "error":
      recordError(ev.error?.message || JSON.stringify(ev.error));
      break;
    default:
      break;
  }
}

function onSpeechStarted(ev) {
  if (assistantBusy()) bargeIn();
  session.userEl = userTurn("listening…");
  session.userEl.dataset.startMs = ev.audio_start_ms ?? 0;
  setActivity("user-speaking");
}

function onSpeechStopped(ev) {
  const now = performance.now();
  const userEl = session.userEl || userTurn("");
  const seconds = Math.max(0, ((ev.audio_end_ms ?? 0) - Number(userEl.dataset.startMs || 0)) / 1000);
  finishUserTurn(userEl, seconds);
  session.userEl = null;
  session.pending = { speechEndAt: now, item: null };
  setActivity("thinking");
}

function onResponseDone(response) {
  const status = response.status || "completed";
  stats.turns += 1;
  stats.lastResponseStatus = status;
  if (status === "completed") stats.responsesCompleted += 1;
  else if (status === "cancelled") stats.responsesCancelled += 1;
  else stats.responsesFailed += 1;
  const itemId = response.output?.[0]?.id || session.responseItem;
  const item = itemId && session.items.get(itemId);
  if (item) {
    item.status = status;
    item.el.dataset.status = status;
    renderItemMeta(item);
  }
  if (status === "failed") {
    const err = response.status_details?.error;
    recordError(`response failed: ${err?.message || err?.code || "unknown"}`);
  }
  session.responseId = null;
  if (session.pending && session.pending.item === itemId && status !== "completed") session.pending = null;
  if (activity === "thinking") setActivity(mode === "vad" ? "listening" : "ptt-ready");
}

// ---------------------------------------------------------------- reply audio (WebSocket modes)

function onReplyAudio(itemId, samples, rate) {
  const item = itemId && session?.items.get(itemId);
  if (!item || item.dropped) return; // the rest of an interrupted reply
  item.receivedMs += (samples.length / rate) * 1000;
  stats.audioMsReceived += (samples.length / rate) * 1000;
  audio.push(itemId, samples, rate);
}

function onPlayback(msg) {
  if (!session) return;
  if (msg.type === "started") {
    const item = session.items.get(msg.item);
    if (!item || item.dropped) return;
    for (const [id, other] of session.items) if (id !== msg.item && !other.dropped) other.playedMs = other.receivedMs;
    heard(msg.item, performance.now() + audio.outputLatencyMs);
    setActivity("speaking");
  } else if (msg.type === "progress" && session.kind !== "webrtc") {
    stats.audioSamplesPlayed = msg.played - session.playedBase;
    stats.audioMsPlayed = (stats.audioSamplesPlayed / audio.sampleRate) * 1000;
    stats.underruns = msg.underruns - session.underrunBase;
    const item = msg.item && session.items.get(msg.item);
    if (item && !item.dropped) {
      item.playedMs = msg.itemPlayedMs;
      if (activity === "speaking" && msg.bufferedMs === 0 && session.responseId === null) {
        setActivity(mode === "vad" ? "listening" : "ptt-ready");
      }
    }
  }
}

// ---------------------------------------------------------------- reply audio (WebRTC)

function onRtcStarted(ev) {
  const item = (ev.item_id && session.items.has(ev.item_id)) ? ev.item_id : session.responseItem;
  session.rtc = { playing: true, item, startedAt: performance.now(), heard: false,
                  audibleAtStart: session.remoteAudibleFrames };
  transport?.setOutputMuted?.(false);
  setActivity("speaking");
}

function onRtcStopped(cleared) {
  const rtc = session.rtc;
  if (rtc.playing && !rtc.heard && !cleared) heard(rtc.item, rtc.startedAt); // no audible sound: the event's time
  const item = rtc.item && session.items.get(rtc.item);
  if (item && !item.dropped) item.playedMs = ((session.remoteAudibleFrames - rtc.audibleAtStart) / audio.sampleRate) * 1000;
  rtc.playing = false;
  if (activity === "speaking") setActivity(mode === "vad" ? "listening" : "ptt-ready");
}

function onRemoteLevel(level) {
  stats.remoteLevelDb = dbfs(level.rms);
  if (session) session.remoteAudibleFrames = level.audibleFrames;
  const rtc = session?.rtc;
  if (rtc && rtc.playing && !rtc.heard && level.rms > REMOTE_AUDIBLE_RMS) {
    rtc.heard = true;
    heard(rtc.item, performance.now());
  }
}

// ---------------------------------------------------------------- latency

function heard(itemId, at) {
  const p = session?.pending;
  if (!p || !itemId || (p.item && p.item !== itemId)) return;
  session.pending = null;
  const ms = Math.max(0, Math.round(at - p.speechEndAt));
  stats.lastLatencyMs = ms;
  stats.latenciesMs.push(ms);
  const sorted = [...stats.latenciesMs].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  stats.medianLatencyMs = sorted.length % 2 ? sorted[mid] : Math.round((sorted[mid - 1] + sorted[mid]) / 2);
  const item = session.items.get(itemId);
  if (item) {
    item.latencyMs = ms;
    renderItemMeta(item);
  }
  renderLatency();
}

// ---------------------------------------------------------------- barge-in

function assistantBusy() {
  if (!session) return false;
  if (session.responseId) return true;
  if (session.kind === "webrtc") return session.rtc.playing;
  for (const item of session.items.values()) {
    if (!item.dropped && item.receivedMs - item.playedMs > 30) return true;
  }
  return false;
}

/** The user talks over the reply: stop it here at once and tell the server how much of it was heard. */
async function bargeIn() {
  stats.bargeIns += 1;
  const s = session;
  if (s.kind === "webrtc") {
    // The server drops its queued audio itself (output_audio_buffer.cleared); silence what is already here.
    transport?.setOutputMuted?.(true);
    const { item: itemId, playing, startedAt } = s.rtc;
    const item = itemId && s.items.get(itemId);
    if (item && playing) {
      item.dropped = true;
      // Heard: the sound the remote track carried since `started`. The wall clock since then (less our jitter
      // buffer) bounds it, but overcounts when the server ran dry and sent silence mid-reply.
      const audibleMs = ((s.remoteAudibleFrames - s.rtc.audibleAtStart) / audio.sampleRate) * 1000;
      const wallMs = performance.now() - startedAt - (stats.jitterBufferMs ?? 40);
      item.playedMs = Math.max(0, Math.min(audibleMs, wallMs));
      markInterrupted(item);
      sendTruncate(itemId, item.playedMs);
    }
    s.rtc.playing = false;
    return;
  }
  // Mark first (synchronously), so that no audio of these items is queued behind the clear.
  const victims = [];
  for (const [itemId, item] of s.items) {
    const generating = s.responseId !== null && s.responseItem === itemId;
    if (item.dropped || (!generating && item.receivedMs - item.playedMs <= 30)) continue;
    item.dropped = true;
    victims.push([itemId, item]);
  }
  const cleared = await audio.clear();
  for (const [itemId, item] of victims) {
    const played = cleared.item === itemId ? cleared.itemPlayedMs : item.playedMs;
    item.playedMs = played;
    markInterrupted(item);
    if (item.receivedMs > 0) sendTruncate(itemId, Math.min(played, item.receivedMs));
  }
}

function sendTruncate(itemId, playedMs) {
  if (!transport) return;
  transport.send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0,
                   audio_end_ms: Math.max(0, Math.floor(playedMs)) });
  stats.truncationsSent += 1;
}

// ---------------------------------------------------------------- push-to-talk

let pttHeld = false; // the button (or Space) is down, whether or not the session is up yet

async function pttPress() {
  if (mode !== "ptt" || pttHeld) return;
  pttHeld = true;
  if (state !== "connected") {
    try { await connect(el.transport.value); } catch { pttHeld = false; return; }
    if (!pttHeld) return; // released while connecting
  }
  const s = session;
  s.ptt.pressed = true;
  s.ptt.startedAt = performance.now();
  if (assistantBusy()) {
    if (s.responseId) transport.send({ type: "response.cancel" });
    await bargeIn();
  }
  transport.send({ type: "input_audio_buffer.clear" });
  transport.setMicOpen(true);
  s.userEl = userTurn("listening…");
  setActivity("user-speaking");
}

async function pttRelease() {
  pttHeld = false;
  const s = session;
  if (!s || !s.ptt.pressed || !transport) return;
  s.ptt.pressed = false;
  const releasedAt = performance.now();
  const heldMs = releasedAt - s.ptt.startedAt;
  const t = transport;
  // Audio captured just before the release is still on its way: close the mic and commit once it has arrived.
  await new Promise((r) => setTimeout(r, t.inputLagMs));
  if (t !== transport) return;
  t.setMicOpen(false);
  const userEl = s.userEl;
  s.userEl = null;
  if (heldMs < MIN_PTT_MS) {
    if (userEl) userEl.remove();
    setActivity("ptt-ready");
    showBanner("Hold the button while you talk.", "info");
    return;
  }
  finishUserTurn(userEl, heldMs / 1000);
  t.send({ type: "input_audio_buffer.commit" });
  t.send({ type: "response.create" });
  s.pending = { speechEndAt: releasedAt, item: null };
  setActivity("thinking");
}

function setMode(next) {
  mode = next === "ptt" ? "ptt" : "vad";
  for (const b of el.mode.querySelectorAll("button")) b.setAttribute("aria-checked", String(b.dataset.mode === mode));
  if (state === "connected" && transport) {
    transport.send({ type: "session.update",
                     session: { type: "realtime", audio: { input: { turn_detection: turnDetection() } } } });
    transport.setMicOpen(mode === "vad");
    setActivity(mode === "vad" ? "listening" : "ptt-ready");
  }
  renderTalk();
}

// ---------------------------------------------------------------- transcript

function userTurn(text) {
  stats.userTurns += 1;
  const li = document.createElement("li");
  li.className = "turn user";
  li.innerHTML = `<div class="bubble"><svg class="icon" viewBox="0 0 24 24" aria-hidden="true"><path d="${MIC_PATH}"/></svg>`
    + `<span class="text"></span></div>`;
  li.querySelector(".text").textContent = text;
  addTurn(li);
  return li;
}

function finishUserTurn(li, seconds) {
  li.querySelector(".text").textContent = `speech, ${seconds.toFixed(1)} s`;
}

function assistantTurn(itemId) {
  if (session.items.has(itemId)) return session.items.get(itemId);
  const li = document.createElement("li");
  li.className = "turn assistant";
  li.dataset.item = itemId;
  li.innerHTML = `<div class="bubble"><span class="text"></span></div><div class="meta"></div>`;
  const item = { el: li, text: li.querySelector(".text"), meta: li.querySelector(".meta"), receivedMs: 0,
                 playedMs: 0, dropped: false, latencyMs: null, status: "in_progress" };
  session.items.set(itemId, item);
  addTurn(li);
  renderItemMeta(item);
  return item;
}

function appendText(itemId, delta) {
  const item = itemId && session.items.get(itemId);
  if (!item || !delta) return;
  item.text.textContent += delta;
  scrollTranscript();
}

function markInterrupted(item) {
  item.el.dataset.status = "interrupted";
  item.status = "interrupted";
  renderItemMeta(item);
}

function renderItemMeta(item) {
  const parts = [];
  if (item.latencyMs !== null) parts.push(`<span class="lat">${item.latencyMs} ms to first audio</span>`);
  if (item.receivedMs > 0 && item.status !== "in_progress") parts.push(`${(item.receivedMs / 1000).toFixed(1)} s of audio`);
  if (item.status === "in_progress") parts.push("replying…");
  else if (item.status === "interrupted" || item.status === "cancelled") parts.push("interrupted");
  else if (item.status === "failed") parts.push("failed");
  item.meta.innerHTML = parts.join(" · ");
}

function addDivider(text) {
  const li = document.createElement("li");
  li.className = "divider";
  li.textContent = text;
  addTurn(li);
}

function addTurn(li) {
  el.empty.hidden = true;
  el.turns.appendChild(li);
  scrollTranscript();
}

function scrollTranscript() {
  el.turns.parentElement.scrollTop = el.turns.parentElement.scrollHeight;
}

// ---------------------------------------------------------------- rendering

function setState(next) {
  state = next;
  el.conn.dataset.state = next;
  el.conn.textContent = { idle: "not connected", connecting: "connecting…", connected: TRANSPORTS[stats.transport],
                          closed: "disconnected", error: "error" }[next];
  el.transport.disabled = next === "connecting";
  renderTalk();
}

function setActivity(next) {
  activity = next;
  renderTalk();
}

function renderTalk() {
  const connected = state === "connected";
  el.talk.dataset.state = connected ? activity : state;
  el.end.hidden = !(connected || state === "connecting");
  let label, hint;
  if (state === "connecting") [label, hint] = ["…", "Connecting"];
  else if (!connected) {
    label = mode === "ptt" ? "Hold" : "Start";
    hint = mode === "ptt" ? "Hold the button (or Space) and talk" : "Click to start a hands-free conversation";
  } else if (mode === "ptt") {
    label = activity === "user-speaking" ? "Talking" : "Hold";
    hint = { "user-speaking": "Release to send", thinking: "Thinking…", speaking: "Speaking — hold to interrupt" }[activity]
      || "Hold the button (or Space) and talk";
  } else {
    label = "Stop";
    hint = { "user-speaking": "Hearing you…", thinking: "Thinking…", speaking: "Speaking — just talk to interrupt" }[activity]
      || "Listening — just talk";
  }
  el.talkLabel.textContent = label;
  el.hint.textContent = hint;
}

function onMicLevel(level) {
  stats.micLevelDb = dbfs(level.rms);
  meter(stats.micLevelDb);
}

function meter(db) {
  const x = Math.min(1, Math.max(0, (db + 60) / 60));
  el.meterFill.style.width = `${(x * 100).toFixed(1)}%`;
  el.meterDb.textContent = db <= -99 ? "−∞ dB" : `${db.toFixed(0)} dB`;
  el.ring.style.setProperty("--level", x.toFixed(3));
}

function renderLatency() {
  el.latLast.textContent = stats.lastLatencyMs === null ? "—" : `${stats.lastLatencyMs}`;
  el.latMedian.textContent = stats.medianLatencyMs === null ? "—" : `${stats.medianLatencyMs}`;
  const recent = stats.latenciesMs.slice(-24);
  const top = Math.max(500, ...recent);
  el.latBars.innerHTML = recent
    .map((ms, i) => `<span title="turn ${stats.latenciesMs.length - recent.length + i + 1}: ${ms} ms" `
      + `style="height:${Math.max(4, (ms / top) * 100).toFixed(0)}%"></span>`)
    .join("");
}

async function refreshStats() {
  if (transport) {
    try {
      const s = await transport.stats();
      stats.packetsReceived = s.packetsReceived;
      stats.packetsLost = s.packetsLost;
      if (transport.kind === "webrtc") {
        // Samples the jitter buffer decoded from real packets (48 kHz; the server's silence between replies too).
        stats.audioSamplesPlayed = Math.max(0, s.samplesReceived - s.concealedSamples);
        stats.jitterBufferMs = s.jitterBufferMs;
        stats.audioMsPlayed = (stats.audioSamplesPlayed / 48000) * 1000;
      }
    } catch { /* closing */ }
  }
  const rows = [
    ["transport", stats.transport ? TRANSPORTS[stats.transport] : "—"],
    ["state", state],
    ["replies", `${stats.responsesCompleted} done · ${stats.responsesCancelled} cut`],
    ["audio played", `${(stats.audioMsPlayed / 1000).toFixed(1)} s`],
    ["packets received", `${stats.packetsReceived}${stats.packetsLost ? ` (${stats.packetsLost} lost)` : ""}`],
    ["underruns", `${stats.underruns}`],
    ["barge-ins", `${stats.bargeIns} (${stats.truncationsAcked}/${stats.truncationsSent} truncated)`],
    ["audio context", stats.sampleRate ? `${stats.sampleRate / 1000} kHz` : "—"],
    ["errors", `${stats.errors.length}`],
  ];
  el.statsList.innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd data-key="${k}">${v}</dd>`).join("");
}

function showBanner(text, kind) {
  el.banner.textContent = text;
  el.banner.dataset.kind = kind;
  el.banner.hidden = false;
}

function hideBanner() {
  el.banner.hidden = true;
}

async function loadModel() {
  try {
    const res = await fetch(new URL("/v1/models", BASE_URL), API_KEY ? { headers: { Authorization: `Bearer ${API_KEY}` } } : {});
    if (!res.ok) throw new Error(`GET /v1/models: ${res.status}`);
    const body = await res.json();
    modelInfo = body.data?.[0] || null;
  } catch (e) {
    el.model.textContent = "server unreachable";
    throw e;
  }
  el.model.textContent = modelInfo ? modelInfo.id : "no model";
  el.model.title = modelInfo?.description || "";
  el.notice.hidden = !modelInfo?.random_weights;
}

// ---------------------------------------------------------------- wiring

function init() {
  for (const [value, label] of Object.entries(TRANSPORTS)) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label;
    el.transport.appendChild(option);
  }
  if (!webrtcAvailable) markWebrtcUnavailable();
  if (typeof AudioDecoder === "undefined") {
    const option = el.transport.querySelector('option[value="ws-opus"]');
    option.disabled = true;
    option.textContent = "WebSocket + Opus (no WebCodecs here)";
  }
  el.transport.value = effectiveTransport(params.get("transport") || "webrtc");
  el.transport.addEventListener("change", () => {
    if (state === "connected") connect(el.transport.value).catch(() => {});
  });
  for (const b of el.mode.querySelectorAll("button")) b.addEventListener("click", () => setMode(b.dataset.mode));
  setMode(mode);

  el.talk.addEventListener("click", async () => {
    if (mode !== "vad") return;
    if (state === "connected" || state === "connecting") return disconnect();
    try {
      await connect(el.transport.value);
    } catch (e) {
      if (e instanceof CallsEndpointMissing) {
        // The server has no WebRTC endpoint: fall back to the WebSocket once, and say so.
        const fallback = effectiveTransport("ws-opus");
        el.transport.value = fallback;
        await connect(fallback).catch(() => {});
        if (state === "connected") showBanner("This server has no WebRTC endpoint: using the WebSocket.", "info");
      }
    }
  });
  el.talk.addEventListener("pointerdown", (e) => {
    if (mode !== "ptt") return;
    el.talk.setPointerCapture(e.pointerId);
    pttPress();
  });
  el.talk.addEventListener("pointerup", () => pttRelease());
  el.talk.addEventListener("pointercancel", () => pttRelease());
  window.addEventListener("keydown", (e) => {
    if (e.code === "Space" && mode === "ptt" && !e.repeat && e.target === document.body) {
      e.preventDefault();
      pttPress();
    }
  });
  window.addEventListener("keyup", (e) => {
    if (e.code === "Space" && mode === "ptt") pttRelease();
  });
  el.end.addEventListener("click", () => disconnect());
  // Leaving the page ends the session at once (the server frees it when the socket / peer connection closes).
  window.addEventListener("pagehide", () => {
    if (transport) transport.close();
    transport = null;
    audio.close();
  });

  renderTalk();
  renderLatency();
  refreshStats();
  setInterval(refreshStats, 250);
  loadModel().catch((e) => recordError(`cannot reach the server: ${e.message}`));
}

window.voiceDemo = {
  get state() { return state; },
  get activity() { return activity; },
  get mode() { return mode; },
  get model() { return modelInfo; },
  get webrtcAvailable() { return webrtcAvailable; },
  stats,
  connect: (kind) => connect(kind),
  disconnect: () => disconnect(),
  setMode: (m) => setMode(m),
  pushToTalk: { press: () => pttPress(), release: () => pttRelease() },
  /** The assistant turns of this connection, oldest first, as the page saw them. */
  replies: () => [...(session?.items ?? new Map()).entries()].map(([id, it]) => ({
    id, status: it.status, text: it.text.textContent, latencyMs: it.latencyMs,
    receivedMs: Math.round(it.receivedMs), playedMs: Math.round(it.playedMs), interrupted: it.dropped,
  })),
};

init();
