// Small DOM and formatting helpers. Text always goes in through textContent or
// setAttribute, never as markup: device names and tags come from users.

// The SVG namespace name (an identifier, never fetched).
const SVG_NS = "http://www.w3.org/2000/svg";

function fill(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

/** An HTML element with attributes and children (strings become text nodes). */
export function el(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element with attributes and children (strings become text nodes). */
export function svgEl(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** Bytes in binary units, at most 3 significant digits: 1536 -> "1.5 KiB". */
export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "–";
  let value = Number(bytes);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
  return `${+value.toFixed(digits)} ${BYTE_UNITS[unit]}`;
}

/** Seconds ago in words: "4 s ago", "3 min ago", "2 h ago", "5 d ago". */
export function formatAgo(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** A number with at most `digits` decimals, or "–" for null. */
export function formatNumber(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(Number(value))) return "–";
  return Number(value).toFixed(digits);
}

/** A short value for an axis tick: 1200 -> "1.2k", 0.25 -> "0.25", 1e-5 -> "1e-5". */
export function formatTick(value) {
  const a = Math.abs(value);
  if (a === 0) return "0";
  if (a >= 1e6) return `${+(value / 1e6).toPrecision(3)}M`;
  if (a >= 1e3) return `${+(value / 1e3).toPrecision(3)}k`;
  if (a < 1e-3) return value.toExponential(0);
  return String(+value.toPrecision(3));
}

/** Colour of an accuracy in [0, 1] on a viridis-like scale (colour-blind safe). */
export function accuracyColor(accuracy) {
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const t = Math.min(1, Math.max(0, Number(accuracy))) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(t));
  const f = t - i;
  const mix = stops[i].map((c, k) => Math.round(c + f * (stops[i + 1][k] - c)));
  return `rgb(${mix.join(",")})`;
}
