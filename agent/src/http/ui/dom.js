// Small DOM and formatting helpers shared by the views. Data from the API only ever becomes
// text nodes and attribute values, never markup.

import { pathOf } from "./api.js";

/** `h("a", { href: "#/x" }, "text", child)`: an element; `null`/`false` children are skipped. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    if (name.startsWith("on")) {
      el.addEventListener(name.slice(2), value);
    } else if (value === true) {
      el.setAttribute(name, "");
    } else {
      el.setAttribute(name, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    if (Array.isArray(child)) {
      append(el, child);
    } else {
      el.append(child instanceof Node ? child : String(child));
    }
  }
}

/** Shows the elements `above` in `main`, then an empty container with `id`, marked busy until
 * its first fill; returns the container. */
export function page(main, id, ...above) {
  const content = h("div", { id, "aria-busy": "true" });
  main.replaceChildren(...above, content);
  return content;
}

/** A table with a caption, a header row and `rows` (already `tr` elements). */
export function table(caption, headers, rows) {
  return h(
    "table",
    {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, headers.map((name) => h("th", { scope: "col" }, name)))),
    h("tbody", {}, rows),
  );
}

/** A `dl` from `[term, description]` pairs. */
export function details(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.map(([term, description]) => h("div", {}, h("dt", {}, term), h("dd", {}, description))),
  );
}

/** `1234` → `1.2s`; `90061000` → `1d 1h`: the two largest units. */
export function duration(ms) {
  if (ms < 1000) {
    return `${Math.max(0, Math.round(ms))}ms`;
  }
  const s = Math.floor(ms / 1000);
  if (s < 60) {
    return ms < 10000 ? `${(ms / 1000).toFixed(1)}s` : `${s}s`;
  }
  const units = [
    ["d", 86400],
    ["h", 3600],
    ["m", 60],
    ["s", 1],
  ];
  const parts = [];
  let rest = s;
  for (const [unit, size] of units) {
    if (rest >= size || parts.length > 0) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
    if (parts.length === 2) {
      break;
    }
  }
  return parts.join(" ");
}

/** Session lock-delay (nanoseconds in the API). */
export function lockDelay(ns) {
  return ns ? duration(ns / 1e6) : "none";
}

/**
 * Time elapsed since `startMs` (epoch ms), kept current by the app's ticker. `lowerBound`
 * marks a time the UI only observed (the API records no start): it reads "≥ 5s".
 */
export function since(startMs, lowerBound = false) {
  const el = h("time", {
    "data-since": startMs,
    "data-lower-bound": lowerBound,
    datetime: new Date(startMs).toISOString(),
    title: lowerBound
      ? `at least since ${new Date(startMs).toLocaleString()} (first seen by this page)`
      : new Date(startMs).toLocaleString(),
  });
  tick(el);
  return el;
}

/** Time left until `endMs` (epoch ms), counting down with the ticker; "none" once passed. */
export function until(endMs) {
  const el = h("span", { "data-until": endMs });
  tick(el);
  return el;
}

/** Rewrites the text of a `since`/`until` element for the current time. */
export function tick(el) {
  const now = Date.now();
  if (el.dataset.since) {
    const text = duration(now - Number(el.dataset.since));
    el.textContent = el.hasAttribute("data-lower-bound") ? `≥ ${text}` : text;
  } else if (el.dataset.until) {
    const left = Number(el.dataset.until) - now;
    el.textContent = left > 0 ? duration(left) : "none";
  }
}

/** When the UI first saw each thing it cannot date from the API (key → epoch ms). */
const firstSeen = new Map();

/** The time `id` was first seen by this page (now, the first time it is asked). */
export function seenSince(id) {
  if (!firstSeen.has(id)) {
    firstSeen.set(id, Date.now());
  }
  return firstSeen.get(id);
}

const SEVERITY = { passing: 0, maintenance: 1, warning: 2, critical: 3, gone: 4 };

/** The worst of some check statuses ("passing" for none). */
export function worst(statuses) {
  return statuses.reduce((a, b) => ((SEVERITY[b] ?? 3) > (SEVERITY[a] ?? 3) ? b : a), "passing");
}

/** A status word with its colour; the colour only repeats what the word says. */
export function status(word, title) {
  return h("span", { class: `status status-${word}`, title }, word);
}

export function sessionLink(id, name) {
  return h(
    "a",
    { href: `#/sessions/${encodeURIComponent(id)}`, title: id },
    name ? `${name} ` : "",
    h("code", {}, id.slice(0, 8)),
  );
}

export function nodeLink(node) {
  return node ? h("a", { href: `#/nodes/${encodeURIComponent(node)}` }, node) : "unknown";
}

export function keyLink(key) {
  return h("a", { href: `#/kv/${pathOf(key)}` }, h("code", {}, key));
}

/** A link to a lock's page: its history. */
export function historyLink(name) {
  return h("a", { href: `#/lock/${pathOf(name)}`, class: "history-link" }, "history");
}

/**
 * A session's health as a lock holder sees it: the worst status of the checks it is bound to
 * (Consul invalidates it when one goes critical). `checksByNode` maps node → its checks from
 * `/v1/health/state/any`; a session no longer listed is "gone".
 */
export function sessionHealth(session, checksByNode) {
  if (!session) {
    return status("gone", "the session no longer exists");
  }
  const nodeChecks = checksByNode.get(session.Node) ?? [];
  const ids = [
    ...(session.Checks ?? []),
    ...(session.NodeChecks ?? []),
    ...(session.ServiceChecks ?? []).map((c) => c.ID),
  ];
  const bound = [...new Set(ids)].map((id) => {
    const check = nodeChecks.find((c) => c.CheckID === id);
    return [id, check ? check.Status : "critical"];
  });
  const word = worst(bound.map(([, s]) => s));
  const title = bound.length
    ? bound.map(([id, s]) => `${id}: ${s}`).join(", ")
    : "bound to no check";
  return status(word, title);
}

/** `/v1/health/state/any` grouped by node. */
export function groupChecks(checks) {
  const byNode = new Map();
  for (const check of checks ?? []) {
    if (!byNode.has(check.Node)) {
      byNode.set(check.Node, []);
    }
    byNode.get(check.Node).push(check);
  }
  return byNode;
}

/** Sessions by ID. */
export function indexSessions(sessions) {
  return new Map((sessions ?? []).map((s) => [s.ID, s]));
}

/** A paragraph for an empty list. */
export function empty(text) {
  return h("p", { class: "empty" }, text);
}
