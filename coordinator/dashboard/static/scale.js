// Axes for the charts, no DOM: "nice" linear ticks (1, 2 or 5 times a power of 10) with
// the axis ending on a tick above the data, decade ticks for log axes, and byte axes in
// one binary unit (B, KiB, MiB, ...). Every axis is { low, high, ticks, label(value) }:
// low and high are the ends of the axis (both ticks), label formats a tick value.

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** Drop the float noise of repeated additions: 0.30000000000000004 -> 0.3. */
function clean(value) {
  return Number(value.toPrecision(12));
}

/** The round step (1, 2 or 5 times 10^k, at least `minStep`) cutting `span` in about `count`. */
export function niceStep(span, count = 5, minStep = 0) {
  const raw = span > 0 ? span / count : 1;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => raw <= s * (1 + 1e-9));
  return Math.max(clean(step), minStep);
}

/** The multiples of `step` in [low, high]. */
function multiples(low, high, step) {
  const ticks = [];
  const first = Math.ceil(low / step - 1e-9);
  const last = Math.floor(high / step + 1e-9);
  for (let i = first; i <= last; i += 1) ticks.push(clean(i * step));
  return ticks;
}

/** Decimals that tell apart the multiples of `step`: 0.5 -> 1, 0.05 -> 2, 20 -> 0. */
function decimalsOf(step) {
  return Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
}

/** A formatter for multiples of `step`: no duplicates, no trailing zeros, k/M when large. */
function stepLabel(step) {
  const [div, suffix] = step >= 1e6 ? [1e6, "M"] : step >= 1e3 ? [1e3, "k"] : [1, ""];
  const decimals = decimalsOf(step / div);
  return (value) => (value === 0 ? "0" : `${+(value / div).toFixed(decimals)}${suffix}`);
}

/**
 * A linear axis over the data range [low, high].
 *
 * fixed: the axis is exactly [low, high] (e.g. accuracy in [0, 1]); otherwise its ends are
 * the tick at or below `low` and the first tick strictly above `high`, so the data never
 * touches the top edge and the top line carries a label. minStep: the smallest step.
 */
export function linearAxis(low, high, { fixed = false, count = 5, minStep = 0 } = {}) {
  if (!fixed && high === low) {
    const pad = Math.abs(low) / 2;
    [low, high] = low === 0 ? [0, 0.5] : [low - pad, high + pad];
  }
  const step = niceStep(high - low, count, minStep);
  const axisLow = fixed ? low : clean(Math.floor(low / step + 1e-9) * step);
  const axisHigh = fixed ? high : clean((Math.floor(high / step + 1e-9) + 1) * step);
  const ticks = multiples(axisLow, axisHigh, step);
  return { low: axisLow, high: axisHigh, ticks, step, label: stepLabel(step) };
}

/** A short label for a power of ten: 1000 -> "1k", 0.01 -> "0.01", 1e-5 -> "1e-5". */
function decadeLabel(value) {
  const exponent = Math.round(Math.log10(value));
  if (exponent >= 9 || exponent < -3) return `1e${exponent}`;
  if (exponent >= 6) return `${10 ** (exponent - 6)}M`;
  if (exponent >= 3) return `${10 ** (exponent - 3)}k`;
  return String(clean(value));
}

/**
 * A log-10 axis over [low, high] (both > 0): decade ticks, at most `maxTicks`, from the
 * decade at or below `low` to a decade strictly above `high`.
 */
export function logAxis(low, high, maxTicks = 6) {
  const d0 = Math.floor(Math.log10(low) + 1e-9);
  let d1 = Math.floor(Math.log10(high) + 1e-9) + 1;
  const stride = Math.max(1, Math.ceil((d1 - d0) / (maxTicks - 1)));
  d1 = d0 + Math.ceil((d1 - d0) / stride) * stride;
  const ticks = [];
  for (let d = d0; d <= d1; d += stride) ticks.push(10 ** d);
  return { low: 10 ** d0, high: 10 ** d1, ticks, label: decadeLabel };
}

/**
 * A byte axis from 0 over data up to `high` bytes, in one binary unit (the largest that
 * `high` fills at least once): ticks at round multiples of it, labelled "1.5 KiB".
 */
export function byteAxis(high) {
  let power = 0;
  while (high >= 1024 ** (power + 1) && power < BYTE_UNITS.length - 1) power += 1;
  const unit = 1024 ** power;
  const axis = linearAxis(0, high / unit, { minStep: power === 0 ? 1 : 0 });
  const decimals = decimalsOf(axis.step);
  return {
    low: 0,
    high: axis.high * unit,
    ticks: axis.ticks.map((t) => t * unit),
    label: (value) => `${+(value / unit).toFixed(decimals)} ${BYTE_UNITS[power]}`,
  };
}

/** The x axis of rounds from `first` to `last`: whole-round ticks, a lone round centred. */
export function roundAxis(first, last) {
  const [low, high] = first === last ? [first - 0.5, last + 0.5] : [first, last];
  const step = niceStep(high - low, 6, 1);
  return { low, high, ticks: multiples(low, high, step), label: String };
}
