// The "Session" card: a few figures of the current (or last) connection, redrawn a few times a second.

import { TRANSPORT_LABELS } from "./transport-picker.js";

const REFRESH_MS = 250;

export class StatsPanel {
  /** list: the card's <dl>; the figures are read from session, audio (the AudioEngine) and banner. */
  constructor({ list, session, audio, banner }) {
    this.list = list;
    this.session = session;
    this.audio = audio;
    this.banner = banner;
    this.render();
    setInterval(() => this.render(), REFRESH_MS);
  }

  render() {
    const { kind, state, conversation: c } = this.session;
    const counts = c?.counts ?? {};
    const lost = c?.link.packetsLost ?? 0;
    const rate = this.audio.sampleRate;
    const rows = [
      ["transport", kind ? TRANSPORT_LABELS[kind] : "—"],
      ["state", state],
      ["replies", `${counts.responsesCompleted ?? 0} done · ${counts.responsesCancelled ?? 0} cut`],
      ["audio played", `${((c?.playback.msPlayed ?? 0) / 1000).toFixed(1)} s`],
      ["packets received", `${c?.link.packetsReceived ?? 0}${lost ? ` (${lost} lost)` : ""}`],
      ["underruns", `${c?.playback.underruns ?? 0}`],
      ["frames with turns", `${c?.frames.count ?? 0}`],
      ["image tokens", `${c?.promptImageTokens ?? 0} in the last prompt`],
      ["barge-ins", `${counts.bargeIns ?? 0} (${counts.truncationsAcked ?? 0}/${counts.truncationsSent ?? 0} truncated)`],
      ["audio context", rate ? `${rate / 1000} kHz` : "—"],
      ["errors", `${this.banner.errors.length}`],
    ];
    this.list.innerHTML = rows.map(([k, v]) => `<dt>${k}</dt><dd data-key="${k}">${v}</dd>`).join("");
  }
}
