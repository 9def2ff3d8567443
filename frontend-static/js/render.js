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

// The queue's freeze (docs/freeze.md): "frozen: <reason> (manual by ops, until ...)"
// and what it means for the requests in it; nothing when the queue lands as usual.
export function freezeBanner(freeze) {
  if (!freeze || !freeze.frozen) return null;
  const builds = freeze.allow_builds ? "Requests are accepted and built, but nothing lands"
    : "Requests are accepted, but no new build starts and nothing lands";
  return h("div", { class: "freeze", role: "status", id: "freeze-banner",
    dataset: { source: freeze.source || "" } },
  h("p", { class: "freeze-text" }, freeze.text),
  h("p", { class: "small" }, `${builds} until the freeze ends.`));
}

// "dead-lettered at merge after 10 attempts — needs an operator", "retrying — 3 of 10
// attempts failed", "stalled": the badge's words (the health's own text follows it).
export function healthLabel(health) {
  if (health.state === "dead_lettered") {
    return `dead-lettered at ${health.topic} after ${health.attempts} attempts` +
      (health.needs_operator ? " — needs an operator" : "");
  }
  if (health.state === "retrying") {
    const of = health.max_attempts ? ` of ${health.max_attempts}` : "";
    return `retrying ${health.topic} — ${health.attempts}${of} attempts failed`;
  }
  return health.state;
}

// A stage retrying, dead-lettered or stalled: a badge, the words, the last error and,
// when it needs an operator, a link to the admin page. Nothing when it is ok.
export function healthBanner(health) {
  if (!health || health.state === "ok") return null;
  const next = health.state !== "retrying" ? null
    : health.attempt_running ? "An attempt is under way."
      : health.next_attempt_at_ms ? ["Next attempt ",
        h("span", { dataset: { etaAt: String(health.next_attempt_at_ms) } }, "soon"), "."]
        : null;
  return h("div", { class: "health", role: "status", dataset: { health: health.state,
    topic: health.topic } },
  h("p", {}, h("span", { class: `badge badge-${health.state.replace("_", "-")}` },
    healthLabel(health))),
  // the badge and the lines below say what the text says, except for a stall
  health.state === "stalled" ? h("p", { class: "health-text" }, health.text) : null,
  health.last_error ? h("p", {}, "Last error: ",
    h("span", { class: "last-error" }, health.last_error)) : null,
  next ? h("p", {}, next) : null,
  health.admin_url ? h("p", {}, health.needs_operator
    ? `Needs an operator (${health.operator_reason}): `
    : "An operator can requeue or discard it: ",
  h("a", { href: health.admin_url, class: "admin-link" }, "open the admin page")) : null);
}

// The queue's stall detector verdict (only when it flagged the queue).
export function stallBanner(stall) {
  if (!stall || !stall.stalled) return null;
  return h("div", { class: "health", role: "status", dataset: { health: "stalled" } },
    h("p", {}, h("span", { class: "badge badge-stalled" }, "stalled"), " ", stall.text));
}

/** A note for build failures the queue suspects were flaky (the view's ``flakes``). */
export function flakeNote(flakes) {
  if (!flakes || !flakes.length) return null;
  return h("div", { class: "flake-note", role: "note" },
    h("p", {}, h("span", { class: "badge badge-flake" }, "suspected flaky build"), " ",
      "A build of this change failed and the same combination passed when it was built "
      + "again; only a passed build of exactly what the target holds lets it land."),
    h("ul", {}, flakes.map((f) => h("li", { class: "flake-detail" }, f.detail))));
}
