// SVG line charts with axes, ticks, axis labels and a legend; no chart library.
// Each chart's <svg> carries data-points (points of its first series) and draws one
// circle.point per point of that series, with a tooltip. Axes come from scale.js.

import { byteAxis, linearAxis, logAxis, roundAxis } from "./scale.js";
import { formatTick, svgEl } from "./util.js";

const WIDTH = 480;
const HEIGHT = 250;
const MARGIN = { left: 70, right: 14, top: 24, bottom: 42 };
const PLOT = {
  left: MARGIN.left, right: WIDTH - MARGIN.right, top: MARGIN.top, bottom: HEIGHT - MARGIN.bottom,
};
const CHAR_PX = 7; // about one character of the 13 px empty-state text

/** Pixel position of `value` on `axis` between pixels `from` (axis low) and `to` (high). */
function place(axis, value, from, to, log = false) {
  const f = log ? Math.log10 : (v) => v;
  return from + ((f(value) - f(axis.low)) / (f(axis.high) - f(axis.low))) * (to - from);
}

/** The y axis of `spec` over the values `ys` (at least one). */
function yAxisOf(spec, ys, log) {
  if (log) return logAxis(Math.min(...ys), Math.max(...ys));
  if (spec.binary) return byteAxis(Math.max(0, ...ys));
  if (spec.yDomain) return linearAxis(spec.yDomain[0], spec.yDomain[1], { fixed: true });
  const low = spec.fromZero ? Math.min(0, ...ys) : Math.min(...ys);
  return linearAxis(low, Math.max(...ys));
}

/** `text` cut into lines of at most `width` characters, at spaces. */
function wrap(text, width) {
  const lines = [];
  for (const word of text.split(" ")) {
    const last = lines.length - 1;
    if (last >= 0 && lines[last].length + 1 + word.length <= width) lines[last] += ` ${word}`;
    else lines.push(word);
  }
  return lines;
}

/** The empty-state message, centred in the plot area (never over the axis labels). */
function emptyNote(message) {
  const cx = (PLOT.left + PLOT.right) / 2;
  const lines = wrap(message, Math.floor((PLOT.right - PLOT.left - 16) / CHAR_PX));
  const y0 = (PLOT.top + PLOT.bottom) / 2 - ((lines.length - 1) * 16) / 2 + 4;
  return svgEl("text", { class: "empty", x: cx, y: y0, "text-anchor": "middle" },
    ...lines.map((line, i) => svgEl("tspan", { x: cx, dy: i === 0 ? 0 : 16 }, line)));
}

function axisFrame(spec, log) {
  const midY = (PLOT.top + PLOT.bottom) / 2;
  return [
    svgEl("line", { class: "axis", x1: PLOT.left, x2: PLOT.right, y1: PLOT.bottom, y2: PLOT.bottom }),
    svgEl("line", { class: "axis", x1: PLOT.left, x2: PLOT.left, y1: PLOT.top, y2: PLOT.bottom }),
    svgEl("text", { class: "label", x: (PLOT.left + PLOT.right) / 2, y: HEIGHT - 6,
      "text-anchor": "middle" }, spec.xLabel),
    svgEl("text", { class: "label", x: 12, y: midY, "text-anchor": "middle",
      transform: `rotate(-90 12 ${midY})` }, spec.yLabel + (log ? " (log)" : "")),
  ];
}

function ticks(xAxis, yAxis, px, py) {
  const out = [];
  for (const t of yAxis.ticks) {
    const y = py(t);
    out.push(
      svgEl("line", { class: "grid", x1: PLOT.left, x2: PLOT.right, y1: y, y2: y }),
      svgEl("text", { class: "tick", x: PLOT.left - 6, y: y + 4, "text-anchor": "end" }, yAxis.label(t)),
    );
  }
  for (const t of xAxis.ticks) {
    const x = px(t);
    out.push(
      svgEl("line", { class: "axis", x1: x, x2: x, y1: PLOT.bottom, y2: PLOT.bottom + 4 }),
      svgEl("text", { class: "tick", x, y: PLOT.bottom + 16, "text-anchor": "middle" }, xAxis.label(t)),
    );
  }
  return out;
}

function samePoints(a, b) {
  return a.length === b.length && a.every(([x, y], i) => b[i][0] === x && b[i][1] === y);
}

function legend(series) {
  const group = svgEl("g", { class: "legend" });
  series.forEach((s, i) => {
    const lx = PLOT.left + 8 + i * 130;
    // A series hidden under the first one says so (e.g. received = sent).
    const same = i > 0 && s.points.length > 0 && samePoints(s.points, series[0].points);
    group.append(
      svgEl("line", { class: `series series-${i}`, x1: lx, x2: lx + 16, y1: 12, y2: 12 }),
      svgEl("text", { class: "tick", x: lx + 20, y: 16 }, same ? `${s.name} (= ${series[0].name})` : s.name),
    );
  });
  return group;
}

/**
 * Draw a line chart into `figure` (replacing any previous chart).
 *
 * spec: { series: [{ name, points: [[x, y], ...] }], xLabel, yLabel,
 *         yDomain?: [low, high], fromZero?: bool, log?: bool, binary?: bool,
 *         format?: (y) => string, empty?: string }
 * Points whose y is null are left out. A log scale needs every y > 0 (else linear).
 * yDomain: a fixed y axis; fromZero: the y axis starts at 0; binary: a byte axis
 * (ticks in one binary unit). Without any point the chart shows only its frame and the
 * `empty` message. Later series are drawn over earlier ones (series 1 dashed).
 */
export function drawChart(figure, spec) {
  const series = spec.series.map((s) => ({
    ...s,
    points: s.points.filter(([, y]) => y !== null && y !== undefined && Number.isFinite(y)),
  }));
  const first = series[0].points;
  const svg = svgEl("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    "aria-label": spec.yLabel,
    "data-points": first.length,
  });
  const xs = series.flatMap((s) => s.points.map(([x]) => x));
  const ys = series.flatMap((s) => s.points.map(([, y]) => y));
  const log = Boolean(spec.log) && ys.length > 0 && ys.every((y) => y > 0);
  svg.append(svgEl("g", { class: "axes" }, ...axisFrame(spec, log)));

  if (ys.length === 0) {
    svg.append(emptyNote(spec.empty || "no rounds reported yet"), legend(series));
    figure.querySelector("svg")?.remove();
    figure.append(svg);
    return;
  }
  const xAxis = roundAxis(Math.min(...xs), Math.max(...xs));
  const yAxis = yAxisOf(spec, ys, log);
  const px = (v) => place(xAxis, v, PLOT.left, PLOT.right);
  const py = (v) => place(yAxis, v, PLOT.bottom, PLOT.top, log);
  svg.firstChild.prepend(...ticks(xAxis, yAxis, px, py)); // grid lines under the axes

  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    const d = s.points.map(([x, y], k) => `${k ? "L" : "M"}${px(x).toFixed(1)},${py(y).toFixed(1)}`);
    svg.append(svgEl("path", { class: `series series-${i}`, d: d.join("") }));
  });
  const fmt = spec.format || formatTick;
  const dots = svgEl("g", { class: "points" });
  for (const [x, y] of first) {
    dots.append(svgEl("circle", { class: "point series-0", cx: px(x).toFixed(1),
      cy: py(y).toFixed(1), r: first.length > 100 ? 1.5 : 3 },
      svgEl("title", {}, `round ${x}: ${series[0].name} ${fmt(y)}`)));
  }
  svg.append(dots, legend(series));
  figure.querySelector("svg")?.remove();
  figure.append(svg);
}
