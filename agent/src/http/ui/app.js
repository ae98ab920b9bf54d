// The app: hash routes (`#/locks?prefix=x`, `#/lock/<name>`, `#/sessions/<id>`,
// `#/nodes/<name>`, `#/kv/<prefix-or-key>`) to views. Each view gets a context whose AbortSignal ends its one
// blocking query when the route changes (a held query costs the server next to nothing, so a
// hidden tab keeps its own and loses no unsaved edit); a one-second ticker keeps the
// "held for" and "lock-delay left" times current without asking the server.

import { setToken, token, watch as keepLive } from "./api.js";
import * as cluster from "./cluster.js";
import { tick } from "./dom.js";
import * as kv from "./kv.js";
import * as lock from "./lock.js";
import * as locks from "./locks.js";
import * as nodes from "./nodes.js";
import * as sessions from "./sessions.js";

const VIEWS = { locks, lock, sessions, nodes, kv };

const main = document.getElementById("view");
const errorBox = document.getElementById("error");
let current = null;

/** `#/kv/a%20b/c?x=1` → `{ parts: ["kv", "a b", "c"], query }`. */
function parseRoute() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, search = ""] = raw.split("?");
  const parts = path.split("/").map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  return { parts, query: new URLSearchParams(search) };
}

function showError(e) {
  errorBox.textContent = e.message;
  errorBox.hidden = false;
}

function clearError() {
  errorBox.hidden = true;
  errorBox.textContent = "";
}

function show() {
  current?.abort();
  current = new AbortController();
  const signal = current.signal;
  clearError();
  const route = parseRoute();
  if (!VIEWS[route.parts[0]]) {
    location.replace("#/locks");
    return;
  }
  const page = route.parts[0];
  // A lock's page is part of the locks section.
  const section = page === "lock" ? "locks" : page;
  for (const link of document.querySelectorAll("nav a[data-page]")) {
    if (link.dataset.page === section) {
      link.setAttribute("aria-current", "page");
    } else {
      link.removeAttribute("aria-current");
    }
  }
  document.title = `${page === "kv" ? "Key/Value" : page[0].toUpperCase() + page.slice(1)} · Vigil`;
  const ctx = {
    signal,
    watch(path, onData) {
      keepLive(
        path,
        signal,
        async (data) => {
          await onData(data);
          clearError();
          cluster.refresh();
        },
        showError,
      );
    },
  };
  VIEWS[page].render(main, route, ctx);
  cluster.refresh();
}

function setupToken() {
  const form = document.getElementById("token-form");
  const input = document.getElementById("token");
  input.value = token();
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    setToken(input.value.trim());
    show();
  });
  document.getElementById("token-clear").addEventListener("click", () => {
    input.value = "";
    setToken("");
    show();
  });
}

window.addEventListener("hashchange", () => {
  show();
  main.focus({ preventScroll: true });
});
setInterval(() => {
  for (const el of document.querySelectorAll("[data-since], [data-until]")) {
    tick(el);
  }
}, 1000);
setupToken();
show();
