// The queue page's chart of the last 24 hours, drawn as inline SVG (no library): one
// bar per hour (landed, failed and cancelled stacked), a line for the mean wait to
// land, and a tooltip (<title>) per hour. Data: overview.throughput (app/views/throughput.py).
import { duration } from "./lib.js";

const NS = "http://www.w3.org/2000/svg";
const W = 288;
const H = 44;
const PAD = 2;

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.append(c);
  return el;
}

function hour(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

/** An <svg> for ``t`` (a ThroughputOut), or null without data. */
export function throughputChart(t) {
  if (!t || !t.buckets.length) return null;
  const n = t.buckets.length;
  const slot = (W - 2 * PAD) / n;
  const most = Math.max(1, ...t.buckets.map((b) => b.landed + b.failed + b.cancelled));
  const waits = t.buckets.map((b) => b.mean_wait_ms).filter((w) => w !== null);
  const longest = Math.max(1, ...waits);
  const y = (count) => (H - PAD) - (count / most) * (H - 2 * PAD);
  const label = `Last 24 h: ${t.landed} landed, ${t.failed} failed, ${t.cancelled} ` +
    `cancelled; mean wait to land ${t.mean_wait_ms === null ? "unknown" : duration(t.mean_wait_ms)}` +
    `; busiest hour ${most} finished`;
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-label": label, class: "throughput", "data-landed": t.landed });
  svg.append(s("title", {}, label));
  svg.append(s("line", { x1: 0, x2: W, y1: H - PAD + 0.5, y2: H - PAD + 0.5, class: "axis" }));
  const points = [];
  t.buckets.forEach((b, i) => {
    const x = PAD + i * slot;
    const g = s("g", { class: "hour", "data-start": b.start_ms });
    let base = 0;
    for (const [kind, count] of [["landed", b.landed], ["failed", b.failed],
      ["cancelled", b.cancelled]]) {
      if (!count) continue;
      const top = y(base + count);
      g.append(s("rect", { x: x + 0.5, width: Math.max(1, slot - 1.5), y: top,
        height: Math.max(1, y(base) - top), class: `bar bar-${kind}` }));
      base += count;
    }
    // a transparent target per hour so its tooltip is easy to hit
    g.append(s("rect", { x, width: slot, y: 0, height: H, class: "hit" }));
    g.append(s("title", {}, `${hour(b.start_ms)}–${hour(b.start_ms + t.bucket_ms)}: ` +
      `${b.landed} landed, ${b.failed} failed, ${b.cancelled} cancelled` +
      (b.mean_wait_ms === null ? "" : `; mean wait ${duration(b.mean_wait_ms)}, ` +
        `longest ${duration(b.max_wait_ms)}`)));
    svg.append(g);
    if (b.mean_wait_ms !== null) {
      points.push(`${(x + slot / 2).toFixed(1)},` +
        `${((H - PAD) - (b.mean_wait_ms / longest) * (H - 2 * PAD)).toFixed(1)}`);
    }
  });
  if (points.length > 1) svg.append(s("polyline", { points: points.join(" "), class: "wait" }));
  for (const p of points.length === 1 ? points : []) {
    const [cx, cy] = p.split(",");
    svg.append(s("circle", { cx, cy, r: 2, class: "wait-dot" }));
  }
  return svg;
}
