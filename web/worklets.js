// AudioWorklet processors for the voice demo (loaded with audioWorklet.addModule).
//
//   "capture"  : mic in -> level reports and, optionally, 24 kHz PCM16 chunks (~40 ms) for the WebSocket modes.
//                Also used as a plain level meter (emitPcm: false), e.g. on the remote WebRTC track.
//   "playback" : a jitter buffer fed Float32 frames (any rate; resampled to the context rate here). It starts once
//                it holds `prebufferMs` of audio or its oldest frame has waited `maxWaitMs`, reports how much it has
//                played (per assistant item, for conversation.item.truncate), and drops everything at once on "clear".

/* global sampleRate, currentTime, registerProcessor, AudioWorkletProcessor */

// ---------------------------------------------------------------- streaming windowed-sinc resampler

const PHASES = 256;

class StreamResampler {
  constructor(inRate, outRate, halfTaps = 16) {
    this.inRate = inRate;
    this.outRate = outRate;
    this.passthrough = inRate === outRate;
    if (this.passthrough) return;
    this.step = inRate / outRate; // input samples per output sample
    this.halfTaps = halfTaps;
    // Low-pass below the lower Nyquist, with a little room for the transition band.
    const cutoff = Math.min(1, outRate / inRate) * 0.92;
    const taps = 2 * halfTaps;
    // table[p][j]: weight of input sample (floor(t) - halfTaps + 1 + j) when t's fraction is p / PHASES.
    this.table = new Float32Array((PHASES + 1) * taps);
    for (let p = 0; p <= PHASES; p++) {
      const frac = p / PHASES;
      let sum = 0;
      for (let j = 0; j < taps; j++) {
        const x = frac - (j - halfTaps + 1); // t - k
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * cutoff * x) / (Math.PI * cutoff * x);
        const w = Math.abs(x) >= halfTaps ? 0 : 0.5 + 0.5 * Math.cos((Math.PI * x) / halfTaps); // Hann
        const v = sinc * w;
        this.table[p * taps + j] = v;
        sum += v;
      }
      for (let j = 0; j < taps; j++) this.table[p * taps + j] /= sum; // unity gain at DC
    }
    this.reset();
  }

  reset() {
    if (this.passthrough) return;
    // The signal before the first sample is silence: history starts as halfTaps zeros.
    this.buf = new Float32Array(this.halfTaps);
    this.bufStart = -this.halfTaps; // absolute index of buf[0]
    this.t = 0; // absolute input position of the next output sample
  }

  process(input) {
    if (this.passthrough) return input.slice();
    const merged = new Float32Array(this.buf.length + input.length);
    merged.set(this.buf);
    merged.set(input, this.buf.length);
    const end = this.bufStart + merged.length; // one past the last absolute index
    const taps = 2 * this.halfTaps;
    const maxOut = Math.max(0, Math.ceil((end - this.halfTaps - this.t) / this.step) + 1);
    const out = new Float32Array(maxOut);
    let n = 0;
    while (n < maxOut) {
      const base = Math.floor(this.t);
      if (base + this.halfTaps >= end) break;
      const pos = (this.t - base) * PHASES;
      const p0 = Math.floor(pos);
      const a = pos - p0;
      const row0 = p0 * taps;
      const row1 = row0 + taps;
      const first = base - this.halfTaps + 1 - this.bufStart;
      let acc = 0;
      for (let j = 0; j < taps; j++) {
        const w = this.table[row0 + j] + a * (this.table[row1 + j] - this.table[row0 + j]);
        acc += w * merged[first + j];
      }
      out[n++] = acc;
      this.t += this.step;
    }
    // Keep what the next outputs still need.
    const keepFrom = Math.floor(this.t) - this.halfTaps + 1;
    const drop = Math.max(0, Math.min(merged.length, keepFrom - this.bufStart));
    this.buf = merged.slice(drop);
    this.bufStart += drop;
    return n === maxOut ? out : out.subarray(0, n);
  }
}

// ---------------------------------------------------------------- capture

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    this.emitPcm = o.emitPcm !== false;
    this.targetRate = o.targetRate || 24000;
    this.chunkSamples = Math.round((this.targetRate * (o.chunkMs || 40)) / 1000);
    this.levelEvery = Math.round((sampleRate * (o.levelMs || 50)) / 1000);
    // A render quantum (128 frames, ~3 ms) louder than this counts as sound; decoded digital silence is far below.
    this.audibleRms = o.audibleRms ?? 2e-4;
    this.audibleFrames = 0;
    this.resampler = new StreamResampler(sampleRate, this.targetRate);
    this.chunk = new Int16Array(this.chunkSamples);
    this.filled = 0;
    this.sumSq = 0;
    this.peak = 0;
    this.levelCount = 0;
    this.totalIn = 0;
    this.port.onmessage = (e) => {
      if (e.data && e.data.type === "flush") this.flush();
    };
  }

  flush() {
    if (this.filled > 0) {
      const pcm = this.chunk.slice(0, this.filled);
      this.port.postMessage({ type: "pcm", pcm, rate: this.targetRate }, [pcm.buffer]);
      this.filled = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    const frames = input && input.length ? input[0] : null;
    if (!frames) return true; // no input connected (or a disabled track): nothing to measure or send
    let blockSq = 0;
    for (let i = 0; i < frames.length; i++) {
      const v = frames[i];
      blockSq += v * v;
      const a = v < 0 ? -v : v;
      if (a > this.peak) this.peak = a;
    }
    this.sumSq += blockSq;
    if (blockSq > this.audibleRms * this.audibleRms * frames.length) this.audibleFrames += frames.length;
    this.levelCount += frames.length;
    this.totalIn += frames.length;
    if (this.levelCount >= this.levelEvery) {
      this.port.postMessage({ type: "level", rms: Math.sqrt(this.sumSq / this.levelCount), peak: this.peak,
                              frames: this.totalIn, audibleFrames: this.audibleFrames });
      this.sumSq = 0;
      this.peak = 0;
      this.levelCount = 0;
    }
    if (!this.emitPcm) return true;
    const resampled = this.resampler.process(frames);
    for (let i = 0; i < resampled.length; i++) {
      let s = resampled[i];
      s = s > 1 ? 1 : s < -1 ? -1 : s;
      this.chunk[this.filled++] = s < 0 ? s * 0x8000 : s * 0x7fff;
      if (this.filled === this.chunkSamples) {
        const pcm = this.chunk;
        this.port.postMessage({ type: "pcm", pcm, rate: this.targetRate }, [pcm.buffer]);
        this.chunk = new Int16Array(this.chunkSamples);
        this.filled = 0;
      }
    }
    return true;
  }
}

// ---------------------------------------------------------------- playback (jitter buffer)

class PlaybackProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions || {};
    this.prebuffer = Math.round((sampleRate * (o.prebufferMs ?? 60)) / 1000);
    this.rebuffer = Math.round((sampleRate * (o.rebufferMs ?? 40)) / 1000);
    this.maxWait = (o.maxWaitMs ?? 80) / 1000;
    this.reportEvery = Math.round((sampleRate * (o.reportMs ?? 50)) / 1000);
    this.resamplers = new Map(); // input rate -> StreamResampler
    this.queue = []; // {item, data: Float32Array at sampleRate, offset}
    this.buffered = 0; // frames queued
    this.playing = false;
    this.waitingSince = null; // currentTime when the first frame arrived while not playing
    this.threshold = this.prebuffer;
    this.played = 0; // frames of pushed audio played, in total
    this.currentItem = null; // the item whose audio was played last
    this.itemPlayed = 0; // frames played of currentItem
    this.underruns = 0;
    this.drained = false;
    this.sinceReport = 0;
    this.port.onmessage = (e) => this.onMessage(e.data);
  }

  onMessage(msg) {
    if (msg.type === "push") {
      let r = this.resamplers.get(msg.rate);
      if (!r) {
        r = new StreamResampler(msg.rate, sampleRate);
        this.resamplers.set(msg.rate, r);
      }
      const data = r.process(msg.samples);
      if (data.length === 0) return;
      if (this.drained && msg.item === this.currentItem) this.underruns += 1; // the reply went on after a drain
      this.drained = false;
      this.queue.push({ item: msg.item, data, offset: 0 });
      this.buffered += data.length;
      if (!this.playing && this.waitingSince === null) this.waitingSince = currentTime;
    } else if (msg.type === "clear") {
      const dropped = this.buffered;
      this.queue = [];
      this.buffered = 0;
      this.playing = false;
      this.waitingSince = null;
      this.threshold = this.prebuffer;
      this.drained = false;
      for (const r of this.resamplers.values()) r.reset();
      this.port.postMessage({ type: "cleared", ref: msg.ref, item: this.currentItem,
                              itemPlayedMs: (this.itemPlayed / sampleRate) * 1000,
                              droppedMs: (dropped / sampleRate) * 1000, played: this.played });
    }
  }

  process(inputs, outputs) {
    const output = outputs[0];
    const out = output[0];
    const n = out.length;
    if (!this.playing && this.buffered > 0 &&
        (this.buffered >= this.threshold || currentTime - this.waitingSince >= this.maxWait)) {
      this.playing = true;
      this.waitingSince = null;
    }
    let written = 0;
    if (this.playing) {
      while (written < n && this.queue.length) {
        const head = this.queue[0];
        if (head.item !== this.currentItem) {
          this.currentItem = head.item;
          this.itemPlayed = 0;
          this.port.postMessage({ type: "started", item: head.item, contextTime: currentTime });
        }
        const take = Math.min(n - written, head.data.length - head.offset);
        out.set(head.data.subarray(head.offset, head.offset + take), written);
        head.offset += take;
        written += take;
        this.itemPlayed += take;
        if (head.offset === head.data.length) this.queue.shift();
      }
      this.buffered -= written;
      this.played += written;
      if (this.buffered === 0) {
        // Drained: an underrun if the reply goes on, the reply's end otherwise; either way wait for more.
        this.playing = false;
        this.threshold = this.rebuffer;
        this.drained = true;
      }
    }
    for (let i = written; i < n; i++) out[i] = 0;
    for (let c = 1; c < output.length; c++) output[c].set(out);
    this.sinceReport += n;
    if (this.sinceReport >= this.reportEvery) {
      this.sinceReport = 0;
      this.port.postMessage({ type: "progress", played: this.played, bufferedMs: (this.buffered / sampleRate) * 1000,
                              item: this.currentItem, itemPlayedMs: (this.itemPlayed / sampleRate) * 1000,
                              underruns: this.underruns });
    }
    return true;
  }
}

registerProcessor("capture", CaptureProcessor);
registerProcessor("playback", PlaybackProcessor);
