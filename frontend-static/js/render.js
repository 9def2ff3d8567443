// Pieces the queue and request pages both render.
import { etaElement, h, percent, sqidLink, statusBadge } from "./lib.js";

export function changesList(uris) {
  return h("ul", { class: "changes" }, uris.map((u) => h("li", {}, h("code", { class: "uri" }, u))));
}

export function forecastLine(f) {
  if (!f) return null;
  return h("p", { class: "forecast" },
    h("span", { class: "p-land" }, "Chance to land: ", h("strong", {}, percent(f.p_land))),
    " · ",
    h("span", {}, "Expected to land: ", etaElement(f)));
}

export function buildCell(build) {
  if (!build) return h("span", { class: "muted" }, "not started");
  const link = build.log_url
    ? h("a", { href: build.log_url, class: "build-log", "aria-label": `log of build ${build.id}` },
      "build log")
    : h("span", { class: "muted" }, "(no log published)");
  return h("span", {}, statusBadge(build.status), " ",
    h("code", { class: "build-id" }, build.id), " ", link);
}

export function pathsTable(paths, caption) {
  if (!paths.length) return h("p", { class: "muted" }, "No speculation path funded yet.");
  return h("div", { class: "table-wrap" }, h("table", { class: "paths" },
    h("caption", {}, caption),
    h("thead", {}, h("tr", {},
      ["Path", "Status", "Assumes", "P(assumptions hold)", "Build"].map(
        (t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, paths.map((p) => h("tr", { dataset: { path: p.id } },
      h("td", {}, h("code", { title: p.id }, p.id.slice(0, 10))),
      h("td", {}, statusBadge(p.status)),
      h("td", {}, p.described),
      h("td", {}, percent(p.p_assumptions_hold)),
      h("td", {}, buildCell(p.build)))))));
}

export function dependencyList(deps) {
  if (!deps.length) return h("span", {}, "nothing (no conflicting batch ahead)");
  return h("ul", { class: "deps" }, deps.map((d) => h("li", {},
    h("code", {}, d.id), " ", d.state ? statusBadge(d.state) : "unknown",
    d.requests.length ? [" — ", d.requests.map((s, i) => [i ? ", " : "", sqidLink(s)])] : null)));
}

// Open circuits: "waiting: repository:q unreachable since <time>, retrying (next in 40 s)".
export function outageBanner(outages) {
  if (!outages || !outages.length) return null;
  return h("div", { class: "outage", role: "status" }, outages.map((o) =>
    h("p", { dataset: { dependency: o.dependency } }, o.text)));
}
