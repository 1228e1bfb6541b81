// Web Audio plumbing: one AudioContext, the capture/meter worklets, the playback jitter buffer, PCM helpers.

export const API_RATE = 24000; // the Realtime API's PCM16 rate, both directions

export class AudioEngine {
  /** onPlayback(message from the playback worklet): "started", "progress" and "cleared" reports. */
  constructor({ onPlayback }) {
    this.ctx = null;
    this.playback = null;
    this.nodes = new Set(); // capture/meter nodes and sources to disconnect on close
    this._clearWaiters = new Map();
    this._ref = 0;
    this.onPlayback = onPlayback;
    // The worklet counts over the page's life; a connection's counters start from what it last reported.
    this.progress = { played: 0, underruns: 0 };
  }

  async start() {
    if (this.ctx) {
      if (this.ctx.state === "suspended") await this.ctx.resume();
      return;
    }
    this.ctx = new AudioContext({ latencyHint: "interactive" });
    await this.ctx.audioWorklet.addModule(new URL("./worklets.js", import.meta.url));
    this.playback = new AudioWorkletNode(this.ctx, "playback", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { prebufferMs: 60, rebufferMs: 40, maxWaitMs: 80 },
    });
    this.playback.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "progress") this.progress = { played: msg.played, underruns: msg.underruns };
      if (msg.type === "cleared") {
        const resolve = this._clearWaiters.get(msg.ref);
        this._clearWaiters.delete(msg.ref);
        if (resolve) resolve(msg);
      }
      this.onPlayback(msg);
    };
    this.playback.connect(this.ctx.destination);
    if (this.ctx.state === "suspended") await this.ctx.resume();
  }

  get sampleRate() {
    return this.ctx ? this.ctx.sampleRate : 0;
  }

  /** Seconds between a frame leaving the worklet and reaching the speaker, as far as the browser knows. */
  get outputLatencyMs() {
    if (!this.ctx) return 0;
    return ((this.ctx.outputLatency || 0) + (this.ctx.baseLatency || 0)) * 1000;
  }

  /** A capture worklet on `stream`: onLevel({rms, peak}) every 50 ms and, with emitPcm, onPcm(Int16Array @ 24 kHz). */
  attachCapture(stream, { emitPcm, onLevel, onPcm }) {
    const source = this.ctx.createMediaStreamSource(stream);
    const node = new AudioWorkletNode(this.ctx, "capture", {
      numberOfInputs: 1,
      numberOfOutputs: 0,
      processorOptions: { emitPcm, targetRate: API_RATE, chunkMs: 40, levelMs: 50 },
    });
    node.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "level" && onLevel) onLevel(msg);
      else if (msg.type === "pcm" && onPcm) onPcm(msg.pcm);
    };
    source.connect(node);
    this.nodes.add(source);
    this.nodes.add(node);
    return {
      node,
      flush: () => node.port.postMessage({ type: "flush" }),
      detach: () => {
        source.disconnect();
        node.port.onmessage = null;
        this.nodes.delete(source);
        this.nodes.delete(node);
      },
    };
  }

  /** Queue reply audio of `item` for playback; `samples` is Float32 at `rate` (resampled in the worklet). */
  push(item, samples, rate) {
    if (!this.playback || samples.length === 0) return;
    this.playback.port.postMessage({ type: "push", item, samples, rate }, [samples.buffer]);
  }

  /** Drop all queued audio now. Resolves to {item, itemPlayedMs, droppedMs}: what of the last item was heard. */
  clear() {
    if (!this.playback) return Promise.resolve({ item: null, itemPlayedMs: 0, droppedMs: 0 });
    const ref = ++this._ref;
    return new Promise((resolve) => {
      this._clearWaiters.set(ref, resolve);
      this.playback.port.postMessage({ type: "clear", ref });
    });
  }

  async close() {
    for (const node of this.nodes) {
      try { node.disconnect(); } catch { /* already disconnected */ }
    }
    this.nodes.clear();
    for (const resolve of this._clearWaiters.values()) resolve({ item: null, itemPlayedMs: 0, droppedMs: 0 });
    this._clearWaiters.clear();
    const ctx = this.ctx;
    this.ctx = null;
    this.playback = null;
    if (ctx) await ctx.close().catch(() => {});
  }
}

/** The microphone, with the browser's echo cancellation (barge-in needs it on speakers). */
export async function openMicrophone() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("this page needs a secure context (https or localhost) for the microphone");
  }
  return navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    video: false,
  });
}

// ---------------------------------------------------------------- PCM16 <-> base64

export function int16ToBase64(pcm) {
  const bytes = new Uint8Array(pcm.buffer, pcm.byteOffset, pcm.byteLength);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function base64ToFloat32(b64) {
  const binary = atob(b64);
  const n = binary.length >> 1;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    let v = binary.charCodeAt(2 * i) | (binary.charCodeAt(2 * i + 1) << 8); // little-endian
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 0x8000;
  }
  return out;
}

/** A level in dBFS from an RMS value, floored at -100. */
export function dbfs(rms) {
  return rms > 1e-5 ? 20 * Math.log10(rms) : -100;
}
