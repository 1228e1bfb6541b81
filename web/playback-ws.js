// Reply playback on the WebSocket transports: the page queues every reply's samples in the playback worklet, so
// it knows exactly what was heard. Owns the replies' receivedMs / playedMs / dropped and this connection's
// playback counters.
//
// Heard = the worklet rendering the reply's first frame, plus the output latency the context reports.
// Same interface as RtcPlayback (playback-webrtc.js); the WebRTC inputs do nothing here.

const BUSY_MS = 30; // more than this still queued: the reply is playing

export class WorkletPlayback {
  /**
   * replies: the conversation's Map(item id -> reply record); onHeard(itemId, at): a reply's first audio;
   * onProgress(report): the worklet's periodic report about a live reply ({item, itemPlayedMs, bufferedMs, ...}).
   */
  constructor({ audio, replies, onHeard, onProgress }) {
    this.audio = audio;
    this.replies = replies;
    this.onHeard = onHeard;
    this.onProgress = onProgress;
    this.receivedMs = 0;
    this.samplesPlayed = 0; // frames rendered by the worklet, at the context's rate
    this.underruns = 0;
    this.playedBase = audio.progress.played;
    this.underrunBase = audio.progress.underruns;
  }

  /** Reply audio from the transport: Float32 `samples` at `rate` of item `itemId`. */
  received(itemId, samples, rate) {
    const reply = itemId && this.replies.get(itemId);
    if (!reply || reply.dropped) return; // the rest of an interrupted reply
    const ms = (samples.length / rate) * 1000;
    reply.receivedMs += ms;
    this.receivedMs += ms;
    this.audio.push(itemId, samples, rate);
  }

  /** A message of the playback worklet (AudioEngine's onPlayback). */
  onPlayback(msg) {
    if (msg.type === "started") {
      const reply = this.replies.get(msg.item);
      if (!reply || reply.dropped) return;
      // The worklet moved on to this item: whatever came before it has been played out.
      for (const [id, other] of this.replies) if (id !== msg.item && !other.dropped) other.playedMs = other.receivedMs;
      this.onHeard(msg.item, performance.now() + this.audio.outputLatencyMs);
    } else if (msg.type === "progress") {
      this.samplesPlayed = msg.played - this.playedBase;
      this.underruns = msg.underruns - this.underrunBase;
      const reply = msg.item && this.replies.get(msg.item);
      if (reply && !reply.dropped) {
        reply.playedMs = msg.itemPlayedMs;
        this.onProgress(msg);
      }
    }
  }

  /** The transport's periodic stats: nothing here, the worklet's own reports count the playback. */
  linkStats() {}

  // output_audio_buffer.* and the remote track's level exist only over WebRTC.
  started() {}
  stopped() {}
  level() {}

  get msPlayed() {
    const rate = this.audio.sampleRate;
    return rate ? (this.samplesPlayed / rate) * 1000 : 0;
  }

  /** Some reply still has audio queued. */
  busy() {
    for (const reply of this.replies.values()) if (!reply.dropped && reply.receivedMs - reply.playedMs > BUSY_MS) return true;
    return false;
  }

  /**
   * Barge-in: drop every queued reply, and `generating` (the item being generated, or null) too.
   * Resolves to [{reply, truncateMs}]: truncateMs is what was heard, or null when no audio of it had arrived.
   */
  async interrupt(generating) {
    // Mark first (synchronously), so that no audio of these replies is queued behind the clear.
    const victims = [];
    for (const [itemId, reply] of this.replies) {
      if (reply.dropped || (itemId !== generating && reply.receivedMs - reply.playedMs <= BUSY_MS)) continue;
      reply.dropped = true;
      victims.push(reply);
    }
    const cleared = await this.audio.clear();
    return victims.map((reply) => {
      reply.playedMs = cleared.item === reply.id ? cleared.itemPlayedMs : reply.playedMs;
      return { reply, truncateMs: reply.receivedMs > 0 ? Math.min(reply.playedMs, reply.receivedMs) : null };
    });
  }
}
