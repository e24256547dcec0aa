// The GLoMo graph viewer: renders the JSON in #glomo-data (written by
// glomo_pyg.analysis.view). No network access, no libraries.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("glomo-data").textContent);
  const root = document.getElementById("glomo-viewer");
  // Okabe-Ito: distinguishable with the common colour-vision deficiencies
  const PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442", "#000000"];
  const directions = Object.keys(data.directions);
  const state = { direction: directions[0], layer: 0, product: false, heads: null, focus: null,
                  view: "head", pixel: 0 };
  if (data.kind === "image") state.pixel = Math.floor(data.height / 2) * data.width + Math.floor(data.width / 2);
  const info = () => data.directions[state.direction];
  // every label is a graph's name as the data hold it ("forward/layer0/head3", 0-based:
  // glomo_pyg.graph_names), or one of its parts: "layer0", "layers0-2", "head3"
  const part = (name, k) => name.split("/")[k];
  state.heads = new Set(Array.from({ length: info().heads }, (_, h) => h));
  const NS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, parent, text) {
    const node = tag === "svg" || tag === "line" || tag === "text" || tag === "g"
      ? document.createElementNS(NS, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  const color = (h) => PALETTE[h % PALETTE.length];

  // the edges of one graph (CSR over targets): [{src, tgt, w}]
  function edges(layer, head, product) {
    const g = (product ? info().products : info().graphs)[layer][head];
    const out = [];
    for (let j = 0; j + 1 < g.ptr.length; j++)
      for (let k = g.ptr[j]; k < g.ptr[j + 1]; k++) out.push({ src: g.src[k], tgt: j, w: g.w[k] });
    return out;
  }
  function incoming(layer, head, target) {
    const g = info().graphs[layer][head];
    const w = new Float64Array(g.ptr.length - 1);
    for (let k = g.ptr[target]; k < g.ptr[target + 1]; k++) w[g.src[k]] = g.w[k];
    return w;
  }

  // --- controls ---------------------------------------------------------------------------
  const controls = el("div", { class: "controls" }, root);
  const dirLabel = el("label", {}, controls, "direction ");
  const dirSelect = el("select", { id: "direction" }, dirLabel);
  for (const d of directions) el("option", { value: d }, dirSelect, d);
  const layerLabel = el("label", {}, controls);
  const layerSelect = el("select", { id: "layer", "aria-label": "layer" }, layerLabel);
  const headBox = el("span", { id: "heads" }, controls);
  let tabs = null;
  if (data.kind === "text") {
    tabs = el("span", { role: "tablist" }, controls);
    for (const [name, label] of [["head", "head view"], ["matrix", "matrix view"]])
      el("button", { class: "tab", "data-view": name, "aria-pressed": String(name === state.view) }, tabs, label)
        .addEventListener("click", () => { state.view = name; render(); });
  }
  const note = el("div", { class: "note", id: "note" }, root);
  const stage = el("div", { id: "stage" }, root);

  function fillLayers() {
    layerSelect.innerHTML = "";
    for (let l = 0; l < info().layers; l++) el("option", { value: "g" + l }, layerSelect, part(info().names[l][0], 1));
    if (info().products)
      for (let l = 1; l < info().layers; l++)
        el("option", { value: "p" + l }, layerSelect, part(info().product_names[l][0], 1) + " (chained)");
    layerSelect.value = (state.product ? "p" : "g") + state.layer;
  }
  function fillHeads() {
    headBox.innerHTML = "";
    for (let h = 0; h < info().heads; h++) {
      const label = el("label", {}, headBox);
      const box = el("input", { type: "checkbox", class: "head", "data-head": String(h) }, label);
      box.checked = state.heads.has(h);
      box.addEventListener("change", () => { box.checked ? state.heads.add(h) : state.heads.delete(h); render(); });
      el("span", { class: "head-swatch", style: "background:" + color(h) }, label);
      label.appendChild(document.createTextNode(part(info().names[0][h], 2)));
    }
  }
  dirSelect.addEventListener("change", () => {
    state.direction = dirSelect.value; state.layer = Math.min(state.layer, info().layers - 1);
    state.product = state.product && !!info().products && state.layer > 0;
    state.heads = new Set(Array.from({ length: info().heads }, (_, h) => h));
    state.focus = null; fillLayers(); fillHeads(); render();
  });
  layerSelect.addEventListener("change", () => {
    state.product = layerSelect.value[0] === "p"; state.layer = Number(layerSelect.value.slice(1)); render();
  });

  // --- text: head view --------------------------------------------------------------------
  function headView() {
    const tokens = data.tokens, n = tokens.length, rowH = 20, width = 520;
    const svg = el("svg", { id: "head-view", width: String(width), height: String(n * rowH + 30), role: "img",
                            "aria-label": "edges from sources (left) to targets (right)" }, stage);
    el("text", { x: "10", y: "14", "font-weight": "bold" }, svg, "sources");
    el("text", { x: String(width - 80), y: "14", "font-weight": "bold" }, svg, "targets");
    const y = (i) => 34 + i * rowH, x0 = 150, x1 = width - 150;
    const lines = el("g", {}, svg);
    let drawn = 0;
    for (const h of [...state.heads].sort((a, b) => a - b)) {
      for (const e of edges(state.layer, h, state.product)) {
        if (state.focus && (state.focus.side === "tgt" ? e.tgt !== state.focus.index : e.src !== state.focus.index)) continue;
        el("line", { class: "edge", "data-head": String(h), "data-src": String(e.src), "data-tgt": String(e.tgt),
                     x1: String(x0), y1: String(y(e.src) - 4), x2: String(x1), y2: String(y(e.tgt) - 4),
                     stroke: color(h), "stroke-width": "2", "stroke-opacity": String(Math.max(0.04, e.w)) }, lines);
        drawn++;
      }
    }
    svg.setAttribute("data-edges", String(drawn));
    if (data.gold) {
      let gold = 0;
      data.gold.forEach((head, dep) => {
        if (head < 0 || (state.focus && (state.focus.side === "tgt" ? dep !== state.focus.index : head !== state.focus.index))) return;
        el("line", { class: "gold", x1: String(x0), y1: String(y(head) - 4), x2: String(x1), y2: String(y(dep) - 4) }, lines);
        gold++;
      });
      svg.setAttribute("data-gold", String(gold));
    }
    for (const [side, x, anchor] of [["src", x0 - 8, "end"], ["tgt", x1 + 8, "start"]]) {
      tokens.forEach((t, i) => {
        const node = el("text", { class: side + "-token" + (state.focus && state.focus.side === side && state.focus.index === i ? " focus" : ""),
                                  "data-index": String(i), x: String(x), y: String(y(i)), "text-anchor": anchor, tabindex: "0" }, svg, t);
        const on = () => { state.focus = { side, index: i }; render(); };
        const off = () => { state.focus = null; render(); };
        node.addEventListener("mouseenter", on); node.addEventListener("focus", on);
        node.addEventListener("mouseleave", off);
      });
    }
    note.textContent = goldNote() || "Hover (or tab to) a target to keep its incoming edges, a source for its outgoing ones. Opacity: weight.";
  }
  // how many targets' heaviest source (weights summed over the chosen heads) is their gold head
  function goldNote() {
    if (!data.gold || state.heads.size === 0) return "";
    const n = data.tokens.length, best = new Array(n).fill(-1), top = new Array(n).fill(0);
    const total = new Map();
    for (const h of state.heads) for (const e of edges(state.layer, h, state.product)) {
      const key = e.tgt * n + e.src; total.set(key, (total.get(key) || 0) + e.w);
    }
    for (const [key, w] of total) { const j = Math.floor(key / n), i = key % n; if (w > top[j]) { top[j] = w; best[j] = i; } }
    let hit = 0, count = 0;
    best.forEach((i, j) => { if (i >= 0) { count++; if (data.gold[j] === i) hit++; } });
    root.setAttribute("data-gold-hits", String(hit));
    return "Gold arcs dashed. Heaviest source is the gold head for " + hit + " of " + count + " targets with edges.";
  }

  // --- text: matrix view ------------------------------------------------------------------
  function heat(canvas, g, n) {
    canvas.width = n; canvas.height = n;
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(n, n);
    for (let p = 0; p < n * n; p++) { img.data[4 * p] = img.data[4 * p + 1] = img.data[4 * p + 2] = 255; img.data[4 * p + 3] = 255; }
    for (let j = 0; j + 1 < g.ptr.length; j++)
      for (let k = g.ptr[j]; k < g.ptr[j + 1]; k++) {
        const p = 4 * (g.src[k] * n + j), v = Math.round(255 * (1 - Math.min(1, g.w[k])));
        img.data[p] = v; img.data[p + 1] = v; img.data[p + 2] = 255;  // white to blue
      }
    ctx.putImageData(img, 0, 0);
  }
  function matrixView() {
    const grid = el("div", { class: "matrix", id: "matrix-view", style: "grid-template-columns: repeat(" + info().heads + ", 140px)" }, stage);
    for (let l = 0; l < info().layers; l++)
      for (let h = 0; h < info().heads; h++) {
        const fig = el("figure", {}, grid);
        const canvas = el("canvas", { class: "cell", "data-layer": String(l), "data-head": String(h), tabindex: "0",
                                      "aria-label": info().names[l][h] }, fig);
        heat(canvas, info().graphs[l][h], data.tokens.length);
        el("figcaption", {}, fig, info().names[l][h]);
        const open = () => { state.layer = l; state.product = false; state.heads = new Set([h]); state.view = "head"; state.focus = null; fillLayers(); fillHeads(); render(); };
        canvas.addEventListener("click", open);
        canvas.addEventListener("keydown", (ev) => { if (ev.key === "Enter") open(); });
      }
    note.textContent = "Rows: sources, columns: targets (paper Fig. 3). Click a graph to open it in the head view.";
  }

  // --- images -----------------------------------------------------------------------------
  function paint(canvas, weights) {
    const w = data.width, hgt = data.height, ctx = canvas.getContext("2d"), img = ctx.createImageData(w, hgt);
    let peak = 0, lit = 0;
    if (weights) for (const v of weights) { peak = Math.max(peak, v); if (v > 0) lit++; }
    for (let p = 0; p < w * hgt; p++) {
      const r = data.pixels[3 * p], g = data.pixels[3 * p + 1], b = data.pixels[3 * p + 2];
      const a = weights && peak > 0 ? weights[p] / peak : 0;
      const grey = weights ? 0.35 * (0.299 * r + 0.587 * g + 0.114 * b) + 90 : null;
      img.data[4 * p] = weights ? (1 - a) * grey + a * 213 : r;       // towards #D55E00
      img.data[4 * p + 1] = weights ? (1 - a) * grey + a * 94 : g;
      img.data[4 * p + 2] = weights ? (1 - a) * grey : b;
      img.data[4 * p + 3] = 255;
    }
    if (weights === null || weights === undefined) {
      const x = state.pixel % w, y = Math.floor(state.pixel / w), p = 4 * (y * w + x);
      img.data[p] = 0; img.data[p + 1] = 114; img.data[p + 2] = 178;  // the chosen pixel
    }
    ctx.putImageData(img, 0, 0);
    canvas.setAttribute("data-highlighted", String(lit));
  }
  function imageView() {
    const w = data.width, hgt = data.height;
    const main = el("canvas", { class: "main", id: "image", width: String(w), height: String(hgt), tabindex: "0",
                                "aria-label": "the image: point at a pixel, or move with the arrow keys" }, stage);
    paint(main, null);
    const pick = (ev) => {
      const box = main.getBoundingClientRect();
      const x = Math.min(w - 1, Math.max(0, Math.floor((ev.clientX - box.left) / box.width * w)));
      const y = Math.min(hgt - 1, Math.max(0, Math.floor((ev.clientY - box.top) / box.height * hgt)));
      if (y * w + x !== state.pixel) { state.pixel = y * w + x; render(); }
    };
    main.addEventListener("mousemove", pick);
    main.addEventListener("keydown", (ev) => {
      const moves = { ArrowLeft: -1, ArrowRight: 1, ArrowUp: -w, ArrowDown: w };
      if (!(ev.key in moves)) return;
      ev.preventDefault();
      const x = state.pixel % w, next = state.pixel + moves[ev.key];
      if (next < 0 || next >= w * hgt || (ev.key === "ArrowLeft" && x === 0) || (ev.key === "ArrowRight" && x === w - 1)) return;
      state.pixel = next; render(); document.getElementById("image").focus();
    });
    const grid = el("div", { class: "overlays", style: "grid-template-columns: repeat(" + info().heads + ", 136px)" }, stage);
    for (let l = 0; l < info().layers; l++)
      for (let h = 0; h < info().heads; h++) {
        const fig = el("figure", {}, grid);
        const canvas = el("canvas", { class: "overlay", "data-layer": String(l), "data-head": String(h), width: String(w), height: String(hgt) }, fig);
        if (l === state.layer && state.heads.has(h)) canvas.style.borderColor = color(h);
        paint(canvas, incoming(l, h, state.pixel));
        el("figcaption", {}, fig, info().names[l][h]);
      }
    const x = state.pixel % w, y = Math.floor(state.pixel / w);
    note.textContent = "Pixel (row " + y + ", column " + x + "): its incoming weights in every " + state.direction +
      " graph, relative to each graph's heaviest (orange). Top " + data.top_k + " sources per pixel kept.";
    root.setAttribute("data-pixel", String(state.pixel));
  }

  function render() {
    stage.innerHTML = "";
    if (tabs) for (const b of tabs.children) b.setAttribute("aria-pressed", String(b.dataset.view === state.view));
    layerLabel.style.display = data.kind === "text" && state.view === "matrix" ? "none" : "";
    headBox.style.display = data.kind === "text" && state.view === "matrix" ? "none" : "";
    if (data.kind === "image") imageView();
    else if (state.view === "matrix") matrixView();
    else headView();
  }
  fillLayers(); fillHeads(); render();
  window.glomoViewer = { data, state, render };
})();
