// Per-turn latency, speech end -> first reply audio heard, over one connection: the turn waiting for its first
// audio, every turn's figure, their running median, and the latency card that shows them.
//
//   speech end : input_audio_buffer.speech_stopped (hands-free) or the talk button's release (push-to-talk)
//   heard      : reported by the playback tracker of the transport (playback-ws.js, playback-webrtc.js)
//
// Hands-free, the server's response.timing (our extension: docs/realtime.md) splits the last turn's wait from the
// end of the speech itself: the turn decision, the ears, the brain, the voice, and the network and playback (what
// the page heard after the server sent the first audio). Stages overlap where the reply started before the turn
// was decided, so they need not add up to the whole.

const BARS = 24; // turns shown in the card's bar chart

export class Latency {
  /** last, median: the card's two figures; bars: the bar chart of recent turns. */
  constructor({ last, median, bars, split }) {
    this.el = { last, median, bars, split };
    this.split = null; // the last turn's wait, split: {totalMs, turnMs, earsMs, brainMs, voiceMs, networkMs, earlyMs}
    this.lastHeard = null; // {itemId, at, speechEndAt} of the last turn measured
    this.latenciesMs = [];
    this.lastMs = null;
    this.medianMs = null;
    this.pending = null; // {speechEndAt, item}: a turn waiting for its first audio; item null until the reply is known
    this.#render();
  }

  /** A new connection: its turns start a new series. */
  reset() {
    this.split = null;
    this.lastHeard = null;
    this.#renderSplit();
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
    this.lastHeard = { itemId, at, speechEndAt: p.speechEndAt };
    const ms = Math.max(0, Math.round(at - p.speechEndAt));
    this.lastMs = ms;
    this.latenciesMs.push(ms);
    const sorted = [...this.latenciesMs].sort((a, b) => a - b);
    const mid = sorted.length >> 1;
    this.medianMs = sorted.length % 2 ? sorted[mid] : Math.round((sorted[mid - 1] + sorted[mid]) / 2);
    this.#render();
    return ms;
  }

  /** The server's response.timing for the last reply heard: its wait, split from the end of the speech. */
  timing(ev) {
    const h = this.lastHeard;
    if (!h || typeof ev.turn_ms !== "number") return;
    // speech_stopped arrived when the decision was made: the speech ended turn_ms before it on the page's clock too
    const totalMs = Math.round(h.at - h.speechEndAt + ev.turn_ms);
    const brainMs = ev.first_token_ms == null ? null : ev.first_token_ms - ev.reply_started_ms;
    const voiceMs = ev.first_token_ms == null ? null : ev.first_audio_ms - ev.first_token_ms;
    this.split = { totalMs, turnMs: ev.turn_ms, earsMs: ev.ears_ms ?? null, brainMs, voiceMs,
                   networkMs: totalMs - ev.first_audio_ms, earlyMs: Math.max(0, ev.turn_ms - ev.reply_started_ms) };
    this.#renderSplit();
  }

  #renderSplit() {
    const s = this.split;
    if (!this.el.split) return;
    if (!s) { this.el.split.innerHTML = ""; return; }
    const row = (label, ms, why) => ms == null ? ""
      : `<dt title="${why}">${label}</dt><dd>${Math.round(ms)} ms</dd>`;
    this.el.split.innerHTML = row("speech end → heard", s.totalMs, "the whole wait, from the end of your speech")
      + row("turn decision", s.turnMs, "the end of your speech until the server decided the turn was over")
      + row("ears", s.earsMs, "Whisper on your words (at the pause, while the turn was judged)")
      + row("brain", s.brainMs, "the language model until its first word")
      + row("voice", s.voiceMs, "the first clause's last words and its synthesis")
      + row("network + playback", s.networkMs, "the first audio sent until the page played it")
      + (s.earlyMs ? row("reply started early by", s.earlyMs, "the reply began before the turn was decided") : "");
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
