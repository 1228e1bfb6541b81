// The talk controls: the hands-free / push-to-talk switch, the talk button (a click starts and stops a
// hands-free session; in push-to-talk it is held, as is Space), its label and hint, and the end button.
// Owns whether the button is held; the session owns the mode and the connection.

export class TalkControl {
  /** modeSwitch: the segmented control of mode buttons (data-mode); talk, label, hint, end: the elements. */
  constructor({ session, modeSwitch, talk, label, hint, end }) {
    this.session = session;
    this.el = { modeSwitch, talk, label, hint, end };
    this.held = false; // the button (or Space) is down, whether or not the session is up yet
    for (const b of modeSwitch.querySelectorAll("button")) b.addEventListener("click", () => session.setMode(b.dataset.mode));
    talk.addEventListener("click", () => {
      if (session.mode !== "vad") return;
      if (session.state === "connected" || session.state === "connecting") session.disconnect();
      else session.start();
    });
    talk.addEventListener("pointerdown", (e) => {
      if (session.mode !== "ptt") return;
      talk.setPointerCapture(e.pointerId);
      this.press();
    });
    talk.addEventListener("pointerup", () => this.release());
    talk.addEventListener("pointercancel", () => this.release());
    window.addEventListener("keydown", (e) => {
      if (e.code === "Space" && session.mode === "ptt" && !e.repeat && e.target === document.body) {
        e.preventDefault();
        this.press();
      }
    });
    window.addEventListener("keyup", (e) => {
      if (e.code === "Space" && session.mode === "ptt") this.release();
    });
    end.addEventListener("click", () => session.disconnect());
    session.addEventListener("change", () => this.render());
    this.render();
  }

  /** Push-to-talk down: connect first if need be (a release meanwhile cancels the turn). */
  async press() {
    if (this.session.mode !== "ptt" || this.held) return;
    this.held = true;
    if (this.session.state !== "connected") {
      try { await this.session.connect(); } catch { this.held = false; return; }
      if (!this.held) return; // released while connecting
    }
    await this.session.pressTalk();
  }

  async release() {
    this.held = false;
    await this.session.releaseTalk();
  }

  render() {
    const { state, mode, activity } = this.session;
    for (const b of this.el.modeSwitch.querySelectorAll("button")) b.setAttribute("aria-checked", String(b.dataset.mode === mode));
    const connected = state === "connected";
    this.el.talk.dataset.state = connected ? activity : state;
    this.el.end.hidden = !(connected || state === "connecting");
    let label, hint;
    if (state === "connecting") [label, hint] = ["…", "Connecting"];
    else if (!connected) {
      label = mode === "ptt" ? "Hold" : "Start";
      hint = mode === "ptt" ? "Hold the button (or Space) and talk" : "Click to start a hands-free conversation";
    } else if (mode === "ptt") {
      label = activity === "user-speaking" ? "Talking" : "Hold";
      hint = { "user-speaking": "Release to send", thinking: "Thinking…", speaking: "Speaking — hold to interrupt" }[activity]
        || "Hold the button (or Space) and talk";
    } else {
      label = "Stop";
      hint = { "user-speaking": "Hearing you…", thinking: "Thinking…", speaking: "Speaking — just talk to interrupt" }[activity]
        || "Listening — just talk";
    }
    this.el.label.textContent = label;
    this.el.hint.textContent = hint;
  }
}
