// WebRTC, OpenAI's flow: the mic track and an "oai-events" data channel go into the offer, which is POSTed as
// application/sdp to /v1/realtime/calls; the answer (with the server's ICE candidates: no trickle) comes back.
// Events travel on the data channel as JSON; the reply arrives on the remote audio track, bracketed by
// output_audio_buffer.started / stopped (cleared on barge-in, when the server drops its queued audio itself).
// The page's camera or shared screen goes as a send-only video track, whose newest frame the server adds to each turn.

import { openMicrophone } from "./audio.js";

const ICE_GATHER_TIMEOUT_MS = 3000;
const CONNECT_TIMEOUT_MS = 15000;
// The server reads only the newest frame as a turn ends: a few frames a second show it the scene and spare it (and
// this page's encoder) most of the decoding that a camera's 30 would cost.
const VIDEO_MAX_FPS = 5;

export class CallsEndpointMissing extends Error {}

function iceGatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => { if (pc.iceGatheringState === "complete") done(); };
    const timer = setTimeout(done, timeoutMs); // send what we have: host candidates come first
    pc.addEventListener("icegatheringstatechange", check);
  });
}

export class WebRtcTransport {
  /**
   * opts: {baseUrl, model, apiKey, audio (AudioEngine), audioElement, camera (Camera),
   *        onEvent(event), onMicLevel({rms, peak}), onRemoteLevel({rms, peak}), onClose(reason)}
   */
  constructor(opts) {
    this.opts = opts;
    this.kind = "webrtc";
    this.pc = null;
    this.dc = null;
    this.video = null; // the video transceiver, which sends the camera's track while it is on
    this.onCamera = () => this.video?.sender.replaceTrack(this.opts.camera.track).catch(() => {});
    this.mic = null;
    this.micMeter = null;
    this.remoteMeter = null;
    this.remoteSource = null;
    this.gain = null;
    this.closed = false;
  }

  async connect(sessionUpdate) {
    const { baseUrl, model, apiKey, audio } = this.opts;
    this.mic = await openMicrophone();
    const pc = new RTCPeerConnection({ iceServers: [], bundlePolicy: "max-bundle" });
    this.pc = pc;
    for (const track of this.mic.getAudioTracks()) pc.addTrack(track, this.mic);
    // A video transceiver even while the camera is off: turning it on mid-call is then replaceTrack on it, with no
    // renegotiation (the server answers one offer per call). Without a track it sends nothing, and the server, which
    // adds only a recent frame to a turn, adds none.
    this.video = pc.addTransceiver(this.opts.camera.track ?? "video",
                                   { direction: "sendonly", sendEncodings: [{ maxFramerate: VIDEO_MAX_FPS }] });
    this.opts.camera.addEventListener("change", this.onCamera);
    const dc = pc.createDataChannel("oai-events");
    this.dc = dc;
    pc.ontrack = (e) => this._onRemoteTrack(e.streams[0] || new MediaStream([e.track]));

    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, ICE_GATHER_TIMEOUT_MS);
    const url = new URL("/v1/realtime/calls", baseUrl);
    if (model) url.searchParams.set("model", model);
    url.searchParams.set("timing", "1"); // our response.timing event: where each reply's wait went
    const headers = { "Content-Type": "application/sdp" };
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    const res = await fetch(url, { method: "POST", body: pc.localDescription.sdp, headers });
    const body = await res.text();
    if (!res.ok) {
      let message = body;
      try { message = JSON.parse(body).error?.message || body; } catch { /* not JSON */ }
      // 501: the server runs without its webrtc extra; 404 (or 405 from the static files mounted at /) without
      // an API error code: a server with no such endpoint. Either way, no WebRTC here.
      const missing = res.status === 501 || ((res.status === 404 || res.status === 405) && !/model/i.test(message));
      const Err = missing ? CallsEndpointMissing : Error;
      throw new Err(`POST /v1/realtime/calls: ${res.status} ${message}`.trim());
    }
    await pc.setRemoteDescription({ type: "answer", sdp: body });

    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the data channel did not open within 15 s")), CONNECT_TIMEOUT_MS);
      dc.onopen = () => { clearTimeout(timer); resolve(); };
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed") {
          clearTimeout(timer);
          reject(new Error("WebRTC connection failed (ICE/DTLS)"));
        }
      };
      if (dc.readyState === "open") { clearTimeout(timer); resolve(); }
    });
    dc.onmessage = (e) => {
      if (typeof e.data === "string") this.opts.onEvent(JSON.parse(e.data));
    };
    dc.onclose = () => this._lost("the data channel closed");
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "failed" || pc.connectionState === "closed") this._lost(`WebRTC ${pc.connectionState}`);
    };
    this.send(sessionUpdate);
    this.micMeter = audio.attachCapture(this.mic, { emitPcm: false, onLevel: this.opts.onMicLevel });
  }

  _onRemoteTrack(stream) {
    const { audio, audioElement } = this.opts;
    // Chromium feeds remote WebRTC audio into Web Audio only while the stream also plays in a media element;
    // muted is enough. Playback itself goes through Web Audio so that barge-in can silence it at once.
    audioElement.srcObject = stream;
    audioElement.muted = true;
    audioElement.play().catch(() => {});
    if (!audio.ctx || this.remoteSource) return;
    this.remoteSource = audio.ctx.createMediaStreamSource(stream);
    this.gain = audio.ctx.createGain();
    this.remoteSource.connect(this.gain).connect(audio.ctx.destination);
    this.remoteMeter = audio.attachCapture(stream, { emitPcm: false, onLevel: this.opts.onRemoteLevel });
  }

  _lost(reason) {
    if (this.closed) return;
    this.opts.onClose(reason);
    this.close();
  }

  /** Barge-in: silence what the jitter buffer still holds until the next reply starts. */
  setOutputMuted(muted) {
    if (!this.gain) return;
    const ctx = this.opts.audio.ctx;
    this.gain.gain.cancelScheduledValues(ctx.currentTime);
    this.gain.gain.setValueAtTime(muted ? 0 : 1, ctx.currentTime);
  }

  /** Push-to-talk: a disabled track sends silence. */
  setMicOpen(open) {
    if (this.mic) for (const track of this.mic.getAudioTracks()) track.enabled = open;
  }

  /** Milliseconds until audio captured now has reached the server's buffer (RTP plus its jitter buffer). */
  get inputLagMs() {
    return 200;
  }

  send(event) {
    if (this.dc && this.dc.readyState === "open") this.dc.send(JSON.stringify(event));
  }

  async stats() {
    const out = { packetsReceived: 0, packetsLost: 0, packetsSent: 0, samplesReceived: 0, concealedSamples: 0,
                  jitterBufferMs: null };
    if (!this.pc) return out;
    const report = await this.pc.getStats();
    report.forEach((s) => {
      if (s.type === "inbound-rtp" && s.kind === "audio") {
        out.packetsReceived += s.packetsReceived || 0;
        out.packetsLost += Math.max(0, s.packetsLost || 0);
        out.samplesReceived += s.totalSamplesReceived || 0;
        out.concealedSamples += s.concealedSamples || 0;
        if (s.jitterBufferEmittedCount) out.jitterBufferMs = (1000 * s.jitterBufferDelay) / s.jitterBufferEmittedCount;
      } else if (s.type === "outbound-rtp" && s.kind === "audio") {
        out.packetsSent += s.packetsSent || 0;
      }
    });
    return out;
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.opts.camera.removeEventListener("change", this.onCamera);
    for (const meter of [this.micMeter, this.remoteMeter]) if (meter) meter.detach();
    if (this.remoteSource) this.remoteSource.disconnect();
    if (this.gain) this.gain.disconnect();
    if (this.dc) this.dc.close();
    if (this.pc) this.pc.close();
    if (this.mic) for (const track of this.mic.getTracks()) track.stop();
    if (this.opts.audioElement) this.opts.audioElement.srcObject = null;
  }
}
