// window.voiceDemo: what the browser tests (tests/browser/driver.py) read and drive. Every figure is read from
// the product objects' public state, or counted here from the session's "server-event"s; nothing here changes
// what the page does.

import { dbfs } from "./audio.js";

const NO_COUNTS = { responsesCompleted: 0, responsesCancelled: 0, responsesFailed: 0, userTurns: 0, bargeIns: 0,
                    truncationsSent: 0, truncationsAcked: 0 };

/**
 * What the server said to one conversation: event counts, the last response's status, the session id, the session's
 * tool settings and transcription as last updated, each finished function call, each response's output item types,
 * each response's status and prompt image tokens, the user items' content part types as echoed
 * (conversation.item.added), and their completed transcripts (item id -> text).
 */
function freshEvents(conversation) {
  return { conversation, eventCounts: {}, responsesDone: 0, lastResponseStatus: null, sessionId: null, session: null,
           calls: [], responseOutputs: [], responses: [], userItems: [], transcripts: {} };
}

function record(seen, ev) {
  if (ev.type === "session.updated") {
    const { tools, tool_choice: toolChoice, audio } = ev.session ?? {};
    seen.session = { tools: (tools ?? []).map((t) => t.name), toolChoice, transcription: audio?.input?.transcription ?? null };
  } else if (ev.type === "response.output_item.done" && ev.item?.type === "function_call") {
    const { call_id: callId, name, arguments: args, status } = ev.item;
    seen.calls.push({ callId, name, arguments: args, status });
  } else if (ev.type === "response.done") {
    seen.responseOutputs.push((ev.response?.output ?? []).map((o) => o.type));
    seen.responses.push({ status: ev.response?.status || "completed",
                          imageTokens: ev.response?.usage?.input_token_details?.image_tokens ?? 0 });
  } else if (ev.type === "conversation.item.added" && ev.item?.role === "user") {
    seen.userItems.push({ id: ev.item.id, content: (ev.item.content ?? []).map((part) => part.type) });
  } else if (ev.type === "conversation.item.input_audio_transcription.completed") {
    seen.transcripts[ev.item_id] = ev.transcript;
  }
}

export function exposeTestHooks({ session, talk, picker, model, latency, meter, banner, audio, camera }) {
  let seen = freshEvents(null);
  session.addEventListener("server-event", ({ detail: ev }) => {
    if (seen.conversation !== session.conversation) seen = freshEvents(session.conversation);
    seen.eventCounts[ev.type] = (seen.eventCounts[ev.type] || 0) + 1;
    if (ev.type === "session.created" || ev.type === "session.updated") seen.sessionId = ev.session?.id ?? seen.sessionId;
    if (ev.type === "response.done") {
      seen.responsesDone += 1;
      seen.lastResponseStatus = ev.response?.status || "completed";
    }
    record(seen, ev);
  });
  const events = () => (seen.conversation === session.conversation ? seen : freshEvents(session.conversation));

  /** The page's figures for the current (or last) connection; errors are those of the page's life. */
  function stats() {
    const c = session.conversation;
    const e = events();
    const counts = c?.counts ?? NO_COUNTS;
    const webrtc = c?.kind === "webrtc";
    return {
      transport: session.kind,
      turns: e.responsesDone, // responses finished, whatever their status
      ...counts,
      lastResponseStatus: e.lastResponseStatus,
      audioSamplesPlayed: c?.playback.samplesPlayed ?? 0, // WS: worklet frames (context rate); WebRTC: 48 kHz
      audioMsPlayed: c?.playback.msPlayed ?? 0,
      audioMsReceived: c?.playback.receivedMs ?? 0,
      packetsReceived: c?.link.packetsReceived ?? 0,
      packetsLost: c?.link.packetsLost ?? 0,
      underruns: c?.playback.underruns ?? 0,
      jitterBufferMs: webrtc ? c.playback.jitterBufferMs : null,
      lastLatencyMs: latency.lastMs,
      medianLatencyMs: latency.medianMs,
      latenciesMs: [...latency.latenciesMs],
      latencySplit: latency.split,
      sessionId: e.sessionId,
      sampleRate: audio.sampleRate || null,
      micLevelDb: meter.db,
      remoteLevelDb: webrtc ? dbfs(c.playback.remoteLevel.rms) : -100,
      eventCounts: { ...e.eventCounts },
      session: e.session,
      calls: [...e.calls],
      responseOutputs: [...e.responseOutputs],
      responses: [...e.responses],
      userItems: [...e.userItems],
      framesWithTurns: c?.frames.count ?? 0,
      transcripts: { ...e.transcripts },
      errors: [...banner.errors],
    };
  }

  window.voiceDemo = {
    get state() { return session.state; },
    get activity() { return session.activity; },
    get mode() { return session.mode; },
    get model() { return model.info; },
    get webrtcAvailable() { return picker.webrtcAvailable; },
    get camera() { return { source: camera.source, live: camera.track?.readyState === "live" }; },
    get stats() { return stats(); },
    connect: (kind) => session.connect(kind),
    disconnect: () => session.disconnect(),
    setMode: (m) => session.setMode(m),
    pushToTalk: { press: () => talk.press(), release: () => talk.release() },
    /** The assistant turns of this connection, oldest first, as the page saw them. */
    replies: () => [...(session.conversation?.replies.values() ?? [])].map((r) => ({
      id: r.id, status: r.status, text: r.text, latencyMs: r.latencyMs, receivedMs: Math.round(r.receivedMs),
      playedMs: Math.round(r.playedMs), interrupted: r.dropped,
    })),
  };
}
