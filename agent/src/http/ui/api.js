// The agent's HTTP API as the UI uses it: every request carries the tab's ACL token, a refused
// request becomes an ApiError holding the server's own message, and `watch` is the one
// blocking query (Consul's `?index=&wait=`) that keeps a view live.

const TOKEN_KEY = "vigil.token";

/** How long one blocking query may wait on the server before it answers unchanged. */
const WAIT = "30s";

/** The ACL token, kept in sessionStorage: gone when the tab closes. */
export function token() {
  return sessionStorage.getItem(TOKEN_KEY) ?? "";
}

export function setToken(value) {
  if (value) {
    sessionStorage.setItem(TOKEN_KEY, value);
  } else {
    sessionStorage.removeItem(TOKEN_KEY);
  }
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** A KV key or name as URL path segments (`/` kept, everything else escaped). */
export function pathOf(key) {
  return key.split("/").map(encodeURIComponent).join("/");
}

/**
 * Sends one request. Answers other than 2xx throw an ApiError with the server's text, except a
 * 404 when `notFound` is set (a missing key is an answer, with its index, not an error).
 */
export async function request(method, path, { body, signal, notFound = false } = {}) {
  const headers = {};
  const t = token();
  if (t) {
    headers["X-Consul-Token"] = t;
  }
  const resp = await fetch(path, { method, headers, body, signal, cache: "no-store" });
  if (!resp.ok && !(notFound && resp.status === 404)) {
    const text = (await resp.text()).trim();
    throw new ApiError(resp.status, `${resp.status}: ${text || resp.statusText}`);
  }
  return resp;
}

/** GET as JSON; `null` for a 404 when `notFound` is set. */
export async function getJSON(path, options = {}) {
  const resp = await request("GET", path, options);
  return resp.status === 404 ? null : resp.json();
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/**
 * Keeps `path` live with one blocking query at a time until `signal` aborts: calls `onData`
 * with each answer (`null` for a 404), then asks again with the answer's `X-Consul-Index`, so
 * the server holds the request until something changes or `WAIT` passes. An index that goes
 * backwards (a restore, a new leader behind) starts over from 0, as Consul's clients do.
 * Failures go to `onError` and are retried with a doubling pause of up to 10 s.
 */
export async function watch(path, signal, onData, onError) {
  let index = 0;
  let pause = 0;
  while (!signal.aborted) {
    const sep = path.includes("?") ? "&" : "?";
    const url = index > 0 ? `${path}${sep}index=${index}&wait=${WAIT}` : path;
    try {
      const resp = await request("GET", url, { signal, notFound: true });
      const data = resp.status === 404 ? null : await resp.json();
      const next = Number(resp.headers.get("X-Consul-Index")) || 0;
      index = next < index ? 0 : next;
      pause = 0;
      if (!signal.aborted) {
        await onData(data);
      }
    } catch (e) {
      if (signal.aborted) {
        return;
      }
      onError(e);
      pause = Math.min(pause ? pause * 2 : 500, 10000);
      await sleep(pause, signal);
    }
  }
}
