// Probabilities: colours, and the sampler chain applied to a reported distribution, as llama.cpp orders it
// (top-k, top-p, min-p, then temperature) — the seed's decoding section made visible.

export const prob = (logprob) => Math.exp(logprob);

// low probability: warm; high: cool-green. Light enough for dark text.
export function colour(p) {
  const t = Math.max(0, Math.min(1, p));
  return `hsl(${Math.round(8 + 122 * t)}, 75%, ${Math.round(80 - 6 * t)}%)`;
}

export const percent = (p) => (p >= 0.995 ? "100%" : p < 0.001 ? "<0.1%" : `${(100 * p).toFixed(p < 0.1 ? 1 : 0)}%`);

// whitespace made visible in token chips
export const visible = (text) => text.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205";

// candidates: [{token, logprob}] best first (what the server reported: the top few of the whole vocabulary).
// Returns each with p (the model's, temperature 1), p0 (renormalised over the candidates), and after: its
// probability once the settings reshape the distribution (0 with the filter that cut it).
export function reshape(candidates, { temperature, top_k, top_p, min_p }) {
  const rows = candidates.map((c) => ({ token: c.token, logprob: c.logprob, p: prob(c.logprob), after: 0, cut: "" }));
  if (!rows.length) return rows;
  const total = rows.reduce((s, r) => s + r.p, 0);
  for (const r of rows) r.p0 = r.p / total;
  let kept = rows.slice();
  if (top_k > 0 && kept.length > top_k) { for (const r of kept.slice(top_k)) r.cut = "top-k"; kept = kept.slice(0, top_k); }
  if (top_p < 1) {
    const mass = kept.reduce((s, r) => s + r.p, 0);
    let sum = 0, n = 0;
    for (const r of kept) { sum += r.p / mass; n += 1; if (sum >= top_p) break; }
    for (const r of kept.slice(n)) r.cut = "top-p";
    kept = kept.slice(0, n);
  }
  if (min_p > 0) {
    const best = kept[0].p;
    const survivors = kept.filter((r) => r.p >= min_p * best);
    for (const r of kept) if (!survivors.includes(r)) r.cut = "min-p";
    kept = survivors;
  }
  if (temperature <= 0) {
    kept[0].after = 1; // greedy: the most likely token, always
    for (const r of kept.slice(1)) r.cut = "temperature 0";
    return rows;
  }
  const scaled = kept.map((r) => r.logprob / temperature);
  const top = Math.max(...scaled);
  const weights = scaled.map((x) => Math.exp(x - top));
  const sum = weights.reduce((s, w) => s + w, 0);
  kept.forEach((r, i) => { r.after = weights[i] / sum; });
  return rows;
}
