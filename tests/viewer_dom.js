// Runs the viewer's script (glomo_pyg/analysis/viewer/viewer.js) in Node against a minimal
// DOM and prints, as JSON, the labels it shows: the layer menu, the head boxes and the
// captions of the matrix view (text) or of the overlays (images).
// usage: node viewer_dom.js viewer.js data.json
"use strict";
const fs = require("fs");
const [scriptPath, dataPath] = process.argv.slice(2);

class Element {
  constructor(tag) {
    Object.assign(this, { tag, children: [], attributes: {}, style: {}, dataset: {}, own: "" });
  }
  setAttribute(key, value) {
    this.attributes[key] = String(value);
    if (key.startsWith("data-")) this.dataset[key.slice(5)] = String(value);
  }
  getAttribute(key) { return this.attributes[key]; }
  appendChild(child) { this.children.push(child); return child; }
  set textContent(text) { this.own = String(text); this.children = []; }
  get textContent() { return this.own + this.children.map((c) => c.textContent).join(""); }
  set innerHTML(text) { this.own = String(text); this.children = []; }
  addEventListener() {}
  focus() {}
  getContext() {
    return { createImageData: (w, h) => ({ data: new Uint8ClampedArray(4 * w * h) }),
             putImageData() {} };
  }
  all(tag) {  // every descendant of this tag, in document order
    return this.children.flatMap((c) => (c.tag === tag ? [c] : []).concat(c.all ? c.all(tag) : []));
  }
}
const root = new Element("div");
const payload = new Element("script");
payload.textContent = fs.readFileSync(dataPath, "utf8");
global.window = {};
global.document = {
  createElement: (tag) => new Element(tag),
  createElementNS: (ns, tag) => new Element(tag),
  createTextNode: (text) => ({ textContent: String(text) }),
  getElementById: (id) => (id === "glomo-data" ? payload : id === "glomo-viewer" ? root : null),
};
eval(fs.readFileSync(scriptPath, "utf8"));

const viewer = window.glomoViewer;
const layers = root.all("select").find((s) => s.attributes.id === "layer");
const heads = root.all("span").find((s) => s.attributes.id === "heads");
const out = { layers: layers.all("option").map((o) => o.textContent),
              heads: heads.all("label").map((l) => l.textContent) };
if (viewer.data.kind === "text") { viewer.state.view = "matrix"; viewer.render(); }
out.captions = root.all("figcaption").map((f) => f.textContent);
out.labels = root.all("canvas").filter((c) => c.attributes["aria-label"] &&
                                          c.attributes.class === "cell")
  .map((c) => c.attributes["aria-label"]);
process.stdout.write(JSON.stringify(out));
