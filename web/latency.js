// Per-turn latency, speech end -> first reply audio heard, over one connection: the turn waiting for its first
// audio, every turn's figure, their running median, and the latency card that shows them.
//
//   speech end : input_audio_buffer.speech_stopped (hands-free) or the talk button's release (push-to-talk)
//   heard      : reported by the playback tracker of the transport (playback-ws.js, playback-webrtc.js)

const BARS = 24; // turns shown in the card's bar chart

export class Latency {
  /** last, median: the card's two figures; bars: the bar chart of recent turns. */
  constructor({ last, median, bars }) {
    this.el = { last, median, bars };
    this.latenciesMs = [];
    this.lastMs = null;
    this.medianMs = null;
    this.pending = null; // {speechEndAt, item}: a turn waiting for its first audio; item null until the reply is known
    this.#render();
  }

  /** A new connection: its turns start a new series. */
  reset() {
    this.latenciesMs = [];
    this.lastMs = null;
    this.medianMs = null;
    this.pending = null;
    this.#render();
  }

  /** The user stopped talking at `at` (performance.now() time). */
  speechEnded(at) {
    this.pending = { speechEndAt: at, item: null };
  }

  /** The reply item of the waiting turn is known: only its audio counts. */
  replyAdded(itemId) {
    if (this.pending && !this.pending.item) this.pending.item = itemId;
  }

  /** A reply ended without completing: it will not be heard, so the turn is not measured. */
  replyFailed(itemId) {
    if (this.pending && this.pending.item === itemId) this.pending = null;
  }

  /** The first audio of `itemId` was heard at `at`: the turn's latency in ms, or null if no turn waited for it. */
  heard(itemId, at) {
    const p = this.pending;
    if (!p || !itemId || (p.item && p.item !== itemId)) return null;
    this.pending = null;
    const ms = Math.max(0, Math.round(at - p.speechEndAt));
    this.lastMs = ms;
    this.latenciesMs.push(ms);
    const sorted = [...this.latenciesMs].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    this.medianMs = sorted.length % 2 ? sorted[mid] : Math.round((sorted[mid - 1] + sorted[mid]) / 2);
    this.#render();
    return ms;
  }

  #render() {
    this.el.last.textContent = this.lastMs === null ? "—" : `${this.lastMs}`;
    this.el.median.textContent = this.medianMs === null ? "—" : `${this.medianMs}`;
    const recent = this.latenciesMs.slice(-BARS);
    const top = Math.max(500, ...recent);
    this.el.bars.innerHTML = recent
      .map((ms, i) => `<span title="turn ${this.latenciesMs.length - recent.length + i + 1}: ${ms} ms" `
        + `style="height:${Math.max(4, (ms / top) * 100).toFixed(0)}%"></span>`)
      .join("");
  }
}
