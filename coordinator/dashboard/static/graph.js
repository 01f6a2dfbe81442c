// The job's topology as an SVG graph: devices on a circle, one line per edge whose
// width and opacity follow the mixing weight w_ij. Nodes are coloured by status
// (online / offline grey) or by the device's latest accuracy. Past LABEL_MAX devices
// names go to tooltips only, and nodes and edges thin out, so 1000 devices stay legible.

import { accuracyColor, formatNumber, svgEl } from "./util.js";

const SIZE = 440;
const LABEL_MAX = 24;
const BUSY = 60;
const ONLINE = "#2e8540";
const OFFLINE = "#9aa0a6";

function nodeFill(device, accuracy, colorBy) {
  if (colorBy === "accuracy") return accuracy === null || accuracy === undefined ? OFFLINE : accuracyColor(accuracy);
  return device && device.online ? ONLINE : OFFLINE;
}

/**
 * Draw `topology` ({devices, edges, weights}) into `container`, replacing the old graph.
 * devicesById: device id -> snapshot device (name, online); accuracy: id -> accuracy.
 */
export function drawGraph(container, topology, devicesById, accuracy, colorBy) {
  container.querySelector("svg")?.remove();
  container.querySelector(".empty")?.remove();
  if (!topology) {
    const note = document.createElement("p");
    note.className = "empty muted";
    note.textContent = "no topology yet: the job has not started";
    container.append(note);
    return;
  }
  const n = topology.devices.length;
  const busy = n > BUSY;
  const labels = n <= LABEL_MAX;
  const center = SIZE / 2;
  const radius = center - (labels ? 70 : 16);
  const nodeR = Math.max(2, Math.min(11, 260 / Math.max(n, 1)));
  const at = topology.devices.map((_, i) => {
    const a = (2 * Math.PI * i) / Math.max(n, 1) - Math.PI / 2;
    return [center + radius * Math.cos(a), center + radius * Math.sin(a), a];
  });
  const svg = svgEl("svg", { viewBox: `0 0 ${SIZE} ${SIZE}`, role: "img",
    "aria-label": `topology graph of ${n} devices` });

  const maxW = Math.max(1e-9, ...topology.weights);
  const edges = svgEl("g", { class: "edges" });
  topology.edges.forEach(([i, j], k) => {
    const w = topology.weights[k] / maxW;
    edges.append(svgEl("line", {
      class: "edge",
      x1: at[i][0].toFixed(1), y1: at[i][1].toFixed(1), x2: at[j][0].toFixed(1), y2: at[j][1].toFixed(1),
      "stroke-width": ((busy ? 0.3 : 0.8) + (busy ? 1.2 : 3) * w).toFixed(2),
      "stroke-opacity": ((busy ? 0.08 : 0.2) + (busy ? 0.35 : 0.7) * w).toFixed(2),
      "data-weight": topology.weights[k],
    }));
  });
  svg.append(edges);

  const nodes = svgEl("g", { class: "nodes" });
  topology.devices.forEach((id, i) => {
    const device = devicesById.get(id);
    const acc = accuracy[id];
    const name = device ? device.name : id;
    const status = device ? (device.online ? "online" : "offline") : "unknown";
    const tip = `${name} (${id}): ${status}, accuracy ${formatNumber(acc)}`;
    nodes.append(svgEl("circle", {
      class: "node", cx: at[i][0].toFixed(1), cy: at[i][1].toFixed(1), r: nodeR,
      fill: nodeFill(device, acc, colorBy), "data-device": id, "data-online": String(status === "online"),
    }, svgEl("title", {}, tip)));
    if (labels) {
      const [x, y, a] = at[i];
      const lx = x + (nodeR + 6) * Math.cos(a);
      const ly = y + (nodeR + 6) * Math.sin(a) + 4;
      const anchor = Math.abs(Math.cos(a)) < 0.3 ? "middle" : Math.cos(a) > 0 ? "start" : "end";
      nodes.append(svgEl("text", { class: "node-label", x: lx.toFixed(1), y: ly.toFixed(1),
        "text-anchor": anchor }, name.length > 16 ? `${name.slice(0, 15)}…` : name));
    }
  });
  svg.append(nodes);
  container.append(svg);
}

/** One line explaining the node colours of the current mode. */
export function legendText(colorBy) {
  return colorBy === "accuracy"
    ? "node colour: latest accuracy, dark (0) to yellow (1); grey: not reported"
    : "node colour: green online, grey offline; edge width and opacity: mixing weight";
}
