// The page's video source: off, the camera or a shared screen, chosen in its select where the model sees images.
// Owns the live video track, the small preview that plays it, and grabbing its current frame as a JPEG (a data URL).
//
// Dispatches "change" when the track changes (a WebRTC call swaps it into its video sender).

const FRAME_MAX_SIDE = 1280; // the server keeps no more than this either; the model sees ~400 tokens' worth at most
const FRAME_QUALITY = 0.8;

const SOURCES = {
  camera: () => navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 1280 }, height: { ideal: 720 } } }),
  screen: () => navigator.mediaDevices.getDisplayMedia({ video: true, audio: false }),
};

export class Camera extends EventTarget {
  #source = "off"; // off | camera | screen: what the track shows
  #stream = null;
  #opening = 0; // bumped by every use(): an older getUserMedia that resolves late is stopped, not shown

  /** select: the off / camera / screen <select>; preview: the muted <video> that shows it; banner: for refusals. */
  constructor({ select, preview, banner }) {
    super();
    this.select = select;
    this.preview = preview;
    this.banner = banner;
    this.canvas = document.createElement("canvas");
    for (const option of select.options) {
      const api = { camera: "getUserMedia", screen: "getDisplayMedia" }[option.value];
      if (api && !navigator.mediaDevices?.[api]) option.disabled = true;
    }
    select.value = "off";
    this.allow(false); // until the model says it sees images
    select.addEventListener("change", () => this.use(select.value));
  }

  /** Whether the served model sees images: where it does not, the control is disabled and the video goes off. */
  allow(takesImages) {
    this.select.disabled = !takesImages;
    this.select.title = takesImages ? "" : "the model takes no images";
    if (!takesImages && this.#source !== "off") this.use("off");
  }

  get source() { return this.#source; }

  /** The live video track, or null when off. */
  get track() {
    return this.#stream?.getVideoTracks()[0] ?? null;
  }

  /** Show `source` ("off" | "camera" | "screen"); a refusal (no permission, no device) leaves the video off. */
  async use(source) {
    const opening = ++this.#opening;
    let stream = null;
    if (source in SOURCES) {
      try {
        stream = await SOURCES[source]();
      } catch (e) {
        if (opening === this.#opening) this.banner.error(`no ${source}: ${e.message || e}`);
        source = "off";
      }
    } else {
      source = "off";
    }
    if (opening !== this.#opening) {
      if (stream) for (const track of stream.getTracks()) track.stop();
      return;
    }
    this.#show(source, stream);
  }

  /** The frame shown now as {url (a JPEG data URL), width, height}, its long side at most 1280 px; null if none. */
  frame() {
    const { videoWidth: width, videoHeight: height } = this.preview;
    if (!this.track || !width || !height) return null;
    const scale = Math.min(1, FRAME_MAX_SIDE / Math.max(width, height));
    this.canvas.width = Math.round(width * scale);
    this.canvas.height = Math.round(height * scale);
    this.canvas.getContext("2d").drawImage(this.preview, 0, 0, this.canvas.width, this.canvas.height);
    // Synchronous, unlike toBlob: a turn's frame is taken and sent before anything else the page sends for it.
    const url = this.canvas.toDataURL("image/jpeg", FRAME_QUALITY);
    return { url, width: this.canvas.width, height: this.canvas.height };
  }

  #show(source, stream) {
    if (this.#stream) for (const track of this.#stream.getTracks()) track.stop();
    this.#stream = stream;
    this.#source = source;
    this.select.value = source;
    this.preview.srcObject = stream;
    this.preview.hidden = !stream;
    if (stream) {
      this.preview.play().catch(() => {});
      // The browser's own "stop sharing" (or an unplugged camera) ends the track: the control says off again.
      stream.getVideoTracks()[0].addEventListener("ended", () => {
        if (this.#stream === stream) this.#show("off", null);
      });
    }
    this.dispatchEvent(new Event("change"));
  }
}
