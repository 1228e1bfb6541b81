// The voice demo page's wiring: reads the URL's options, builds the pieces on their DOM elements and connects
// them. What each piece owns is said at the top of its file.
//
//   ?server=URL   the gateway (default: this page's origin; another one is confirmed first)
//   ?key=KEY      an API key: moved to sessionStorage and out of the address bar at once
//   ?transport=   webrtc (default) | ws-opus | ws-pcm16          ?mode=ptt       start in push-to-talk
//   ?tool_choice= auto (default) | none | required | set_lamp: whether the assistant must call the page's lamp
//                 tool (a model with random weights calls only when it must)
//   ?transcribe=  1 | 0: the server transcribes your turns (the transcript shows their words), or not; by default
//                 it does where the model makes your speech text anyway (the assistant)

import { AudioEngine } from "./audio.js";
import { Banner } from "./banner.js";
import { Camera } from "./camera.js";
import { LevelMeter } from "./level-meter.js";
import { Lamp } from "./lamp.js";
import { Latency } from "./latency.js";
import { ModelInfo } from "./model-info.js";
import { chooseServer, takeApiKey } from "./page-options.js";
import { TalkControl } from "./push-to-talk.js";
import { toolChoice } from "./conversation.js";
import { Session } from "./session.js";
import { StatsPanel } from "./stats-panel.js";
import { exposeTestHooks } from "./test-hooks.js";
import { Transcript } from "./transcript.js";
import { TransportPicker } from "./transport-picker.js";

const params = new URLSearchParams(location.search);
const apiKey = takeApiKey(params); // first: out of the address bar before any dialog waits on the user
const baseUrl = chooseServer(params.get("server"));
const $ = (id) => document.getElementById(id);

const banner = new Banner($("banner"));
const camera = new Camera({ select: $("camera"), preview: $("camera-preview"), banner });
const model = new ModelInfo({ baseUrl, apiKey, pill: $("model"), notice: $("random-notice"),
                              onLoad: () => camera.allow(model.takesImages) });
const audio = new AudioEngine({ onPlayback: (msg) => session.onPlayback(msg) });
const picker = new TransportPicker({ select: $("transport"), pill: $("conn-state"), initial: params.get("transport"),
                                     onChange: (kind) => session.switchTransport(kind) });
const transcript = new Transcript({ list: $("turns"), empty: $("empty") });
const latency = new Latency({ last: $("lat-last"), median: $("lat-median"), bars: $("lat-bars"),
                              split: $("lat-split") });
const meter = new LevelMeter({ fill: $("meter-fill"), readout: $("meter-db"), ring: $("ring") });
const tools = [new Lamp({ card: $("lamp") })];
const session = new Session({ baseUrl, apiKey, mode: params.get("mode"), audio, audioElement: $("remote-audio"),
                              picker, model, transcript, latency, meter, banner, tools,
                              toolChoice: toolChoice(params.get("tool_choice"), tools),
                              transcribe: params.has("transcribe") ? params.get("transcribe") === "1" : null,
                              camera });
session.addEventListener("change", () => picker.show(session.state, session.kind));
const talk = new TalkControl({ session, modeSwitch: $("mode"), talk: $("talk"), label: $("talk-label"),
                               hint: $("hint"), end: $("end") });
new StatsPanel({ list: $("stats"), session, audio, banner });
exposeTestHooks({ session, talk, picker, model, latency, meter, banner, audio, camera });

window.addEventListener("pagehide", () => session.leave());
model.load().catch((e) => banner.error(`cannot reach the server: ${e.message}`));
