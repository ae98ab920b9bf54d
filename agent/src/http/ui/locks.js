// Locks: who holds what, since when, who waits in which order, and whether each holder is
// alive. Live on `/v1/vigil/locks?prefix=`; each answer also reads the sessions and the checks
// (plain reads) to show each holder's node and health.

import { getJSON } from "./api.js";
import {
  empty,
  groupChecks,
  h,
  historyLink,
  indexSessions,
  keyLink,
  lockDelay,
  nodeLink,
  page,
  seenSince,
  sessionHealth,
  sessionLink,
  since,
  table,
  until,
  details,
} from "./dom.js";

export function render(main, route, ctx) {
  const prefix = route.query.get("prefix") ?? "";
  const input = h("input", {
    id: "lock-prefix",
    name: "prefix",
    value: prefix,
    placeholder: "e.g. service/db/",
    spellcheck: "false",
  });
  const form = h(
    "form",
    {
      class: "filter",
      role: "search",
      onsubmit: (event) => {
        event.preventDefault();
        location.hash = `#/locks?prefix=${encodeURIComponent(input.value)}`;
      },
    },
    h("label", { for: "lock-prefix" }, "Key prefix"),
    input,
    h("button", { type: "submit" }, "Filter"),
  );
  const content = page(main, "locks", h("h1", {}, "Locks"), form);

  ctx.watch(`/v1/vigil/locks?prefix=${encodeURIComponent(prefix)}`, async (report) => {
    const [sessions, checks] = await Promise.all([
      getJSON("/v1/session/list", { signal: ctx.signal }),
      getJSON("/v1/health/state/any", { signal: ctx.signal }),
    ]);
    const look = { sessions: indexSessions(sessions), checksByNode: groupChecks(checks) };
    const sections = [
      queues(report.Queues ?? [], look),
      held(report.Locks ?? [], look),
      semaphores(report.Semaphores ?? [], look),
      fairQueues(report.FairQueues ?? [], look),
    ].flat();
    content.replaceChildren(
      ...(sections.length
        ? sections
        : [empty(prefix ? `Nothing is locked under “${prefix}”.` : "Nothing is locked.")]),
    );
    content.setAttribute("aria-busy", "false");
  });
}

/** Session, node and health cells of a holder or waiter. */
function who(entry, look) {
  const session = look.sessions.get(entry.Session);
  return [
    h("td", {}, sessionLink(entry.Session, entry.SessionName)),
    h("td", {}, nodeLink(entry.Node)),
    h("td", {}, sessionHealth(session, look.checksByNode)),
  ];
}

function row(entry, attrs, cells) {
  return h("tr", { "data-session": entry.Session, ...attrs }, cells);
}

/** Server-side locks: exact times, tokens and lock-delay from the state machine. */
function queues(list, look) {
  return list.map((q) => {
    const now = Date.now();
    return h(
      "section",
      { class: "lock", "data-queue": q.Name, "aria-label": `Lock ${q.Name}` },
      h("h2", {}, "Lock ", h("code", {}, q.Name), " ", historyLink(q.Name)),
      details([
        ["Kind", q.Limit > 1 ? `server-side, up to ${q.Limit} holders` : "server-side"],
        ["Fencing token", String(q.Token)],
        ["Grants", String(q.Grants)],
        ["Lock-delay left", q.LockDelayRemainingMs > 0 ? until(now + q.LockDelayRemainingMs) : "none"],
      ]),
      table(
        "Holders",
        ["Session", "Node", "Health", "Mode", "Token", "Held for"],
        (q.Holders ?? []).map((holder) =>
          row(holder, { "data-role": "holder" }, [
            ...who(holder, look),
            h("td", {}, holder.Mode),
            h("td", {}, String(holder.Token)),
            h("td", {}, since(now - holder.HeldForMs)),
          ]),
        ),
      ),
      waiters(
        q.Waiters ?? [],
        ["Mode", "Waiting for"],
        (waiter) => [h("td", {}, waiter.Mode), h("td", {}, since(now - waiter.WaitingForMs))],
        look,
      ),
    );
  });
}

/** Waiters in queue order (position 1 is next). */
function waiters(list, headers, cells, look) {
  if (list.length === 0) {
    return empty("Nobody is waiting.");
  }
  return table(
    `Waiting (${list.length}, next first)`,
    ["Position", "Session", "Node", "Health", ...headers],
    list.map((waiter, i) =>
      row(waiter, { "data-role": "waiter" }, [
        h("td", {}, String(waiter.Position ?? i + 1)),
        ...who(waiter, look),
        ...cells(waiter),
      ]),
    ),
  );
}

/** KV locks: the fencing token is `(Key, LockIndex, Session)`; no start time is recorded. */
function held(list, look) {
  if (list.length === 0) {
    return [];
  }
  return h(
    "section",
    { "aria-labelledby": "held-heading" },
    h("h2", { id: "held-heading" }, "Held keys"),
    table(
      `${list.length} key${list.length === 1 ? "" : "s"} held by a session`,
      ["Key", "Kind", "Session", "Node", "Health", "LockIndex", "Held for", "Lock-delay on loss"],
      list.map((lock) =>
        row(lock, { "data-key": lock.Key }, [
          h("td", {}, keyLink(lock.Key), " ", historyLink(lock.Key)),
          h("td", {}, lock.Kind),
          ...who(lock, look),
          h("td", {}, String(lock.LockIndex)),
          h("td", {}, since(seenSince(`${lock.Key}|${lock.Session}|${lock.LockIndex}`), true)),
          h("td", {}, lockDelay(look.sessions.get(lock.Session)?.LockDelay ?? 0)),
        ]),
      ),
    ),
  );
}

function semaphores(list, look) {
  return list.map((sem) =>
    h(
      "section",
      { class: "lock", "data-semaphore": sem.Prefix, "aria-label": `Semaphore ${sem.Prefix}` },
      h("h2", {}, "Semaphore ", h("code", {}, sem.Prefix)),
      details([
        ["Limit", sem.Limit === null ? "unreadable" : String(sem.Limit)],
        ["Holders", String(sem.Holders.length)],
      ]),
      table(
        "Holders",
        ["Session", "Node", "Health", "Contender key", "Held for"],
        sem.Holders.map((holder) =>
          row(holder, { "data-role": "holder" }, [
            ...who(holder, look),
            h("td", {}, holder.Key ? keyLink(holder.Key) : "none"),
            h("td", {}, since(seenSince(`${sem.Key}|${holder.Session}|held`), true)),
          ]),
        ),
      ),
      waiters(
        sem.Waiting,
        ["Contender key", "Waiting for"],
        (waiter) => [
          h("td", {}, keyLink(waiter.Key)),
          h("td", {}, since(seenSince(`${waiter.Key}|${waiter.Session}|${waiter.CreateIndex}`), true)),
        ],
        look,
      ),
    ),
  );
}

/** Fair mutexes: contenders in CreateIndex order, the first holds the lock. */
function fairQueues(list, look) {
  return list.map((fair) => {
    const [owner, ...rest] = fair.Queue;
    return h(
      "section",
      { class: "lock", "data-fair": fair.Prefix, "aria-label": `Fair mutex ${fair.Prefix}` },
      h("h2", {}, "Fair mutex ", h("code", {}, fair.Prefix)),
      table(
        "Holder",
        ["Session", "Node", "Health", "Contender key", "LockIndex", "Held for"],
        owner
          ? [
              row(owner, { "data-role": "holder" }, [
                ...who(owner, look),
                h("td", {}, keyLink(owner.Key)),
                h("td", {}, String(owner.LockIndex)),
                h("td", {}, since(seenSince(`${owner.Key}|${owner.CreateIndex}|held`), true)),
              ]),
            ]
          : [],
      ),
      waiters(
        rest,
        ["Contender key", "Waiting for"],
        (waiter) => [
          h("td", {}, keyLink(waiter.Key)),
          h("td", {}, since(seenSince(`${waiter.Key}|${waiter.CreateIndex}`), true)),
        ],
        look,
      ),
    );
  });
}
