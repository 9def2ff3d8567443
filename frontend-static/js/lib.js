// Shared helpers of the status pages. Everything is rendered with DOM nodes and text
// nodes only (never HTML parsed from strings): no text from the server becomes markup.

/** Create an element: h("a", {href: "/x", class: "c"}, "text", child, [more]). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "on") {
      for (const [event, fn] of Object.entries(value)) el.addEventListener(event, fn);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "href" || name === "action") {
      const safe = safeHref(String(value));
      if (safe !== null) el.setAttribute(name, safe);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A link target only when it is site-relative or http(s); never javascript: & co. */
export function safeHref(url) {
  if (typeof url !== "string" || url === "") return null;
  if (url.startsWith("/") && !url.startsWith("//") && !url.includes("\\")) return url;
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * The API token a person entered on the pages (js/signin.js), kept in this tab only
 * (sessionStorage: gone when the tab closes, never a cookie, so another site cannot
 * make the browser send it). The admin page keeps its own.
 */
export const tabToken = {
  key: "submitqueue.token",
  get() { return sessionStorage.getItem(this.key) || null; },
  set(value) { sessionStorage.setItem(this.key, value); },
  clear() { sessionStorage.removeItem(this.key); },
};

/**
 * fetch JSON; a non-2xx answer throws ApiError with the server's message. ``token``
 * defaults to the tab's token; pass ``null`` to send none.
 */
export async function api(path, { method = "GET", body, token = tabToken.get() } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (token) headers.Authorization = `Bearer ${token}`;
  let response;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (err) {
    throw new ApiError(0, "network", `the server did not answer (${err.message})`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.code || "http_error",
      error.message || `HTTP ${response.status}`);
  }
  return data;
}

export const queuePath = (queue) => `/queues/${encodeURIComponent(queue)}`;
export const requestPath = (queue, n) => `${queuePath(queue)}/requests/${encodeURIComponent(n)}`;

/** "demo/12" -> {queue: "demo", n: "12"} */
export function splitSqid(sqid) {
  const at = sqid.lastIndexOf("/");
  return { queue: sqid.slice(0, at), n: sqid.slice(at + 1) };
}

export function sqidLink(sqid) {
  const { queue, n } = splitSqid(sqid);
  return h("a", { href: requestPath(queue, n) }, sqid);
}

export function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function percent(p) {
  if (p === null || p === undefined) return "unknown";
  const v = p * 100;
  if (v > 99.5 && v < 100) return "> 99 %";
  if (v > 0 && v < 0.5) return "< 1 %";
  return `${Math.round(v)} %`;
}

export function clockTime(ms) {
  if (!ms) return "–";
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit",
    second: "2-digit" });
}

export function timeElement(ms) {
  return h("time", { datetime: new Date(ms).toISOString(), title: new Date(ms).toString() },
    clockTime(ms));
}

/** "branch-name (sha…)" from a change URI, falling back to the URI itself. */
export function shortChange(uri) {
  const m = /^git:\/\/[^/]+\/.*?\/refs%2[Ff]heads%2[Ff]([^/]+)\/([0-9a-f]{40})/.exec(uri);
  if (m) return `${decodeURIComponent(m[1])} @ ${m[2].slice(0, 8)}`;
  const gh = /^github:\/\/[^/]+\/(.+)\/pull\/(\d+)\//.exec(uri);
  if (gh) return `${gh[1]}#${gh[2]}`;
  return uri;
}

export function statusBadge(status) {
  return h("span", { class: `badge badge-${cssToken(status)}` }, status);
}

// A request's priority as a badge; nothing for "normal" (or a server without priorities).
export function priorityBadge(priority) {
  if (!priority || priority === "normal") return null;
  return h("span", { class: `badge badge-priority badge-priority-${cssToken(priority)}`,
    title: `priority ${priority}: goes ahead of conflicting requests of a lower priority` },
  priority);
}

export function cssToken(text) {
  return String(text).toLowerCase().replace(/[^a-z0-9-]/g, "-");
}

/** The server clock minus the browser's, so countdowns use the server's "now". */
export const clock = {
  offset: 0,
  sync(serverNowMs) { this.offset = serverNowMs - Date.now(); },
  now() { return Date.now() + this.offset; },
};

export function etaText(forecast) {
  if (!forecast || forecast.eta_at_ms === null || forecast.eta_at_ms === undefined) {
    return "unknown";
  }
  const left = forecast.eta_at_ms - clock.now();
  return left <= 0 ? "any moment" : `in ~${duration(left)}`;
}

/** An element whose text is the ETA, refreshed by tick(). */
export function etaElement(forecast) {
  const el = h("span", { class: "eta" }, etaText(forecast));
  if (forecast && forecast.eta_at_ms) el.dataset.etaAt = String(forecast.eta_at_ms);
  return el;
}

export function tick() {
  for (const el of document.querySelectorAll("[data-eta-at]")) {
    const left = Number(el.dataset.etaAt) - clock.now();
    el.textContent = left <= 0 ? "any moment" : `in ~${duration(left)}`;
  }
  for (const el of document.querySelectorAll("[data-since]")) {
    el.textContent = duration(clock.now() - Number(el.dataset.since));
  }
}

/**
 * A Server-Sent Events stream read with fetch, so it can carry the tab's token
 * (EventSource cannot send headers). Calls onOpen() once connected and onEvent(name,
 * data) per event; resolves when the server ends the stream, rejects with ApiError when
 * it refuses it (e.g. 401 for a revoked token).
 */
async function readStream(url, token, { onOpen, onEvent, signal }) {
  const response = await fetch(url, { cache: "no-store", signal,
    headers: { Accept: "text/event-stream", Authorization: `Bearer ${token}` } });
  if (!response.ok) {
    throw new ApiError(response.status, "stream_refused",
      `the live stream was refused (HTTP ${response.status})`);
  }
  onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut = buffer.indexOf("\n\n");
    while (cut >= 0) {
      let name = "message";
      const data = [];
      for (const line of buffer.slice(0, cut).split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      buffer = buffer.slice(cut + 2);
      if (data.length) onEvent(name, data.join("\n"));
      cut = buffer.indexOf("\n\n");
    }
  }
}

/**
 * Live updates of a queue: calls onChange(summary) for each event and onOpen() each
 * time the stream (re)connects, so the page can re-read what it shows. With a token in
 * the tab the stream is read with fetch (it needs the header when SQ_AUTH_READS is
 * required); without one, with EventSource. Returns {restart()}.
 */
export function liveUpdates(queue, { onOpen, onChange, statusEl }) {
  const url = `/api/v1/events?queue=${encodeURIComponent(queue)}`;
  const show = (text, state) => {
    if (!statusEl) return;
    statusEl.textContent = text;
    statusEl.dataset.state = state;
  };
  const received = (data) => {
    try {
      onChange(JSON.parse(data));
    } catch (err) {
      console.error("bad event", err);
    }
  };
  let source = null;
  let aborter = null;
  let generation = 0;  // a restart makes the retries already scheduled moot
  const retryLater = (text = "offline, retrying…") => {
    show(text, "reconnecting");
    const mine = generation;
    setTimeout(() => { if (mine === generation) connect(); }, 5000);
  };
  const connectWithToken = async (token) => {
    const mine = new AbortController();
    aborter = mine;
    let reset = false;
    try {
      await readStream(url, token, { signal: mine.signal,
        onOpen: () => { show("live", "live"); onOpen(); },
        onEvent: (name, data) => {
          if (name === "request") received(data);
          else if (name === "reset") reset = true;  // the stream fell behind; it ends
        } });
    } catch (err) {
      if (mine.signal.aborted) return;
      if (err instanceof ApiError && err.status === 401) {
        retryLater("offline: the token was refused, sign in again");
        return;
      }
    }
    if (!mine.signal.aborted) retryLater(reset ? "fell behind, reconnecting…" : undefined);
  };
  const connect = () => {
    show("connecting…", "connecting");
    const token = tabToken.get();
    if (token) {
      connectWithToken(token);
      return;
    }
    source = new EventSource(url);
    source.addEventListener("open", () => {
      show("live", "live");
      onOpen();
    });
    source.addEventListener("request", (event) => received(event.data));
    const again = () => {
      source.close();
      retryLater();
    };
    source.addEventListener("reset", again);  // the stream fell behind
    source.addEventListener("error", () => {
      // the browser retries by itself unless the server refused the stream (e.g. 503)
      if (source.readyState === EventSource.CLOSED) again();
      else show("reconnecting…", "reconnecting");
    });
  };
  const close = () => {
    if (source) source.close();
    if (aborter) aborter.abort();
    source = null;
    aborter = null;
  };
  connect();
  window.addEventListener("pagehide", close);
  // after a sign-in or sign-out: the same stream, with the tab's new token
  return { restart() { generation += 1; close(); connect(); } };
}

/** Run fn at most once at a time; calls during a run schedule one more run. */
export function coalesce(fn, delayMs = 150) {
  let timer = null;
  let running = false;
  let again = false;
  const run = async () => {
    timer = null;
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await fn();
    } finally {
      running = false;
      if (again) {
        again = false;
        schedule();
      }
    }
  };
  const schedule = () => {
    if (timer === null) timer = setTimeout(run, delayMs);
  };
  return schedule;
}

/**
 * Re-render without losing the reader's place: the focused link or control and the
 * open <details> inside ``root`` are found again after ``render()`` replaced them.
 */
export function keepPlace(root, render) {
  const focused = document.activeElement;
  let selector = null;
  if (focused && focused !== root && root.contains(focused)) {
    if (focused.id) selector = `#${CSS.escape(focused.id)}`;
    else if (focused.getAttribute("href")) {
      selector = `${focused.tagName.toLowerCase()}[href="${CSS.escape(
        focused.getAttribute("href"))}"]`;
    }
  }
  const all = () => Array.from(root.querySelectorAll("details"));
  const open = all().map((d) => d.open);
  render();
  all().forEach((d, i) => { if (open[i]) d.open = true; });
  if (selector) {
    const again = root.querySelector(selector);
    if (again) again.focus({ preventScroll: true });
  }
}

/** Show an error message in a region (role=alert). */
export function showError(el, err) {
  const refused = err instanceof ApiError && err.status === 401;
  fill(el, h("p", { class: "error", role: "alert" }, err.message || String(err),
    refused ? " (use Sign in at the top of the page)" : null));
}

/**
 * A page whose queue or request does not exist (the API answered 404): say so in the
 * title and the error region, hide every section and the live indicator (nothing will
 * arrive), and mark the page loaded. ``els`` needs ``title``, ``error`` and ``live``.
 */
export function notFound(els, err, title) {
  fill(els.title, title);
  document.title = `${title} · SubmitQueue`;
  for (const section of document.querySelectorAll("main section")) section.hidden = true;
  if (els.live) {
    els.live.textContent = "not found";
    els.live.dataset.state = "not-found";
  }
  fill(els.error, h("p", { class: "error", role: "alert" }, err.message,
    " ", h("a", { href: "/" }, "See the configured queues.")));
  document.body.dataset.notFound = "true";
  document.body.dataset.loaded = String(Date.now());
}

/** Undo ``notFound`` once the thing exists after all (a request seen before its log). */
export function found() {
  if (document.body.dataset.notFound !== "true") return;
  delete document.body.dataset.notFound;
  for (const section of document.querySelectorAll("main section")) section.hidden = false;
}

/** Whether a 404 says the queue itself is not configured (nothing will ever appear). */
export const unknownQueue = (err) => err.status === 404 && /is not configured/.test(err.message);
