// Which camera frame goes with each user turn of one connection, how it reaches the server, and its thumbnail in the
// turn's transcript line. Over a WebSocket the page sends the frame itself, as a user item of one input_image; over
// WebRTC the server takes the newest frame of the call's video track as the turn commits, and the page shows a
// frame of the same track grabbed as the server's echo of the turn's item arrives.

export class TurnFrames {
  /** camera: the page's Camera; kind: the connection's transport; send(event): to the server. */
  constructor({ camera, kind, send }) {
    this.camera = camera;
    this.kind = kind;
    this.send = send;
    this.count = 0; // this connection's user turns that carried a frame
  }

  /**
   * Server VAD heard the user start a turn (`view`: its transcript line). Over a WebSocket the frame goes now: the
   * server creates the reply as soon as it commits the turn's audio, and an item sent once the page hears of that
   * commit would land after the reply started, outside its prompt. Sent now, the item is in the conversation before
   * the audio item commits (the server handles a connection's events in order, and a turn's speech_stopped comes
   * only after its silence), so the reply's prompt holds the frame, just before the words spoken over it.
   */
  speechStarted(view) {
    if (this.kind !== "webrtc") this.#sendFrame(view);
  }

  /** Push-to-talk: the page is about to commit the turn and ask for its reply; over a WebSocket the frame goes first. */
  committing(view) {
    if (this.kind !== "webrtc") this.#sendFrame(view);
  }

  /** The server's echo of the user item `item` it made of the turn shown by `view` (conversation.item.added). */
  itemAdded(item, view) {
    if (this.kind !== "webrtc" || !item.content?.some((part) => part.type === "input_image")) return;
    this.count += 1;
    const frame = this.camera.frame();
    if (frame) view.picture(frame.url);
  }

  #sendFrame(view) {
    const frame = this.camera.frame();
    if (!frame) return;
    this.send({ type: "conversation.item.create",
                item: { type: "message", role: "user", content: [{ type: "input_image", image_url: frame.url }] } });
    this.count += 1;
    view?.picture(frame.url);
  }
}
