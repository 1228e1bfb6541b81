// Reply playback over WebRTC: the reply arrives on the remote track, bracketed by output_audio_buffer.started and
// .stopped (.cleared on barge-in), so what was heard is inferred from the track's level. Owns the playing reply's
// bookkeeping, the replies' playedMs / dropped, and this connection's playback counters.
//
// Heard = the first non-silent remote audio after `started`, or the `started` event itself if the track stays
// silent (e.g. no audio output at all). Same interface as WorkletPlayback (playback-ws.js); its inputs, reply
// samples and the worklet's reports, do nothing here.

const REMOTE_AUDIBLE_RMS = 1e-3; // -60 dBFS: the remote track carries sound
const RTP_RATE = 48000; // the receiver's counters are at Opus's rate
const DEFAULT_JITTER_MS = 40; // until the receiver reports its jitter buffer

export class RtcPlayback {
  /** replies: the conversation's Map(item id -> reply record); onHeard(itemId, at): the reply's first audio. */
  constructor({ audio, transport, replies, onHeard }) {
    this.audio = audio;
    this.transport = transport;
    this.replies = replies;
    this.onHeard = onHeard;
    this.playing = null; // {item, startedAt, heard, audibleAtStart} between started and stopped/cleared
    this.remoteLevel = { rms: 0, audibleFrames: 0 }; // the remote track meter's last report
    this.receivedMs = 0; // the reply comes as RTP, not as counted samples
    this.samplesPlayed = 0; // decoded from real packets (the server's silence between replies too)
    this.underruns = 0;
    this.jitterBufferMs = null; // the receiver's mean jitter-buffer delay
  }

  // The reply is not queued in the page's worklet over WebRTC.
  received() {}
  onPlayback() {}

  /** output_audio_buffer.started; `current` is the reply being generated, for an event without item_id. */
  started(ev, current) {
    const item = ev.item_id && this.replies.has(ev.item_id) ? ev.item_id : current;
    this.playing = { item, startedAt: performance.now(), heard: false, audibleAtStart: this.remoteLevel.audibleFrames };
    this.transport.setOutputMuted(false);
  }

  /** output_audio_buffer.stopped, or .cleared (`cleared`) when the server dropped the rest. */
  stopped(cleared) {
    const p = this.playing;
    if (!p) return;
    if (!p.heard && !cleared) this.onHeard(p.item, p.startedAt); // no audible sound: the event's time
    const reply = p.item && this.replies.get(p.item);
    if (reply && !reply.dropped) reply.playedMs = this.#audibleMsSince(p);
    this.playing = null;
  }

  /** The remote track meter's report: {rms, peak, audibleFrames}. */
  level(report) {
    this.remoteLevel = report;
    const p = this.playing;
    if (p && !p.heard && report.rms > REMOTE_AUDIBLE_RMS) {
      p.heard = true;
      this.onHeard(p.item, performance.now());
    }
  }

  /** The transport's periodic stats (WebRtcTransport.stats()). */
  linkStats(s) {
    this.samplesPlayed = Math.max(0, s.samplesReceived - s.concealedSamples);
    this.jitterBufferMs = s.jitterBufferMs;
  }

  get msPlayed() {
    return (this.samplesPlayed / RTP_RATE) * 1000;
  }

  busy() {
    return this.playing !== null;
  }

  /**
   * Barge-in. The server drops its queued audio itself (output_audio_buffer.cleared) and truncates the item where
   * its track stopped; silence what is already here. Resolves to [{reply, truncateMs: null}] for the reply that
   * was playing, if any: what was heard is only estimated here, for the page's own view.
   */
  async interrupt() {
    this.transport.setOutputMuted(true);
    const p = this.playing;
    this.playing = null;
    const reply = p?.item && this.replies.get(p.item);
    if (!reply) return [];
    reply.dropped = true;
    // Heard: the sound the remote track carried since `started`. The wall clock since then (less our jitter
    // buffer) bounds it, but overcounts when the server ran dry and sent silence mid-reply.
    const wallMs = performance.now() - p.startedAt - (this.jitterBufferMs ?? DEFAULT_JITTER_MS);
    reply.playedMs = Math.max(0, Math.min(this.#audibleMsSince(p), wallMs));
    return [{ reply, truncateMs: null }];
  }

  #audibleMsSince(p) {
    return ((this.remoteLevel.audibleFrames - p.audibleAtStart) / this.audio.sampleRate) * 1000;
  }
}
