// The page's built-in tool: a lamp the assistant may switch with a function call (`set_lamp`), its state, and the
// card that draws it. The call runs here, in the page: the server only writes it and reads back what it returned.

// A boolean argument: a model that never closes a string (the random tiny one) still finishes the call.
const PARAMETERS = {
  type: "object",
  properties: { on: { type: "boolean", description: "true: switch the lamp on; false: switch it off" } },
  required: ["on"],
  additionalProperties: false,
};

export class Lamp {
  name = "set_lamp";

  /** card: the lamp's <section>, which holds the bulb and its label (`.state`). */
  constructor({ card }) {
    this.card = card;
    this.on = false;
    this.#draw(null);
  }

  /** The tool as a session.update's `tools` lists it. */
  get declaration() {
    return { type: "function", name: this.name, description: "Switch the lamp shown on the user's screen on or off.",
             parameters: PARAMETERS };
  }

  /** Run one call of `set_lamp` (`args`: its JSON arguments); what it returns is the call's output. */
  call(args, callId) {
    let on;
    try {
      on = JSON.parse(args).on;
    } catch {
      on = undefined;
    }
    if (typeof on !== "boolean") return { error: `expected {"on": true|false}, got ${args}` };
    this.on = on;
    this.#draw(callId);
    return { lamp: on ? "on" : "off" };
  }

  /** data-on: the state drawn; data-call: the call that set it (none until one did). */
  #draw(callId) {
    this.card.dataset.on = String(this.on);
    if (callId) this.card.dataset.call = callId;
    this.card.querySelector(".state").textContent = this.on ? "on" : "off";
  }
}
