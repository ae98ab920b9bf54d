// Nodes and health: gossip members and their state, `serfHealth` and every check, services,
// and for one node what its failure would invalidate (its sessions and the locks they hold).
// Live on `/v1/health/state/any` (or `/v1/health/node/<n>` for one node): the leader turns
// every gossip change into a `serfHealth` update, so membership changes wake it too.

import { getJSON } from "./api.js";
import {
  details,
  empty,
  groupChecks,
  h,
  keyLink,
  lockDelay,
  nodeLink,
  page,
  sessionLink,
  status,
  table,
  worst,
} from "./dom.js";

/** Serf's member status codes, as `/v1/agent/members` reports them. */
const MEMBER_STATUS = ["none", "alive", "leaving", "left", "failed"];

const MEMBER_HEALTH = { alive: "passing", leaving: "warning", left: "maintenance", failed: "critical" };

function memberState(member) {
  if (!member) {
    return status("gone", "not a gossip member");
  }
  const word = MEMBER_STATUS[member.Status] ?? `status ${member.Status}`;
  return h("span", { class: `status status-${MEMBER_HEALTH[word] ?? "warning"}` }, word);
}

export function render(main, route, ctx) {
  if (route.parts.length > 1) {
    return renderOne(main, route.parts[1], ctx);
  }
  const content = page(main, "nodes", h("h1", {}, "Nodes"));
  ctx.watch("/v1/health/state/any", async (checks) => {
    const [members, sessions] = await Promise.all([
      getJSON("/v1/agent/members", { signal: ctx.signal }),
      getJSON("/v1/session/list", { signal: ctx.signal }),
    ]);
    const byNode = groupChecks(checks);
    const names = [...new Set([...members.map((m) => m.Name), ...byNode.keys()])].sort();
    content.replaceChildren(
      table(
        `${names.length} node${names.length === 1 ? "" : "s"}`,
        ["Node", "Address", "Role", "Gossip", "serfHealth", "Checks", "Sessions"],
        names.map((name) => {
          const member = members.find((m) => m.Name === name);
          const nodeChecks = byNode.get(name) ?? [];
          const serf = nodeChecks.find((c) => c.CheckID === "serfHealth");
          return h(
            "tr",
            { "data-node": name },
            h("td", {}, nodeLink(name)),
            h("td", {}, member ? `${member.Addr}:${member.Port}` : "unknown"),
            h("td", {}, member?.Tags?.role === "consul" ? "server" : "client"),
            h("td", {}, memberState(member)),
            h("td", {}, serf ? status(serf.Status, serf.Output) : "not registered"),
            h("td", {}, checkSummary(nodeChecks)),
            h("td", {}, String(sessions.filter((s) => s.Node === name).length)),
          );
        }),
      ),
    );
    content.setAttribute("aria-busy", "false");
  });
}

function checkSummary(checks) {
  if (checks.length === 0) {
    return "none";
  }
  const counts = new Map();
  for (const c of checks) {
    counts.set(c.Status, (counts.get(c.Status) ?? 0) + 1);
  }
  return h(
    "span",
    {},
    status(worst(checks.map((c) => c.Status))),
    " ",
    [...counts].map(([word, n]) => `${n} ${word}`).join(", "),
  );
}

function renderOne(main, node, ctx) {
  const content = page(
    main,
    "node",
    h("p", {}, h("a", { href: "#/nodes" }, "All nodes")),
    h("h1", {}, "Node ", node),
  );
  const name = encodeURIComponent(node);
  ctx.watch(`/v1/health/node/${name}`, async (checks) => {
    const [catalog, sessions, locks, members] = await Promise.all([
      getJSON(`/v1/catalog/node/${name}`, { signal: ctx.signal, notFound: true }),
      getJSON(`/v1/session/node/${name}`, { signal: ctx.signal }),
      getJSON("/v1/vigil/locks", { signal: ctx.signal }),
      getJSON("/v1/agent/members", { signal: ctx.signal }),
    ]);
    const member = members.find((m) => m.Name === node);
    const services = Object.values(catalog?.Services ?? {});
    content.replaceChildren(
      details([
        ["Gossip", memberState(member)],
        ["Address", catalog?.Node?.Address ?? (member ? member.Addr : "unknown")],
        ["Role", member?.Tags?.role === "consul" ? "server" : "client"],
      ]),
      checks?.length
        ? table(
            "Checks",
            ["Check", "Name", "Status", "Service", "Output"],
            checks.map((c) =>
              h(
                "tr",
                { "data-check": c.CheckID },
                h("td", {}, h("code", {}, c.CheckID)),
                h("td", {}, c.Name),
                h("td", {}, status(c.Status)),
                h("td", {}, c.ServiceName || ""),
                h("td", { class: "output" }, c.Output),
              ),
            ),
          )
        : empty("No checks: the node is not in the catalog."),
      services.length
        ? table(
            "Services",
            ["ID", "Service", "Tags", "Address", "Port"],
            services.map((s) =>
              h(
                "tr",
                {},
                h("td", {}, s.ID),
                h("td", {}, s.Service),
                h("td", {}, (s.Tags ?? []).join(", ")),
                h("td", {}, s.Address || ""),
                h("td", {}, String(s.Port)),
              ),
            ),
          )
        : empty("No services."),
      h("h2", {}, "If this node failed"),
      impact(sessions, locks),
    );
    content.setAttribute("aria-busy", "false");
  });
}

/** The sessions a failure of the node invalidates, and the locks they would lose. */
function impact(sessions, report) {
  if (sessions.length === 0) {
    return empty("Nothing: no session is bound to this node.");
  }
  const ids = new Set(sessions.map((s) => s.ID));
  const lost = [];
  for (const lock of report.Locks ?? []) {
    if (ids.has(lock.Session)) {
      lost.push([keyLink(lock.Key), lock.Session, `${lock.Kind}, LockIndex ${lock.LockIndex}`]);
    }
  }
  for (const sem of report.Semaphores ?? []) {
    for (const holder of sem.Holders.filter((x) => ids.has(x.Session))) {
      lost.push([keyLink(sem.Key), holder.Session, "semaphore slot"]);
    }
  }
  for (const fair of report.FairQueues ?? []) {
    fair.Queue.forEach((c, i) => {
      if (ids.has(c.Session)) {
        lost.push([keyLink(c.Key), c.Session, i === 0 ? "fair mutex, holder" : `fair mutex, waiter ${i}`]);
      }
    });
  }
  for (const q of report.Queues ?? []) {
    for (const holder of (q.Holders ?? []).filter((x) => ids.has(x.Session))) {
      lost.push([h("code", {}, q.Name), holder.Session, `server-side lock, token ${holder.Token}`]);
    }
  }
  return h(
    "div",
    { id: "impact" },
    h(
      "p",
      {},
      `${sessions.length} session${sessions.length === 1 ? "" : "s"} would be invalidated `,
      `(serfHealth goes critical), releasing ${lost.length} lock${lost.length === 1 ? "" : "s"}.`,
    ),
    table(
      "Sessions bound to this node",
      ["Session", "Behavior", "Lock-delay"],
      sessions.map((s) =>
        h(
          "tr",
          { "data-session": s.ID },
          h("td", {}, sessionLink(s.ID, s.Name)),
          h("td", {}, s.Behavior),
          h("td", {}, lockDelay(s.LockDelay)),
        ),
      ),
    ),
    lost.length
      ? table(
          "Locks they hold",
          ["Lock", "Session", "What"],
          lost.map(([lock, session, what]) =>
            h(
              "tr",
              {},
              h("td", {}, lock),
              h("td", {}, sessionLink(session)),
              h("td", {}, what),
            ),
          ),
        )
      : empty("They hold no lock."),
  );
}
