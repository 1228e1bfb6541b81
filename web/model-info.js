// The served model as GET /v1/models describes it, and the header pill and random-weights notice that show it.

export class ModelInfo {
  /**
   * pill: the header's model pill; notice: the random-weights note, shown only for such a model; onLoad(): called
   * each time the info has loaded.
   */
  constructor({ baseUrl, apiKey, pill, notice, onLoad }) {
    this.baseUrl = baseUrl;
    this.apiKey = apiKey;
    this.pill = pill;
    this.notice = notice;
    this.onLoad = onLoad;
    this.info = null; // the first entry of /v1/models once loaded: {id, description, random_weights, ...}
  }

  /** Whether the model sees images (our /v1/models lists "image" in its input_modalities then). */
  get takesImages() {
    return this.info?.input_modalities?.includes("image") ?? false;
  }

  /** Whether the model makes speech text before it thinks (it transcribes anyway, and takes turns by the words). */
  get listensAhead() {
    return this.info?.listens_ahead ?? false;
  }

  async load() {
    try {
      const headers = this.apiKey ? { headers: { Authorization: `Bearer ${this.apiKey}` } } : {};
      const res = await fetch(new URL("/v1/models", this.baseUrl), headers);
      if (!res.ok) throw new Error(`GET /v1/models: ${res.status}`);
      const body = await res.json();
      this.info = body.data?.[0] || null;
    } catch (e) {
      this.pill.textContent = "server unreachable";
      throw e;
    }
    this.pill.textContent = this.info ? this.info.id : "no model";
    this.pill.title = this.info?.description || "";
    this.notice.hidden = !this.info?.random_weights;
    this.onLoad();
  }
}
