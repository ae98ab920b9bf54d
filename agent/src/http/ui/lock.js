// One lock's page (`#/lock/<name>`): its recorded history as a timeline chart (holders as bars
// over time, queue waits and lock-delays shaded, losses marked with their cause) and as a
// table, live on `/v1/vigil/history/<name>`. A KV key and a native lock of the same name each
// get a chart.

import { pathOf } from "./api.js";
import { duration, empty, h, page, sessionLink, table } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const LANE = 28;
const LABEL = 230;
const WIDTH = 1000;
const AXIS = 24;

export function render(main, route, ctx) {
  const name = route.parts.slice(1).join("/");
  const content = page(
    main,
    "lock",
    h("h1", {}, "Lock ", h("code", {}, name)),
    h("p", {}, h("a", { href: "#/locks" }, "All locks")),
  );
  ctx.watch(`/v1/vigil/history/${pathOf(name)}`, (histories) => {
    content.replaceChildren(
      ...(histories.length
        ? histories.map(section)
        : [empty(`No history is recorded for “${name}”.`)]),
    );
    content.setAttribute("aria-busy", "false");
  });
}

function section(history) {
  const kind = history.Kind === "queue" ? "Server-side lock" : "Key";
  // Grants name their session; the events after them say only its ID.
  const names = new Map(history.Events.map((e) => [e.Session, e.SessionName]).filter(([, n]) => n));
  return h(
    "section",
    { class: "lock history", "data-kind": history.Kind, "aria-label": `${kind} history` },
    h("h2", {}, `${kind} history`, h("span", { class: "muted" }, ` (${history.Events.length} events)`)),
    chart(history.Events),
    table(
      "Events, oldest first",
      ["Time (UTC)", "Event", "Session", "Node", "Token", "Detail"],
      history.Events.map((e) =>
        h(
          "tr",
          { "data-event": e.Event, "data-session": e.Session ?? "" },
          h("td", {}, h("time", { datetime: e.Time }, e.Time.replace("T", " ").replace("Z", ""))),
          h("td", {}, e.Event),
          h("td", {}, e.Session ? sessionLink(e.Session, names.get(e.Session)) : ""),
          h("td", {}, e.Node ?? ""),
          h("td", {}, e.Token === undefined ? "" : String(e.Token)),
          h("td", {}, detail(e)),
        ),
      ),
    ),
  );
}

/** Why a session was invalidated, in words. */
export function cause(e) {
  switch (e.Cause) {
    case "destroyed":
      return "session destroyed";
    case "ttl-expired":
      return "TTL lapsed";
    case "node-failed":
      return `node ${e.Node} failed (${e.CheckID})`;
    case "check-critical":
      return `check ${e.CheckID} critical`;
    case "check-deregistered":
      return `check ${e.CheckID} deregistered`;
    case "node-deregistered":
      return `node ${e.Node} deregistered`;
    default:
      return "";
  }
}

function detail(e) {
  switch (e.Event) {
    case "granted":
      return e.WaitedMs ? `waited ${duration(e.WaitedMs)}` : "";
    case "lost":
      return cause(e);
    case "lock-delay":
      return `until ${e.Until.replace("T", " ").replace("Z", "")}`;
    case "gave-up":
      return e.Cause ? cause(e) : "its request ended";
    case "deleted":
      return "key deleted while held";
    default:
      return "";
  }
}

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) {
    el.setAttribute(name, String(value));
  }
  for (const child of children) {
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** What the chart draws: each session's holds and waits, the lock-delays and the marks. */
function spans(events) {
  const lanes = new Map();
  const lane = (e) => {
    if (!lanes.has(e.Session)) {
      lanes.set(e.Session, {
        session: e.Session,
        label: e.SessionName || e.Session.slice(0, 8),
        node: e.Node,
        holds: [],
        waits: [],
        marks: [],
      });
    }
    return lanes.get(e.Session);
  };
  const delays = [];
  const open = new Map();
  for (const e of events) {
    if (e.Event === "lock-delay") {
      delays.push({ from: e.TimeMs, to: e.UntilMs });
      continue;
    }
    if (!e.Session) {
      continue;
    }
    const l = lane(e);
    if (e.Event === "granted") {
      l.node = e.Node;
      if (e.WaitedMs) {
        l.waits.push({ from: e.TimeMs - e.WaitedMs, to: e.TimeMs });
      }
      const hold = { from: e.TimeMs, to: null, token: e.Token };
      l.holds.push(hold);
      open.set(e.Session, hold);
      continue;
    }
    if (["released", "lost", "deleted"].includes(e.Event)) {
      const hold = open.get(e.Session);
      if (hold) {
        hold.to = e.TimeMs;
        open.delete(e.Session);
      }
    }
    const text = { lost: cause(e), deleted: "key deleted", "gave-up": "gave up" }[e.Event];
    if (text) {
      const why = e.Event === "gave-up" && e.Cause ? `${text}: ${cause(e)}` : text;
      l.marks.push({ at: e.TimeMs, event: e.Event, text: why, cause: e.Cause ?? "" });
    }
  }
  return { lanes: [...lanes.values()], delays };
}

/** A bar from `from` to `to` in lane row `y`, inset by `inset`, with a tooltip. */
function bar(x, part, cls, from, to, y, inset, tip) {
  const attrs = {
    class: cls,
    "data-part": part,
    x: x(from),
    y: y + inset,
    width: Math.max(2, x(to) - x(from)),
    height: LANE - 2 * inset,
  };
  return svg("rect", attrs, svg("title", {}, tip));
}

/** The timeline: time runs left to right from the first event to now. */
function chart(events) {
  const now = Date.now();
  const { lanes, delays } = spans(events);
  const times = events.flatMap((e) => [e.TimeMs - (e.WaitedMs ?? 0), e.UntilMs ?? e.TimeMs]);
  const start = Math.min(...times);
  const end = Math.max(now, ...times);
  const span = Math.max(1, end - start);
  const x = (t) => LABEL + ((t - start) / span) * (WIDTH - LABEL - 10);
  const height = AXIS + lanes.length * LANE + 8;
  const sessions = `${lanes.length} session${lanes.length === 1 ? "" : "s"}`;
  const box = svg("svg", {
    class: "timeline",
    viewBox: `0 0 ${WIDTH} ${height}`,
    role: "img",
    "aria-label": `Timeline of ${sessions} from ${new Date(start).toISOString()} to now`,
  });
  for (const d of delays) {
    const tip = `lock-delay until ${new Date(d.to).toISOString()}`;
    const shade = bar(x, "lock-delay", "delay", d.from, d.to, AXIS - 4, 0, tip);
    shade.setAttribute("height", String(height - AXIS));
    box.append(shade);
  }
  for (const [t, anchor] of [[start, "start"], [start + span / 2, "middle"], [end, "end"]]) {
    const label = new Date(t).toISOString().slice(11, 23);
    box.append(svg("text", { class: "axis", x: x(t), y: 14, "text-anchor": anchor }, label));
  }
  lanes.forEach((l, i) => {
    const y = AXIS + i * LANE;
    const row = svg("g", { "data-session": l.session });
    const full = `${l.label}${l.node ? ` @ ${l.node}` : ""}`;
    const label = full.length > 30 ? `${full.slice(0, 29)}…` : full;
    row.append(svg("text", { class: "lane", x: 4, y: y + LANE / 2 + 4 }, label));
    for (const w of l.waits) {
      row.append(bar(x, "wait", "wait", w.from, w.to, y, 6, `waited ${duration(w.to - w.from)}`));
    }
    for (const hold of l.holds) {
      const to = hold.to ?? now;
      const still = hold.to === null ? " (still held)" : "";
      const tip = `token ${hold.token}, held ${duration(to - hold.from)}${still}`;
      const cls = hold.to === null ? "hold held" : "hold";
      row.append(bar(x, "hold", cls, hold.from, to, y, 4, tip));
    }
    for (const m of l.marks) {
      const at = x(m.at);
      const attrs = {
        class: `mark ${m.event}`,
        "data-part": m.event,
        "data-cause": m.cause,
        d: `M ${at} ${y + 2} l 5 6 l -5 6 l -5 -6 z`,
      };
      row.append(
        svg("path", attrs, svg("title", {}, m.text)),
        svg("text", { class: "cause", x: at + 7, y: y + 12 }, m.text),
      );
    }
    box.append(row);
  });
  const caption =
    "Holders as bars (token on hover), queue waits light, lock-delays shaded, losses marked with their cause.";
  return h("figure", { class: "timeline" }, box, h("figcaption", {}, caption));
}
