// The running transcript view: user turns ("speech, N s": there is no speech recognition), the assistant's
// replies with their transcript text and a meta line (latency, audio length, status), and session dividers.

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

  /** A user turn showing `text` until finish(seconds) gives its length; remove() takes it back. */
  user(text) {
    const li = document.createElement("li");
    li.className = "turn user";
    li.innerHTML = `<div class="bubble"><svg class="icon" viewBox="0 0 24 24" aria-hidden="true"><path d="${MIC_PATH}"/></svg>`
      + `<span class="text"></span></div>`;
    const textEl = li.querySelector(".text");
    textEl.textContent = text;
    this.#add(li);
    return {
      finish: (seconds) => { textEl.textContent = `speech, ${seconds.toFixed(1)} s`; },
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
