// llmrun look: the forward-pass views of one report (the JSON of `llmrun look --json`).
// A classic script: `llmrun look --html` inlines it into a self-contained page; the page at / loads it.
// mount(root, D) draws the views into root; the markup holds no data (every text from D is set as text).
"use strict";
(function () {
const MARKUP = `
<header>
  <h1>Inside one forward pass of <span id="model"></span></h1>
  <div id="facts" class="dim"></div>
  <div id="positions" class="dim"></div>
</header>
<main>
  <section class="wide">
    <h2>Tokens → attention <span class="dim">— hover a token to see what it reads; click to keep it</span></h2>
    <div class="controls">
      <label>layer <select id="layer"></select></label>
      <label>head <select id="head"></select></label>
      <label><input type="checkbox" id="skip"> leave out the first token (an attention sink) and rescale</label>
    </div>
    <div id="tokens"></div>
    <p id="reading" class="dim"></p>
  </section>
  <section>
    <h2>Attention map <span class="dim">— rows: queries, columns: keys</span></h2>
    <canvas id="heat" width="560" height="560"></canvas>
  </section>
  <section>
    <h2>Heads <span class="dim">— the key the chosen token weighs most, per layer and head; click to draw it</span></h2>
    <div class="scroll"><table class="grid" id="heads"></table></div>
  </section>
  <section class="wide">
    <h2>Logit lens <span class="dim">— the top next token after each position, read from each layer's output (final norm + output head); the last row is the model's own prediction</span></h2>
    <div class="scroll"><table class="grid" id="lens"></table></div>
  </section>
  <section class="wide" id="neighbours-box" hidden>
    <h2>Nearest tokens in the embedding space <span class="dim">(cosine)</span></h2>
    <ul id="neighbours"></ul>
  </section>
</main>
<footer class="dim" id="notes"></footer>
<div id="tip"></div>
`;

function mount(root, D) {
  root.classList.add("look");
  root.innerHTML = MARKUP;
  const $ = (id) => root.querySelector("#" + id);
  const n = D.tokens.length;
  const show = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5");
  const state = { layer: D.attention_layers[D.attention_layers.length - 1], head: -1, query: n - 1, pinned: false, skip: false };

  function heat(w) { const t = Math.sqrt(Math.max(0, Math.min(1, w))); return `rgba(217, 72, 15, ${0.06 + 0.94 * t})`; }
  function green(p) { const t = Math.sqrt(Math.max(0, Math.min(1, p))); return `rgba(43, 138, 62, ${0.05 + 0.8 * t})`; }
  function ink(w) { return Math.sqrt(w) > 0.6 ? "#fff" : "#1d1d1f"; }

  // one query's weights over keys 0..q at a layer, for one head or the heads' mean (rescaled without the first token)
  function row(layer, head, q) {
    const maps = D.attention[layer];
    if (!maps) return null;
    const heads = head < 0 ? maps : [maps[head]];
    const out = new Array(q + 1).fill(0);
    for (const h of heads) for (let k = 0; k <= q; k++) out[k] += h[q][k] / heads.length;
    if (state.skip && q > 0) {
      const rest = 1 - out[0];
      out[0] = 0;
      for (let k = 1; k <= q; k++) out[k] = rest > 0 ? out[k] / rest : 0;
    }
    return out;
  }

  function setup() {
    $("model").textContent = D.model;
    $("facts").textContent = `${D.architecture} · ${n} tokens · ${D.layers} layers × ${D.heads} heads` +
      (D.kv_heads < D.heads ? ` (${D.kv_heads} K/V head${D.kv_heads > 1 ? "s" : ""}: grouped-query attention)` : "") +
      ` · ${D.embedding_size} dimensions · vocabulary ${D.vocabulary.toLocaleString()}`;
    $("positions").textContent = D.positions.text;
    for (const l of D.attention_layers) $("layer").add(new Option(`${l}`, l));
    $("layer").value = state.layer;
    $("head").add(new Option("all (mean)", -1));
    for (let h = 0; h < D.heads; h++) $("head").add(new Option(`${h}`, h));
    $("layer").onchange = () => { state.layer = +$("layer").value; draw(); };
    $("head").onchange = () => { state.head = +$("head").value; draw(); };
    $("skip").onchange = () => { state.skip = $("skip").checked; draw(); };
    const box = $("tokens");
    D.tokens.forEach((t, i) => {
      const el = document.createElement("span");
      el.className = "tok"; el.dataset.position = i;
      el.title = `#${i} · id ${t.id} · |v| ${t.norm}`;
      el.append(document.createTextNode(show(t.text)));
      const w = document.createElement("span"); w.className = "w"; el.append(w);
      el.onmouseenter = () => { if (!state.pinned) { state.query = i; draw(); } };
      el.onclick = () => { state.pinned = !(state.pinned && state.query === i); state.query = i; draw(); };
      box.append(el);
    });
    const near = Object.entries(D.neighbours);
    if (near.length) {
      $("neighbours-box").hidden = false;
      for (const [word, list] of near) {
        const li = document.createElement("li");
        li.textContent = `${show(word)} → ` + list.map((x) => `${show(x.text)} ${x.cosine.toFixed(2)}`).join(" · ");
        $("neighbours").append(li);
      }
    }
    $("notes").textContent = D.notes.join(" ");
    lens();
    canvasEvents();
    draw();
  }

  function draw() {
    const q = state.query;
    const weights = row(state.layer, state.head, q) || [];
    root.querySelectorAll(".tok").forEach((el) => {
      const k = +el.dataset.position;
      const w = k <= q ? (weights[k] || 0) : 0;
      el.classList.toggle("query", k === q);
      el.style.background = k <= q ? heat(w) : "transparent";
      el.style.color = k <= q ? ink(w) : "#b5b3ad";
      el.querySelector(".w").textContent = k <= q ? w.toFixed(2) : "";
      el.querySelector(".w").style.color = el.style.color;
    });
    const ranked = weights.map((w, k) => [w, k]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    if (!D.attention_layers.length) { $("reading").textContent = "No attention weights were captured: see the notes below."; return; }
    $("reading").textContent = `#${q} ${show(D.tokens[q].text)} at layer ${state.layer}, ` +
      (state.head < 0 ? "heads averaged" : `head ${state.head}`) + " reads most: " +
      ranked.map(([w, k]) => `${show(D.tokens[k].text)} (#${k}) ${w.toFixed(2)}`).join(", ");
    heatmap();
    heads();
  }

  const cellSize = () => Math.max(4, Math.min(34, Math.floor(460 / n)));
  const labelWidth = 90;
  function heatmap() {
    const c = $("heat"), s = cellSize();
    c.width = labelWidth + n * s + 10; c.height = labelWidth + n * s + 10;
    const g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    g.font = "11px ui-monospace, Menlo, monospace"; g.textBaseline = "middle";
    for (let q = 0; q < n; q++) {
      const r = row(state.layer, state.head, q) || [];
      for (let k = 0; k <= q; k++) { g.fillStyle = heat(r[k] || 0); g.fillRect(labelWidth + k * s, labelWidth + q * s, s - 1, s - 1); }
      g.fillStyle = q === state.query ? "#000" : "#6b6b70"; g.textAlign = "right";
      if (s >= 9) g.fillText(show(D.tokens[q].text).slice(0, 11), labelWidth - 4, labelWidth + q * s + s / 2);
    }
    if (s >= 9) for (let k = 0; k < n; k++) {
      g.save(); g.translate(labelWidth + k * s + s / 2, labelWidth - 4); g.rotate(-Math.PI / 2);
      g.textAlign = "left"; g.fillStyle = "#6b6b70"; g.fillText(show(D.tokens[k].text).slice(0, 11), 0, 0); g.restore();
    }
    g.strokeStyle = "#000"; g.lineWidth = 1.5;
    g.strokeRect(labelWidth - 1, labelWidth + state.query * s - 1, n * s + 1, s + 1);
  }

  function canvasEvents() {
    const c = $("heat"), tip = $("tip");
    c.onmousemove = (e) => {
      const rect = c.getBoundingClientRect(), s = cellSize() * rect.width / c.width;
      const k = Math.floor((e.clientX - rect.left - labelWidth * rect.width / c.width) / s);
      const q = Math.floor((e.clientY - rect.top - labelWidth * rect.height / c.height) / s);
      if (q < 0 || k < 0 || q >= n || k > q) { tip.style.display = "none"; return; }
      const w = (row(state.layer, state.head, q) || [])[k] || 0;
      tip.textContent = `${show(D.tokens[q].text)} (#${q}) → ${show(D.tokens[k].text)} (#${k}): ${w.toFixed(3)}`;
      tip.style.left = `${e.clientX + 12}px`; tip.style.top = `${e.clientY + 12}px`; tip.style.display = "block";
    };
    c.onmouseleave = () => { tip.style.display = "none"; };
    c.onclick = (e) => {
      const rect = c.getBoundingClientRect(), s = cellSize() * rect.height / c.height;
      const q = Math.floor((e.clientY - rect.top - labelWidth * rect.height / c.height) / s);
      if (q >= 0 && q < n) { state.query = q; state.pinned = true; draw(); }
    };
  }

  function heads() {
    const t = $("heads"); t.textContent = "";
    const top = t.insertRow(); top.append(document.createElement("th"));
    for (let h = 0; h < D.heads; h++) { const th = document.createElement("th"); th.textContent = `h${h}`; top.append(th); }
    for (const l of D.attention_layers) {
      const tr = t.insertRow(); const th = document.createElement("th"); th.textContent = `layer ${l}`; tr.append(th);
      for (let h = 0; h < D.heads; h++) {
        const r = row(l, h, state.query) || [];
        let best = 0; for (let k = 1; k < r.length; k++) if (r[k] > r[best]) best = k;
        const w = r[best] || 0, td = tr.insertCell();
        td.textContent = show(D.tokens[best].text);
        td.title = `layer ${l}, head ${h}: ${show(D.tokens[best].text)} (#${best}) ${w.toFixed(3)}`;
        td.style.background = heat(w); td.style.color = ink(w);
        if (l === state.layer && h === state.head) td.className = "chosen";
        td.onclick = () => { state.layer = l; state.head = h; $("layer").value = l; $("head").value = h; draw(); };
      }
    }
  }

  function lens() {
    const t = $("lens"); t.textContent = "";
    const top = t.insertRow(); const corner = document.createElement("th"); corner.textContent = "after →"; top.append(corner);
    D.tokens.forEach((tok) => { const th = document.createElement("th"); th.textContent = show(tok.text); top.append(th); });
    D.lens.forEach((cells, layer) => {
      if (cells.every((c) => c === null)) return;
      const tr = t.insertRow(); const th = document.createElement("th");
      th.textContent = layer === D.layers - 1 ? "output" : `layer ${layer}`; tr.append(th);
      cells.forEach((c, p) => {
        const td = tr.insertCell();
        if (c === null) { td.textContent = "?"; return; }
        td.textContent = show(c.text);
        td.style.background = green(c.prob); td.style.color = Math.sqrt(c.prob) > 0.7 ? "#fff" : "#1d1d1f";
        td.title = `layer ${layer}, after #${p} ${show(D.tokens[p].text)}:\n` +
          c.top.map((x) => `${show(x.text)}  ${(100 * x.prob).toFixed(1)}%`).join("\n");
      });
    });
  }

    setup();
}

globalThis.llmrunLook = { mount };
})();
