// Key/Value: browse one level of a prefix (`?keys&separator=/`), view a key with its flags,
// LockIndex and Session, and edit its value as text or JSON. A save is a check-and-set on the
// ModifyIndex the editor was loaded from, so it never overwrites a change it has not seen.

import { getJSON, pathOf, request } from "./api.js";
import { details, empty, h, page, sessionLink, table } from "./dom.js";

export function render(main, route, ctx) {
  const key = route.parts.slice(1).join("/");
  if (key === "" || key.endsWith("/")) {
    renderPrefix(main, key, ctx);
  } else {
    renderKey(main, key, ctx);
  }
}

/** Links to each enclosing folder of `key`. */
function breadcrumbs(key) {
  const segments = key.split("/").filter((s, i, all) => s !== "" || i < all.length - 1);
  const links = [h("li", {}, h("a", { href: "#/kv/" }, "Key/Value"))];
  let path = "";
  for (const segment of segments.slice(0, key.endsWith("/") ? segments.length : -1)) {
    path += `${segment}/`;
    links.push(h("li", {}, h("a", { href: `#/kv/${pathOf(path)}` }, segment)));
  }
  return h("nav", { "aria-label": "Breadcrumb", class: "crumbs" }, h("ol", {}, links));
}

function renderPrefix(main, prefix, ctx) {
  const name = h("input", { id: "new-key", name: "key", required: true, spellcheck: "false" });
  const create = h(
    "form",
    {
      class: "filter",
      onsubmit: (event) => {
        event.preventDefault();
        location.hash = `#/kv/${pathOf(prefix + name.value)}`;
      },
    },
    h("label", { for: "new-key" }, `New key under “${prefix || "/"}”`),
    name,
    h("button", { type: "submit" }, "Create…"),
  );
  const heading = h("h1", {}, "Key/Value ", h("code", {}, prefix || "/"));
  const content = page(main, "kv-list", breadcrumbs(prefix), heading, create);
  ctx.watch(`/v1/kv/${pathOf(prefix)}?keys&separator=/`, (keys) => {
    content.replaceChildren(
      keys?.length
        ? table(
            `${keys.length} entr${keys.length === 1 ? "y" : "ies"}`,
            ["Key", "Type"],
            keys.map((k) =>
              h(
                "tr",
                { "data-key": k },
                h("td", {}, h("a", { href: `#/kv/${pathOf(k)}` }, h("code", {}, k.slice(prefix.length)))),
                h("td", {}, k.endsWith("/") ? "folder" : "key"),
              ),
            ),
          )
        : empty("No keys here."),
    );
    content.setAttribute("aria-busy", "false");
  });
}

/** A value as text, or `null` when it is not UTF-8 (binary values are shown, not edited). */
function decode(base64) {
  if (base64 === null || base64 === undefined) {
    return "";
  }
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return null;
  }
}

function looksLikeJson(text) {
  if (!/^\s*[[{]/.test(text)) {
    return false;
  }
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

function renderKey(main, key, ctx) {
  const meta = h("div", { id: "kv-meta", "aria-busy": "true" });
  const notice = h("p", { class: "notice", role: "status", id: "kv-status" });
  const value = h("textarea", { id: "kv-value", name: "value", rows: 12, spellcheck: "false" });
  const flags = h("input", { id: "kv-flags", name: "flags", type: "number", min: 0, value: 0 });
  const format = h(
    "select",
    { id: "kv-format", name: "format" },
    h("option", { value: "text" }, "Text"),
    h("option", { value: "json" }, "JSON"),
  );
  let loaded = null;
  let dirty = false;
  value.addEventListener("input", () => {
    dirty = true;
  });
  flags.addEventListener("input", () => {
    dirty = true;
  });

  /** Puts `entry` (or nothing, for a new key) into the editor. */
  const load = (entry) => {
    loaded = entry;
    dirty = false;
    const text = decode(entry?.Value);
    value.value = text ?? entry.Value;
    value.readOnly = text === null;
    flags.value = String(entry?.Flags ?? 0);
    format.value = text !== null && looksLikeJson(text) ? "json" : "text";
    if (text === null) {
      notice.textContent = "Binary value (shown as base64, read-only).";
    }
  };

  const formatButton = h(
    "button",
    {
      type: "button",
      onclick: () => {
        try {
          value.value = JSON.stringify(JSON.parse(value.value), null, 2);
          format.value = "json";
          dirty = true;
          notice.textContent = "";
        } catch (e) {
          notice.textContent = `Not valid JSON: ${e.message}`;
        }
      },
    },
    "Format JSON",
  );

  const form = h(
    "form",
    {
      class: "editor",
      onsubmit: async (event) => {
        event.preventDefault();
        if (format.value === "json") {
          try {
            JSON.parse(value.value);
          } catch (e) {
            notice.textContent = `Not saved: not valid JSON (${e.message}).`;
            return;
          }
        }
        const cas = loaded?.ModifyIndex ?? 0;
        const query = `flags=${encodeURIComponent(flags.value || "0")}&cas=${cas}`;
        try {
          const resp = await request("PUT", `/v1/kv/${pathOf(key)}?${query}`, {
            body: value.value,
            signal: ctx.signal,
          });
          if ((await resp.text()).trim() === "true") {
            const fresh = await getJSON(`/v1/kv/${pathOf(key)}`, { signal: ctx.signal, notFound: true });
            load(fresh?.[0] ?? null);
            notice.textContent = "Saved.";
          } else {
            notice.textContent =
              "Not saved: the key changed since it was loaded. Load the new value and try again.";
          }
        } catch (e) {
          notice.textContent = `Not saved: ${e.message}`;
        }
      },
    },
    h("label", { for: "kv-value" }, "Value"),
    value,
    h(
      "div",
      { class: "row" },
      h("label", { for: "kv-format" }, "Format"),
      format,
      formatButton,
      h("label", { for: "kv-flags" }, "Flags"),
      flags,
      h("button", { type: "submit", id: "kv-save" }, "Save"),
    ),
  );

  main.replaceChildren(breadcrumbs(key), h("h1", {}, h("code", {}, key)), meta, form, notice);
  let first = true;
  ctx.watch(`/v1/kv/${pathOf(key)}`, (found) => {
    const entry = found?.[0] ?? null;
    meta.replaceChildren(
      entry
        ? details([
            ["Flags", String(entry.Flags)],
            ["LockIndex", String(entry.LockIndex)],
            ["Session", entry.Session ? sessionLink(entry.Session) : "none"],
            ["CreateIndex", String(entry.CreateIndex)],
            ["ModifyIndex", String(entry.ModifyIndex)],
          ])
        : empty("This key does not exist yet: saving creates it."),
    );
    meta.setAttribute("aria-busy", "false");
    const changed = (entry?.ModifyIndex ?? 0) !== (loaded?.ModifyIndex ?? 0);
    if (first || (!dirty && changed)) {
      load(entry);
    } else if (changed) {
      notice.replaceChildren(
        "The key changed on the server while you were editing. ",
        h(
          "button",
          {
            type: "button",
            onclick: () => {
              load(entry);
              notice.textContent = "Loaded the new value.";
            },
          },
          "Load the new value",
        ),
      );
    }
    first = false;
  });
}
