// The running transcript view: user turns ("speech, N s", or their words when the server transcribes them; a
// thumbnail of the camera frame that went with them), the assistant's replies with their transcript text and a meta
// line (latency, audio length, status), the tool calls the assistant made with what they returned, and session
// dividers.

const MIC_PATH = "M12 15a3.5 3.5 0 0 0 3.5-3.5v-6a3.5 3.5 0 1 0-7 0v6A3.5 3.5 0 0 0 12 15Zm6-3.5a1 1 0 1 0-2 0 4 4 0 0 1-8 0 "
  + "1 1 0 1 0-2 0 6 6 0 0 0 5 5.91V20H8.5a1 1 0 1 0 0 2h7a1 1 0 1 0 0-2H13v-2.59a6 6 0 0 0 5-5.91Z";

export class Transcript {
  /** list: the <ol> of turns, inside the scrolling box; empty: the placeholder shown until the first turn. */
  constructor({ list, empty }) {
    this.list = list;
    this.empty = empty;
  }

  get hasTurns() {
    return this.list.children.length > 0;
  }

  /**
   * A user turn showing `text` until finish(seconds) gives its length; remove() takes it back. Its words, when the
   * server transcribes them, replace that text (appendWords, words) and the length moves to the meta line;
   * notTranscribed(reason) only says so there. picture(url) shows the camera frame that went with the turn.
   */
  user(text) {
    const li = document.createElement("li");
    li.className = "turn user";
    li.innerHTML = `<div class="bubble"><svg class="icon" viewBox="0 0 24 24" aria-hidden="true"><path d="${MIC_PATH}"/></svg>`
      + `<span class="text"></span></div><div class="meta"></div>`;
    const textEl = li.querySelector(".text");
    const metaEl = li.querySelector(".meta");
    let length = null; // "speech, N s" once finished
    let words = null; // the transcript so far
    const render = () => {
      textEl.textContent = words || length || text;
      metaEl.textContent = words && length ? length : "";
      this.#scroll();
    };
    render();
    this.#add(li);
    return {
      finish: (seconds) => { length = `speech, ${seconds.toFixed(1)} s`; render(); },
      appendWords: (delta) => { li.dataset.transcription = "partial"; words = (words || "") + delta; render(); },
      words: (transcript) => { li.dataset.transcription = "completed"; words = transcript; render(); },
      // Quietly: the turn still counts; only its words are missing.
      notTranscribed: (reason) => {
        li.dataset.transcription = "failed";
        render();
        metaEl.textContent = "not transcribed";
        metaEl.title = reason;
      },
      picture: (url) => {
        const img = document.createElement("img");
        img.className = "frame";
        img.alt = "the frame sent with this turn";
        img.src = url;
        li.querySelector(".bubble").after(img);
        this.#scroll();
      },
      remove: () => li.remove(),
    };
  }

  /** An assistant turn for `reply` (see Conversation: {id, status, latencyMs, receivedMs, ...}). */
  reply(reply) {
    const li = document.createElement("li");
    li.className = "turn assistant";
    li.dataset.item = reply.id;
    li.innerHTML = `<div class="bubble"><span class="text"></span></div><div class="meta"></div>`;
    const textEl = li.querySelector(".text");
    const metaEl = li.querySelector(".meta");
    const view = {
      appendText: (delta) => {
        textEl.textContent += delta;
        this.#scroll();
      },
      render: (r) => {
        if (r.status !== "in_progress") li.dataset.status = r.status;
        metaEl.innerHTML = replyMeta(r);
      },
    };
    this.#add(li);
    view.render(reply);
    return view;
  }

  /** A tool call the assistant is writing; done(args, output) shows it run, cutOff() that it never finished. */
  call(name) {
    const li = document.createElement("li");
    li.className = "turn call";
    li.dataset.name = name;
    li.innerHTML = `<div class="bubble"><span class="text"></span></div>`;
    const textEl = li.querySelector(".text");
    textEl.textContent = `${name}(…)`;
    this.#add(li);
    return {
      done: (args, output) => {
        li.dataset.status = "completed";
        textEl.textContent = `${name}(${args.trim()}) → ${JSON.stringify(output)}`;
      },
      cutOff: () => {
        li.dataset.status = "incomplete";
        textEl.textContent = `${name}(…): cut off, not run`;
      },
    };
  }

  divider(text) {
    const li = document.createElement("li");
    li.className = "divider";
    li.textContent = text;
    this.#add(li);
  }

  #add(li) {
    this.empty.hidden = true;
    this.list.appendChild(li);
    this.#scroll();
  }

  #scroll() {
    const box = this.list.parentElement;
    box.scrollTop = box.scrollHeight;
  }
}

function replyMeta(reply) {
  const parts = [];
  if (reply.latencyMs !== null) parts.push(`<span class="lat">${reply.latencyMs} ms to first audio</span>`);
  if (reply.receivedMs > 0 && reply.status !== "in_progress") parts.push(`${(reply.receivedMs / 1000).toFixed(1)} s of audio`);
  if (reply.status === "in_progress") parts.push("replying…");
  else if (reply.status === "interrupted" || reply.status === "cancelled") parts.push("interrupted");
  else if (reply.status === "failed") parts.push("failed");
  return parts.join(" · ");
}
