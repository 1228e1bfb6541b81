// The banner under the header, and the list of every error it showed while the page was open.

export class Banner {
  /** element: the banner's <div>. */
  constructor(element) {
    this.element = element;
    this.errors = []; // kept for the page's life, not per connection: the stats panel counts them
  }

  error(message) {
    const text = String(message);
    this.errors.push(text);
    this.#show(text, "error");
    console.warn("[voice-demo]", text);
  }

  info(text) {
    this.#show(text, "info");
  }

  hide() {
    this.element.hidden = true;
  }

  #show(text, kind) {
    this.element.textContent = text;
    this.element.dataset.kind = kind;
    this.element.hidden = false;
  }
}
