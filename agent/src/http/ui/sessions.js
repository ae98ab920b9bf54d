// Sessions: every session with its node, checks, TTL, behaviour, lock-delay and the keys it
// holds, and destroying one (after a confirmation). Live on `/v1/session/list` (or
// `/v1/session/info/<id>` for one); the keys held come from the KV listing on each answer.

import { getJSON, pathOf, request } from "./api.js";
import {
  details,
  empty,
  groupChecks,
  h,
  keyLink,
  lockDelay,
  nodeLink,
  page,
  sessionHealth,
  sessionLink,
  table,
} from "./dom.js";

export function render(main, route, ctx) {
  if (route.parts.length > 1) {
    return renderOne(main, route.parts[1], ctx);
  }
  const content = page(main, "sessions", h("h1", {}, "Sessions"));
  ctx.watch("/v1/session/list", async (sessions) => {
    const look = await lookups(ctx);
    content.replaceChildren(
      sessions.length
        ? table(
            `${sessions.length} session${sessions.length === 1 ? "" : "s"}`,
            ["Session", "Node", "Health", "Checks", "TTL", "Behavior", "Lock-delay", "Keys held", ""],
            sessions.map((s) =>
              h(
                "tr",
                { "data-session": s.ID },
                h("td", {}, sessionLink(s.ID, s.Name)),
                h("td", {}, nodeLink(s.Node)),
                h("td", {}, sessionHealth(s, look.checksByNode)),
                h("td", {}, checkList(s)),
                h("td", {}, s.TTL || "none"),
                h("td", {}, s.Behavior),
                h("td", {}, lockDelay(s.LockDelay)),
                h("td", {}, keyList(look.keys.get(s.ID))),
                h("td", {}, destroyButton(s, ctx)),
              ),
            ),
          )
        : empty("No sessions."),
    );
    content.setAttribute("aria-busy", "false");
  });
}

function renderOne(main, id, ctx) {
  const content = page(
    main,
    "session",
    h("p", {}, h("a", { href: "#/sessions" }, "All sessions")),
    h("h1", {}, "Session ", h("code", {}, id)),
  );
  ctx.watch(`/v1/session/info/${encodeURIComponent(id)}`, async (found) => {
    const s = found?.[0];
    if (!s) {
      content.replaceChildren(
        empty("This session does not exist (any more): destroyed, invalidated or expired."),
      );
      content.setAttribute("aria-busy", "false");
      return;
    }
    const look = await lookups(ctx);
    content.replaceChildren(
      details([
        ["Name", s.Name || "(none)"],
        ["Node", nodeLink(s.Node)],
        ["Health", sessionHealth(s, look.checksByNode)],
        ["Checks", checkList(s)],
        ["TTL", s.TTL || "none"],
        ["Behavior", s.Behavior],
        ["Lock-delay", lockDelay(s.LockDelay)],
        ["Created at index", String(s.CreateIndex)],
      ]),
      h("h2", {}, "Keys held"),
      keyList(look.keys.get(s.ID)),
      h("p", {}, destroyButton(s, ctx)),
    );
    content.setAttribute("aria-busy", "false");
  });
}

/** Checks by node and the keys each session holds (from the whole KV listing). */
async function lookups(ctx) {
  const [checks, entries] = await Promise.all([
    getJSON("/v1/health/state/any", { signal: ctx.signal }),
    getJSON("/v1/kv/?recurse", { signal: ctx.signal, notFound: true }),
  ]);
  const keys = new Map();
  for (const entry of entries ?? []) {
    if (entry.Session) {
      keys.set(entry.Session, [...(keys.get(entry.Session) ?? []), entry.Key]);
    }
  }
  return { checksByNode: groupChecks(checks), keys };
}

function checkList(s) {
  const ids = [
    ...(s.Checks ?? []),
    ...(s.NodeChecks ?? []),
    ...(s.ServiceChecks ?? []).map((c) => c.ID),
  ];
  return ids.length ? ids.join(", ") : "none";
}

function keyList(keys) {
  return keys?.length
    ? h("ul", { class: "keys" }, keys.map((k) => h("li", {}, keyLink(k))))
    : "none";
}

/** "Destroy…" opens a modal dialog that says what destroying does; only its button destroys. */
function destroyButton(s, ctx) {
  return h(
    "button",
    {
      type: "button",
      class: "danger",
      "data-destroy": s.ID,
      onclick: () => confirmDestroy(s, ctx),
    },
    "Destroy…",
  );
}

function confirmDestroy(s, ctx) {
  const message = h("p", { class: "dialog-error", role: "alert" });
  const consequence =
    s.Behavior === "delete"
      ? "Every key it holds is deleted."
      : "Every lock it holds is released.";
  const delay = s.LockDelay
    ? ` Those keys cannot be acquired again for ${lockDelay(s.LockDelay)} (lock-delay).`
    : "";
  const dialog = h(
    "dialog",
    { "aria-labelledby": "destroy-title", class: "confirm" },
    h(
      "form",
      {
        method: "dialog",
        onsubmit: async (event) => {
          event.preventDefault();
          if (event.submitter?.value !== "destroy") {
            dialog.close();
            return;
          }
          try {
            await request("PUT", `/v1/session/destroy/${pathOf(s.ID)}`, { signal: ctx.signal });
            dialog.close();
          } catch (e) {
            message.textContent = e.message;
          }
        },
      },
      h("h2", { id: "destroy-title" }, "Destroy session?"),
      h("p", {}, h("code", {}, s.ID), s.Name ? ` (${s.Name}) on ` : " on ", s.Node, "."),
      h("p", {}, consequence, delay),
      message,
      h(
        "div",
        { class: "actions" },
        h("button", { value: "cancel", autofocus: true }, "Cancel"),
        h("button", { value: "destroy", class: "danger", id: "confirm-destroy" }, "Destroy session"),
      ),
    ),
  );
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
}
