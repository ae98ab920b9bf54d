// The cluster header: the raft leader, the raft peers and this agent. These endpoints do not
// block, so the header is read again whenever the current view's blocking query answers (at
// least every wait period), never on a timer of its own.

import { getJSON } from "./api.js";
import { h } from "./dom.js";

/** Refreshes at most this often, however busy the view is. */
const MIN_INTERVAL_MS = 2000;

let last = 0;
let pending = null;

export function refresh() {
  const now = Date.now();
  if (pending || now - last < MIN_INTERVAL_MS) {
    return;
  }
  last = now;
  pending = load().finally(() => {
    pending = null;
  });
}

async function load() {
  const el = document.getElementById("cluster");
  const [leader, peers, self] = await Promise.allSettled([
    getJSON("/v1/status/leader"),
    getJSON("/v1/status/peers"),
    getJSON("/v1/agent/self"),
  ]);
  const value = (result, show) =>
    result.status === "fulfilled" ? show(result.value) : h("span", { class: "status status-critical" }, "unavailable");
  el.replaceChildren(
    h("dt", {}, "Agent"),
    h(
      "dd",
      { id: "agent-name" },
      value(self, (s) => `${s.Config.NodeName} (${s.Config.Server ? "server" : "client"}, ${s.Config.Version})`),
    ),
    h("dt", {}, "Leader"),
    h(
      "dd",
      { id: "leader" },
      value(leader, (addr) => addr || h("span", { class: "status status-critical" }, "no leader")),
    ),
    h("dt", {}, "Raft peers"),
    h(
      "dd",
      { id: "peers" },
      value(peers, (list) => h("span", { title: list.join(", ") }, String(list.length))),
    ),
  );
}
