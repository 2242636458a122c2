// The offline checker of benches/clients/decisions.mjs: reads the admissions every client process
// logged (little-endian f64 ms since the epoch, one per admitted unit) and finds, for each window
// length, the window with the most admissions (every window that starts at an admission: no
// other start holds more), against what per-request checks could admit in that length.
//
//   node benches/clients/windows.mjs --rate R --burst B FILE...   (token bucket R/s, burst B)
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** All logged times, sorted. */
export function readTimes(files) {
  const parts = files.map((file) => {
    const bytes = readFileSync(file);
    return new Float64Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
  });
  const all = new Float64Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  return all.sort();
}

/** The most admissions in any window of `ms` (times sorted). */
export function mostInWindow(times, ms) {
  let most = 0;
  let end = 0;
  for (let start = 0; start < times.length; start++) {
    while (end < times.length && times[end] < times[start] + ms) end++;
    most = Math.max(most, end - start);
  }
  return most;
}

/** For each window length: the most admitted, the capacity, and the excess over it. */
export function worstWindows(files, lengths, capacity) {
  const times = readTimes(files);
  return lengths.map((ms) => {
    const count = mostInWindow(times, ms);
    return { ms, count, capacity: capacity(ms), excess: count - capacity(ms) };
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  const take = (name) => {
    const i = args.indexOf(name);
    const value = Number(args[i + 1]);
    args.splice(i, 2);
    return value;
  };
  const rate = take('--rate');
  const burst = take('--burst');
  for (const w of worstWindows(args, [100, 1000], (ms) => burst + Math.floor((rate * ms) / 1000))) {
    console.log(`${w.ms} ms: at most ${w.count} admitted, per-request checks ${w.capacity}, excess ${w.excess}`);
  }
}
