// The microphone level: the meter bar, its dB readout and the ring around the talk button.

import { dbfs } from "./audio.js";

const FLOOR_DB = -60; // the bar's empty end

export class LevelMeter {
  /** fill: the bar's fill; readout: the dB text; ring: the element whose --level (0..1) scales the ring. */
  constructor({ fill, readout, ring }) {
    this.fill = fill;
    this.readout = readout;
    this.ring = ring;
    this.db = -100;
  }

  /** A capture worklet's level report: {rms, peak}. */
  level({ rms }) {
    this.show(dbfs(rms));
  }

  silence() {
    this.show(-100);
  }

  show(db) {
    this.db = db;
    const x = Math.min(1, Math.max(0, (db - FLOOR_DB) / -FLOOR_DB));
    this.fill.style.width = `${(x * 100).toFixed(1)}%`;
    this.readout.textContent = db <= -99 ? "−∞ dB" : `${db.toFixed(0)} dB`;
    this.ring.style.setProperty("--level", x.toFixed(3));
  }
}
