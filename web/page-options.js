// The page's URL options that carry trust: the API key (kept out of URLs) and the gateway to connect to.

const KEY_STORAGE = "voice-gateway.api-key";

/**
 * The API key: a `?key=` is read once, moved to sessionStorage (this tab only) and stripped from the address bar,
 * so it stays out of history, bookmarks, Referer headers and the server's access log after the first load.
 */
export function takeApiKey(params) {
  if (params.has("key")) {
    const key = params.get("key");
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
    params.delete("key");
    const query = params.toString();
    history.replaceState(history.state, "", `${location.pathname}${query ? `?${query}` : ""}${location.hash}`);
  }
  return sessionStorage.getItem(KEY_STORAGE) || null;
}

/**
 * The gateway's origin: this page's own unless `?server=` names another, which the user must confirm first:
 * that server gets this site's microphone permission, the audio it captures and the API key.
 */
export function chooseServer(server) {
  if (!server) return location.origin;
  let url;
  try {
    url = new URL(server, location.href);
  } catch {
    return location.origin;
  }
  if (url.origin === location.origin) return location.origin;
  const ok = confirm(`Connect to ${url.origin}?\n\nThat server will receive your microphone audio` +
                     " (and this page's API key, if it has one).");
  return ok ? url.origin : location.origin;
}
