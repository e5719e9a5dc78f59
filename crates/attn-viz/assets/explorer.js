// attnscope explorer: head view, model view, heatmap and neuron view of one text's attention.
// Plain JS and canvas, no network: the data comes from the page's JSON element ("file" mode) or
// from POST /api/attention ("app" mode). Every token reaches the DOM through textContent only.
"use strict";

(function () {
  const FORMAT = 5;
  const ROW = 18; // head-view row height in px, matches .tok in the CSS
  // matplotlib's tab10 and two more; purple and grey a shade darker, so that a head button's
  // label has 4.5:1 contrast (WCAG AA) in white or in the page's dark text.
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#8a5cb4", "#8c564b",
    "#e377c2", "#737373", "#bcbd22", "#17becf", "#3b4cc0", "#b40426"];
  const BUCKETS = 25; // line opacities are drawn in this many steps
  const mode = document.body.dataset.mode;
  const $ = (id) => document.getElementById(id);

  // S: everything the views draw from. W is [L, H, T, K] weights * scale, row = query (T
  // queries, S.data.tokens; K keys, S.keys, the queries themselves but in an encoder-decoder
  // model's cross-attention); R is the attention rollout ([T, T], null for cross-attention)
  // and A every layer's and head's mean ([T, K]), * scale each; measures maps a method's name
  // to its label and [layers, T, T] row shares * scale. An encoder-decoder model's payload
  // holds three kinds of attention: kinds maps each name to its unpacked data, kind is the
  // one shown, source the payload itself.
  const S = { data: null, W: null, R: null, A: null, measures: new Map(), T: 0, K: 0, keys: [], L: 0, H: 0, scale: 1000, layer: 0, heads: [],
    filter: "all", view: "head", neuron: new Map(), neuronLayers: [], renderId: 0, kinds: null, kind: null, source: null };

  function setState(state) { document.body.dataset.state = state; }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = false;
    setState("error");
  }

  function clearError() { $("error").hidden = true; $("error").textContent = ""; }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // ---- unpacking (see payload.rs) ----
  async function inflate(b64) {
    const bin = atob(b64);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // LEB128 varint tokens: 2v for a weight of v thousandths, 2r + 1 for r zeros (payload.rs).
  function decodeWeights(bytes, n) {
    const out = new Uint16Array(n);
    let i = 0, k = 0;
    while (i < bytes.length) {
      let token = 0, scale = 1, b;
      do {
        b = bytes[i++];
        token += (b & 127) * scale;
        scale *= 128;
      } while (b & 128 && i < bytes.length);
      if (token % 2 === 1) k += (token - 1) / 2;
      else out[k++] = token / 2;
      if (k > n) break;
    }
    if (k !== n) throw new Error("weights are corrupt: expected " + n + " values");
    return out;
  }

  function halfToFloat(h) {
    const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 31, frac = h & 1023;
    if (exp === 0) return sign * frac * Math.pow(2, -24);
    if (exp === 31) return frac ? NaN : sign * Infinity;
    return sign * (1 + frac / 1024) * Math.pow(2, exp - 15);
  }

  function decodeHalves(bytes) {
    const out = new Float32Array(bytes.length >> 1);
    for (let i = 0; i < out.length; i++) out[i] = halfToFloat(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    return out;
  }

  // What a new tab shows of `data` before its #fragment: the head view of every head,
  // unfiltered, on the first layer with neuron data (else the last).
  function defaults(data) {
    return { view: "head", filter: "all", heads: new Array(data.n_heads).fill(true),
      layer: data.neuron && data.neuron.layers.length ? data.neuron.layers[0] : data.n_layers - 1 };
  }

  // One payload's (or one kind's) attention, unpacked.
  async function unpack(view) {
    const T = view.tokens.length, K = view.key_tokens ? view.key_tokens.length : T, L = view.n_layers, H = view.n_heads;
    return { view, T, K, L, H, W: decodeWeights(await inflate(view.weights), L * H * T * K),
      R: view.rollout ? decodeWeights(await inflate(view.rollout), T * T) : null,
      A: decodeWeights(await inflate(view.all_layers), T * K) };
  }

  // Whether the tokens are a text and its pair, which the A/B filter splits (an
  // encoder-decoder model's source and target are its kinds' rows and columns instead).
  function hasPair() { return (!S.kinds || !!S.source.rows) && S.keys.some((t) => t.segment === 1); }

  // Query `i`'s position among the keys: its index, but on a page of chosen rows.
  function position(i) { return S.data.positions ? S.data.positions[i] : i; }

  // Whether the kind selector has a choice to offer (a page of chosen rows has one kind).
  function manyKinds() { return !!S.kinds && S.source.kinds.length > 1; }

  // Shows `unpacked` (a payload's or one kind's): the views draw from it; the layer and the
  // heads shown stay where they fit.
  function show(unpacked) {
    const { view, T, K, L, H, W, R, A } = unpacked;
    const data = S.kinds ? Object.assign({}, S.source, view) : view;
    Object.assign(S, { data, W, R, A, T, K, L, H, keys: view.key_tokens || view.tokens, scale: view.weight_scale,
      causal: view.causal, layer: Math.min(S.layer, L - 1) });
    if (S.heads.length !== H) S.heads = new Array(H).fill(true);
  }

  // An encoder-decoder model's kind `name` (encoder, decoder, cross), shown; a pinned token
  // goes, as its tokens do.
  function applyKind(name) {
    if (!S.kinds || !S.kinds.has(name) || name === S.kind) return;
    S.kind = name;
    show(S.kinds.get(name));
    headKeep.pin = null;
    if ($("heatmap-head").value === "rollout" && !S.R) $("heatmap-head").value = "mean";
  }

  async function load(data) {
    if (!data || data.format !== FORMAT) throw new Error("this page cannot read data format " + (data && data.format));
    let shown = null, kinds = null;
    if (data.kinds) {
      kinds = new Map();
      for (const view of data.kinds) kinds.set(view.name, await unpack(view));
    } else {
      shown = await unpack(data);
    }
    const { T, L, H } = shown || kinds.values().next().value;
    const measures = new Map();
    for (const m of data.measures) {
      measures.set(m.name, { label: m.label, layers: m.layers, values: decodeWeights(await inflate(m.matrix), m.layers * T * T) });
    }
    const neuron = new Map();
    if (data.neuron) {
      const q = decodeHalves(await inflate(data.neuron.q));
      const k = decodeHalves(await inflate(data.neuron.k));
      const per = H * T * data.neuron.head_dim;
      data.neuron.layers.forEach((layer, n) => {
        neuron.set(layer, { q: q.subarray(n * per, (n + 1) * per), k: k.subarray(n * per, (n + 1) * per) });
      });
    }
    // A pinned token stays pinned only on the same text (and kind).
    const sameText = S.data && (kinds || S.T === T) && S.data.text === data.text && S.data.pair === data.pair &&
      S.data.target === data.target;
    // A new answer of an encoder-decoder model keeps the kind shown.
    const kind = kinds ? (kinds.has(S.kind) ? S.kind : data.kind) : null;
    const keepLayer = S.data && (kinds ? S.kinds && S.kinds.has(kind) && S.kinds.get(kind).L === kinds.get(kind).L : S.L === L)
      ? S.layer : defaults((kinds ? kinds.get(kind) : shown).view).layer;
    Object.assign(S, { measures, neuron, neuronLayers: data.neuron ? data.neuron.layers : [], layer: keepLayer,
      kinds, kind, source: data });
    show(kinds ? kinds.get(kind) : shown);
    if (!hasPair()) S.filter = "all";
    if (!sameText) headKeep.pin = null;
    const restore = !S.restored;
    if (restore) restoreState();
    buildControls();
    if (restore) restoreSelects();
    await render();
  }

  // ---- what is shown, kept in the address's #fragment to bookmark or share ----
  function saveState() {
    const h = new URLSearchParams({ view: S.view, layer: String(S.layer) });
    if (S.kinds) h.set("attention", S.kind);
    if (S.heads.some((on) => !on)) h.set("heads", S.heads.flatMap((on, k) => (on ? [k] : [])).join("."));
    if (S.filter !== "all") h.set("filter", S.filter);
    if (S.view === "heatmap") {
      if ($("heatmap-method").value !== "weights") h.set("method", $("heatmap-method").value);
      h.set("matrix", $("heatmap-head").value);
      if ($("heatmap-scale").value !== "linear") h.set("scale", $("heatmap-scale").value);
    }
    if (S.view === "neuron") {
      h.set("head", $("neuron-head").value);
      h.set("query", $("neuron-query").value);
    }
    // A page in a sandboxed frame (Jupyter's inline view: about:srcdoc) has no address to keep.
    try {
      history.replaceState(null, "", location.pathname + location.search + "#" + h.toString());
    } catch (_) {
      return;
    }
  }

  // The first data's view, kind of attention, layer, heads and filter from the #fragment (or
  // ?view=), each only when it fits the data.
  function restoreState() {
    S.restored = true;
    const h = new URLSearchParams(location.hash.slice(1));
    if (S.kinds) applyKind(S.kinds.has(h.get("attention")) ? h.get("attention") : S.source.kind);
    const view = h.get("view") || new URLSearchParams(location.search).get("view");
    if (["head", "model", "heatmap", "neuron"].includes(view)) S.view = view;
    const whole = (x) => /^\d+$/.test(x) ? Number(x) : NaN;
    const layer = whole(h.get("layer") || "");
    if (layer < S.L) S.layer = layer;
    if (h.has("heads")) {
      const on = h.get("heads").split(".").filter((x) => x !== "").map(whole);
      if (on.every((k) => k < S.H)) S.heads = S.heads.map((_, k) => on.includes(k));
    }
    if (["AA", "AB", "BA", "BB"].includes(h.get("filter")) && hasPair()) S.filter = h.get("filter");
  }

  // The selects the #fragment names, once the controls hold the data's options.
  function restoreSelects() {
    const h = new URLSearchParams(location.hash.slice(1));
    for (const [key, id] of [["method", "heatmap-method"], ["matrix", "heatmap-head"], ["scale", "heatmap-scale"], ["head", "neuron-head"], ["query", "neuron-query"]]) {
      const select = $(id);
      if (h.has(key) && [...select.options].some((o) => o.value === h.get(key))) select.value = h.get(key);
    }
  }

  // ---- helpers shared by the views ----
  function headColour(h) { return h < PALETTE.length ? PALETTE[h] : "hsl(" + ((h * 47) % 360) + ",60%,45%)"; }

  // White or near-black text on a head's colour, whichever contrasts more (WCAG relative
  // luminance; the colours past the palette are dark enough for white).
  function textOn(colour) {
    if (!colour.startsWith("#")) return "#fff";
    const channel = (k) => {
      const c = parseInt(colour.slice(1 + 2 * k, 3 + 2 * k), 16) / 255;
      return c <= 0.03928 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
    };
    const lum = 0.2126 * channel(0) + 0.7152 * channel(1) + 0.0722 * channel(2);
    const dark = 0.0168; // #1d2330
    return 1.05 / (lum + 0.05) >= (lum + 0.05) / (dark + 0.05) ? "#fff" : "#1d2330";
  }

  function tokenLabel(t) {
    return t.label.trim() === "" ? "␣" : t.label;
  }

  // Why a filtered view is empty: on a causal model the first text comes before its pair.
  function emptyReason() {
    if (S.filter === "AB" && S.causal) return "Nothing to show: A comes before B, so a causal model's A tokens cannot see B.";
    if (S.data.weight_floor) {
      return "Nothing to show: no weight here reaches the page's floor of " + (S.data.weight_floor / S.scale).toFixed(3) + ".";
    }
    return S.data.zero_hidden_max > 0
      ? "Nothing to show: every weight here is under 0.0005, which shows as 0 at 3 decimals."
      : "Nothing to show: no attention passes this filter.";
  }

  function weight(layer, head, i, j) { return S.W[((layer * S.H + head) * S.T + i) * S.K + j] / S.scale; }

  // Which (query, key) pairs the A/B filter keeps.
  function filterPass(i, j) {
    if (S.filter === "all") return true;
    return S.data.tokens[i].segment === (S.filter[0] === "A" ? 0 : 1) && S.keys[j].segment === (S.filter[1] === "A" ? 0 : 1);
  }

  // The smallest weight (quantised, >= minWeight) whose lines number at most maxLines, so that
  // long inputs draw their strongest lines quickly instead of a million faint ones.
  function lineFloor(layer, heads, minWeight, maxLines) {
    const T = S.T, K = S.K, counts = new Uint32Array(S.scale + 1);
    for (const h of heads) {
      const base = (layer * S.H + h) * T * K;
      for (let i = 0; i < T; i++) for (let j = 0; j < K; j++) if (filterPass(i, j)) counts[S.W[base + i * K + j]]++;
    }
    let floor = S.scale + 1, total = 0;
    const lowest = Math.max(1, Math.round(minWeight * S.scale));
    while (floor > lowest && total + counts[floor - 1] <= maxLines) total += counts[--floor];
    return { floor, shown: total, all: counts.reduce((a, b) => a + b, 0) - counts[0] };
  }

  // Lines from queries (x0) to keys (x1), opacity = weight, one colour per head; `only` limits
  // them to one query ({side: "left"}) or one key ({side: "right"}); weights below minQ
  // (quantised) are not drawn.
  function drawLines(ctx, layer, heads, geometry, only, minQ) {
    const { x0, x1, y0, step } = geometry;
    const T = S.T, K = S.K;
    for (const h of heads) {
      const paths = Array.from({ length: BUCKETS }, () => new Path2D());
      const used = new Array(BUCKETS).fill(false);
      const base = (layer * S.H + h) * T * K;
      const iFrom = only && only.side === "left" ? only.index : 0;
      const iTo = only && only.side === "left" ? only.index + 1 : T;
      for (let i = iFrom; i < iTo; i++) {
        const jFrom = only && only.side === "right" ? only.index : 0;
        const jTo = only && only.side === "right" ? only.index + 1 : K;
        for (let j = jFrom; j < jTo; j++) {
          const q = S.W[base + i * K + j];
          if (q < minQ || !filterPass(i, j)) continue;
          const b = Math.min(BUCKETS - 1, Math.floor((q / S.scale) * BUCKETS));
          paths[b].moveTo(x0, y0 + (i + 0.5) * step);
          paths[b].lineTo(x1, y0 + (j + 0.5) * step);
          used[b] = true;
        }
      }
      ctx.strokeStyle = headColour(h);
      for (let b = 0; b < BUCKETS; b++) {
        if (!used[b]) continue;
        ctx.globalAlpha = (b + 0.5) / BUCKETS;
        ctx.stroke(paths[b]);
      }
    }
    ctx.globalAlpha = 1;
  }

  // A cleared canvas of `width` × `height` CSS pixels at the screen's pixel ratio. A bitmap of
  // the same size is cleared, not reallocated (a long text's head view is 18,000 pixels tall
  // on a phone, and every arrow key redraws it).
  function sizedCanvas(canvas, width, height) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(width * dpr)), h = Math.max(1, Math.round(height * dpr));
    const ctx = canvas.getContext("2d");
    if (canvas.width === w && canvas.height === h) {
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.clearRect(0, 0, w, h);
    } else {
      canvas.width = w;
      canvas.height = h;
      canvas.style.width = width + "px";
      canvas.style.height = height + "px";
    }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  // ---- head view: tokens in two columns; point at one to isolate its lines, click (or Enter)
  // to pin it; arrow keys move the pinned token, Escape lets it go ----
  // `keep` holds the pinned token between redraws ({pin}): a new layer, head or filter keeps
  // it, so that one token can be compared across them.
  function buildHeadView(container, layerOf, headsOf, keep) {
    container.replaceChildren();
    const view = el("div", "headview");
    const left = el("div", "tokens left"), right = el("div", "tokens right");
    const canvas = document.createElement("canvas");
    canvas.setAttribute("aria-hidden", "true");
    for (const [column, side, name] of [[left, "left", "Query tokens"], [right, "right", "Key tokens"]]) {
      column.tabIndex = 0;
      column.setAttribute("role", "listbox");
      column.setAttribute("aria-label", name + ": arrow keys pick one, Escape lets it go");
      column.dataset.side = side;
    }
    const prefix = container.id + "-tok-";
    const pair = hasPair();
    for (const [column, side, tokens] of [[left, "left", S.data.tokens], [right, "right", S.keys]]) {
      tokens.forEach((t, i) => {
        const segB = pair && t.segment === 1;
        const tok = el("div", "tok" + (t.special ? " special" : "") + (segB ? " segB" : ""), tokenLabel(t));
        tok.id = prefix + side + "-" + i;
        tok.setAttribute("role", "option");
        tok.setAttribute("aria-selected", "false");
        if (segB) tok.setAttribute("aria-description", "pair (B)");
        tok.dataset.index = i;
        tok.dataset.side = side;
        column.appendChild(tok);
      });
    }
    view.append(el("span", "heading left", S.data.queries || "query (attending)"), el("span", "heading right", S.data.keys || "key (attended to)"),
      left, canvas, right);
    container.appendChild(view);
    const caption = el("p", "muted", "");
    const neuronLink = el("button", "neuron-link", "");
    neuronLink.type = "button";
    neuronLink.hidden = true;
    container.append(caption, neuronLink);
    // How many tokens each side lists: the queries on the left, the keys on the right.
    const count = (side) => (side === "left" ? S.T : S.K);
    let hover = null, pinned = keep.pin && keep.pin.index < count(keep.pin.side) ? keep.pin : null;
    // Whether the A/B filter lets token `index` on `side` have lines at all.
    const passes = (side, index) => S.filter === "all" ||
      (side === "left" ? S.data.tokens : S.keys)[index].segment === (S.filter[side === "left" ? 0 : 1] === "A" ? 0 : 1);
    for (const [column, side] of [[left, "left"], [right, "right"]]) {
      for (const tok of column.children) tok.classList.toggle("filtered", !passes(side, Number(tok.dataset.index)));
    }
    // The lines' width: up to 240 px, less on a narrow screen so that the keys stay in view.
    const linesWidth = () => {
      const room = container.clientWidth - left.offsetWidth - right.offsetWidth - 8;
      return Math.max(60, Math.min(240, room));
    };
    const draw = () => {
      const width = linesWidth();
      view.style.gridTemplateColumns = "max-content " + width + "px max-content";
      const ctx = sizedCanvas(canvas, width, Math.max(S.T, S.K) * ROW);
      const heads = headsOf();
      const shown = pinned || hover;
      let minQ = 1;
      const pair = hasPair() ? " Italic tokens are the pair's (B)." : "";
      if (!shown) {
        const lines = lineFloor(layerOf(), heads, 0.005, 40000);
        minQ = lines.floor;
        caption.textContent = heads.length === 0
          ? "No head is shown: turn one on above."
          : lines.all === 0
            ? emptyReason()
            : (lines.shown < lines.all
              ? "Showing the " + lines.shown.toLocaleString("en") + " strongest of " + lines.all.toLocaleString("en") +
                " lines (weight ≥ " + (minQ / S.scale).toFixed(3) + "); point at a token to see all of its lines, click it to keep them."
              : "Each line goes from a query to a key it attends to, darker for more weight; point at a token to see only its lines, click it to keep them.") + pair;
      } else if (pinned) {
        const t = (pinned.side === "left" ? S.data.tokens : S.keys)[pinned.index];
        const shows = !passes(pinned.side, pinned.index)
          ? "the " + $("filter").selectedOptions[0].textContent + " filter hides its lines"
          : pinned.side === "left" ? "the keys it attends to" : "the queries that attend to it";
        caption.textContent = (pinned.side === "left" ? "Query " : "Key ") + JSON.stringify(tokenLabel(t)) + " (" +
          (pinned.side === "left" ? position(pinned.index) : pinned.index) + ") is pinned: " + shows +
          ". Click it again or press Escape to let it go; arrow keys move it." + pair;
      }
      const queryPinned = pinned && pinned.side === "left" && container.id === "view-head" && S.data.neuron;
      neuronLink.hidden = !queryPinned;
      if (queryPinned) {
        neuronLink.textContent = "Neuron view of " + JSON.stringify(tokenLabel(S.data.tokens[pinned.index])) + " (" +
          pinned.index + "): its scores step by step (Enter)";
      }
      drawLines(ctx, layerOf(), heads, { x0: 4, x1: width - 4, y0: 0, step: ROW }, shown, minQ);
      for (const tok of view.querySelectorAll(".tok.hover, .tok.pinned")) {
        tok.classList.remove("hover", "pinned");
        tok.setAttribute("aria-selected", "false");
      }
      for (const column of [left, right]) column.removeAttribute("aria-activedescendant");
      if (shown) {
        const column = shown.side === "left" ? left : right;
        const tok = column.children[shown.index];
        tok.classList.add(pinned ? "pinned" : "hover");
        if (pinned) {
          tok.setAttribute("aria-selected", "true");
          column.setAttribute("aria-activedescendant", tok.id);
        }
      }
    };
    const pin = (next) => {
      pinned = next;
      keep.pin = next;
      draw();
      if (next) {
        const tok = (next.side === "left" ? left : right).children[next.index];
        tok.scrollIntoView({ block: "nearest" });
        // Not under the sticky controls.
        const nav = $("controls").getBoundingClientRect();
        const top = tok.getBoundingClientRect().top;
        if (getComputedStyle($("controls")).position === "sticky" && top < nav.bottom) window.scrollBy(0, top - nav.bottom - 4);
      }
    };
    view.addEventListener("mouseover", (event) => {
      const tok = event.target.closest(".tok");
      if (!tok || pinned) return;
      hover = { side: tok.dataset.side, index: Number(tok.dataset.index) };
      draw();
    });
    // Leaving the tokens (not only the view, which spans the page's width) ends the preview.
    view.addEventListener("mouseout", (event) => {
      if (!hover || (event.relatedTarget && event.relatedTarget.closest && event.relatedTarget.closest(".tok"))) return;
      hover = null;
      draw();
    });
    view.addEventListener("mouseleave", () => { if (hover) { hover = null; draw(); } });
    view.addEventListener("click", (event) => {
      const tok = event.target.closest(".tok");
      if (!tok) return;
      const next = { side: tok.dataset.side, index: Number(tok.dataset.index) };
      hover = null;
      pin(pinned && pinned.side === next.side && pinned.index === next.index ? null : next);
    });
    view.addEventListener("keydown", (event) => {
      const column = event.target.closest(".tokens");
      if (!column) return;
      const side = column.dataset.side;
      const at = pinned && pinned.side === side ? pinned.index : null;
      const n = count(side);
      const moves = { ArrowDown: at === null ? 0 : at + 1, ArrowUp: at === null ? n - 1 : at - 1,
        Home: 0, End: n - 1, PageDown: (at === null ? 0 : at) + 10, PageUp: (at === null ? 0 : at) - 10 };
      if (event.key in moves) {
        pin({ side, index: Math.max(0, Math.min(n - 1, moves[event.key])) });
      } else if (event.key === "Escape" && pinned) {
        pin(null);
      } else if (event.key === "Enter" && at !== null && !neuronLink.hidden) {
        neuronLink.click();
      } else if ((event.key === "Enter" || event.key === " ") && at === null) {
        pin({ side, index: 0 });
      } else {
        return;
      }
      event.preventDefault();
      event.stopPropagation();
    });
    draw();
    return { draw, pinned: () => pinned, neuronLink };
  }

  // What the head views keep between redraws: the main view's pinned token, the dialog's.
  const headKeep = { pin: null }, overlayKeep = { pin: null };

  function renderHead() {
    const enabled = () => S.heads.flatMap((on, h) => (on ? [h] : []));
    const head = buildHeadView($("view-head"), () => S.layer, enabled, headKeep);
    S.redraw = head.draw;
    // A pinned query token's step-by-step neuron view (first shown head); focus goes with it.
    head.neuronLink.addEventListener("click", async () => {
      $("neuron-query").value = String(head.pinned().index);
      $("neuron-head").value = String(enabled()[0] || 0);
      S.view = "neuron";
      await render();
      $("neuron-query").focus();
    });
  }

  // ---- model view: every layer and head as a thumbnail, click one to enlarge it ----
  async function renderModel(renderId) {
    const box = $("view-model");
    box.replaceChildren();
    const grid = el("div", "modelgrid");
    grid.style.gridTemplateColumns = "auto repeat(" + S.H + ", 82px)";
    grid.appendChild(el("span", "label", ""));
    for (let h = 0; h < S.H; h++) grid.appendChild(el("span", "label", "head " + h));
    box.appendChild(grid);
    const size = 80, pad = 4;
    for (let layer = 0; layer < S.L; layer++) {
      grid.appendChild(el("span", "label", "layer " + layer));
      for (let h = 0; h < S.H; h++) {
        const canvas = document.createElement("canvas");
        canvas.title = "Layer " + layer + ", head " + h + ": click to enlarge";
        canvas.dataset.layer = layer;
        canvas.dataset.head = h;
        canvas.setAttribute("role", "button");
        canvas.setAttribute("aria-label", "Layer " + layer + ", head " + h + ": enlarge");
        canvas.tabIndex = layer === 0 && h === 0 ? 0 : -1;
        const ctx = sizedCanvas(canvas, size, size);
        const n = Math.max(S.T, S.K);
        ctx.lineWidth = n > 128 ? 0.35 : 0.7;
        const minQ = lineFloor(layer, [h], 0.01, 3000).floor;
        drawLines(ctx, layer, [h], { x0: pad + 6, x1: size - pad - 6, y0: pad, step: (size - 2 * pad) / n }, null, minQ);
        grid.appendChild(canvas);
      }
      // Let the browser paint between layers; stop if a newer render started.
      await new Promise((resolve) => requestAnimationFrame(resolve));
      if (renderId !== S.renderId) return;
    }
    grid.addEventListener("click", (event) => {
      const canvas = event.target.closest("canvas");
      if (canvas) enlarge(Number(canvas.dataset.layer), Number(canvas.dataset.head), canvas);
    });
    // One thumbnail takes Tab; arrow keys move between them, Enter or Space enlarges one.
    grid.addEventListener("keydown", (event) => {
      const canvas = event.target.closest("canvas");
      if (!canvas) return;
      const layer = Number(canvas.dataset.layer), h = Number(canvas.dataset.head);
      const to = { ArrowRight: [layer, h + 1], ArrowLeft: [layer, h - 1], ArrowDown: [layer + 1, h], ArrowUp: [layer - 1, h],
        Home: [layer, 0], End: [layer, S.H - 1] }[event.key];
      if (to) {
        const next = grid.querySelector("canvas[data-layer='" + Math.max(0, Math.min(S.L - 1, to[0])) +
          "'][data-head='" + Math.max(0, Math.min(S.H - 1, to[1])) + "']");
        if (next) {
          canvas.tabIndex = -1;
          next.tabIndex = 0;
          next.focus();
        }
      } else if (event.key === "Enter" || event.key === " ") {
        enlarge(layer, h, canvas);
      } else {
        return;
      }
      event.preventDefault();
    });
  }

  // The enlarged head, a dialog: focus moves into it and back to `opener` when it closes;
  // arrow keys outside its token lists step to the next head (left/right) or layer (up/down).
  function enlarge(layer, head, opener) {
    if (!S.overlay) overlayKeep.pin = null;
    S.overlay = { layer, head };
    $("overlay-title").textContent = "Layer " + layer + ", head " + head;
    $("overlay").hidden = false;
    S.overlayRedraw = buildHeadView($("overlay-body"), () => layer, () => [head], overlayKeep).draw;
    if (opener || !$("overlay-box").contains(document.activeElement)) $("overlay-close").focus();
  }

  // Closes the dialog; focus goes to the thumbnail of the head it showed last, which then
  // takes the thumbnails' Tab stop.
  function closeOverlay() {
    $("overlay").hidden = true;
    $("overlay-body").replaceChildren();
    const shown = S.overlay;
    S.overlay = null;
    S.overlayRedraw = null;
    const thumb = shown && document.querySelector("#view-model canvas[data-layer='" + shown.layer + "'][data-head='" + shown.head + "']");
    if (thumb) {
      for (const c of document.querySelectorAll("#view-model canvas")) c.tabIndex = -1;
      thumb.tabIndex = 0;
      thumb.focus();
    }
  }

  // ---- heatmap: the weight matrix with token labels ----
  function renderHeatmap() {
    const select = $("heatmap-head");
    const choice = select.value === "" ? "mean" : select.value;
    const rows = [], cols = [];
    for (let i = 0; i < S.T; i++) {
      if (S.filter === "all" || S.data.tokens[i].segment === (S.filter[0] === "A" ? 0 : 1)) rows.push(i);
    }
    for (let j = 0; j < S.K; j++) {
      if (S.filter === "all" || S.keys[j].segment === (S.filter[1] === "A" ? 0 : 1)) cols.push(j);
    }
    // The matrix shown: one head or the mean of a layer's heads, the mean of every layer's
    // heads, or the rollout (each [T, T] entry as a weight).
    const { which, at } = heatmapMatrix(choice);
    $("heatmap-axes").textContent = "Rows: " + (S.data.queries || "query (attending)") + " · columns: " + (S.data.keys || "key (attended to)") + ".";
    const idle = "Point at a cell to read its " + (chosenMeasure() ? "share" : "weight") + " (" + which + ")" + (S.causal ? "; grey cells are masked: a causal model's query cannot see later keys." : ".");
    const values = new Float32Array(rows.length * cols.length);
    let max = 0;
    rows.forEach((i, r) => cols.forEach((j, c) => {
      const v = at(i, j);
      values[r * cols.length + c] = v;
      if (v > max) max = v;
    }));
    S.heatmap = { which, rows, cols, values, canvas: $("heatmap-canvas") };
    const n = Math.max(rows.length, cols.length);
    // Up to 128 tokens every cell gets at least 8 px so that its labels can be read; longer
    // inputs get 3 px cells without labels (the box scrolls; at 1 px a cell could not be
    // pointed at), and the readout names each cell.
    const cell = Math.max(n <= 128 ? 8 : 3, Math.min(24, Math.floor(720 / n)));
    const labels = cell >= 8;
    const font = Math.min(12, cell - 1) + "px ui-monospace, Menlo, Consolas, monospace";
    const canvas = $("heatmap-canvas");
    const probe = canvas.getContext("2d");
    probe.font = font;
    const labelWidth = (list, tokens) => (labels ? Math.ceil(Math.max(0, ...list.map((i) => probe.measureText(tokenLabel(tokens[i])).width))) + 8 : 4);
    const left = labelWidth(rows, S.data.tokens), top = labelWidth(cols, S.keys), barW = 60;
    const width = left + cols.length * cell + barW, height = top + rows.length * cell + 4;
    const ctx = sizedCanvas(canvas, width, height);
    ctx.font = font;
    const sqrt = $("heatmap-scale").value === "sqrt";
    const colour = (v) => {
      const linear = max > 0 ? v / max : 0;
      const t = sqrt ? Math.sqrt(linear) : linear; // white -> deep blue, like seaborn's "Blues"
      return [Math.round(247 - t * 239), Math.round(251 - t * 203), Math.round(255 - t * 148)];
    };
    // A causal model's masked cells (a query and a later key) are grey, not weight 0's colour.
    const masked = (r, c) => S.causal && cols[c] > position(rows[r]);
    const image = ctx.createImageData(cols.length, rows.length);
    values.forEach((v, k) => {
      const [r, g, b] = masked(Math.floor(k / cols.length), k % cols.length) ? [222, 222, 222] : colour(v);
      image.data.set([r, g, b, 255], 4 * k);
    });
    const bitmap = document.createElement("canvas");
    bitmap.width = cols.length;
    bitmap.height = rows.length;
    bitmap.getContext("2d").putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(bitmap, left, top, cols.length * cell, rows.length * cell);
    ctx.fillStyle = "#1d2330";
    if (labels) {
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      rows.forEach((i, r) => ctx.fillText(tokenLabel(S.data.tokens[i]), left - 4, top + (r + 0.5) * cell));
      ctx.save();
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      cols.forEach((j, c) => ctx.fillText(tokenLabel(S.keys[j]), -top + 4, left + (c + 0.5) * cell));
      ctx.restore();
    }
    // Colour bar from 0 to the largest weight shown.
    const barX = left + cols.length * cell + 14, barH = Math.max(40, rows.length * cell);
    for (let y = 0; y < barH; y++) {
      const [r, g, b] = colour(max * (1 - y / barH));
      ctx.fillStyle = "rgb(" + r + "," + g + "," + b + ")";
      ctx.fillRect(barX, top + y, 12, 1);
    }
    ctx.fillStyle = "#1d2330";
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillText(max.toFixed(3), barX + 15, top);
    ctx.textBaseline = "bottom";
    ctx.fillText("0", barX + 15, top + barH);
    const resting = max === 0 ? emptyReason() : idle;
    $("heatmap-readout").textContent = resting;
    // The row and column under the pointer, outlined on a canvas of their own.
    const cross = sizedCanvas($("heatmap-cross"), width, height);
    const outline = (r, c) => {
      cross.clearRect(0, 0, width, height);
      if (r === null) return;
      cross.strokeStyle = "rgba(230, 120, 20, 0.9)";
      cross.lineWidth = 1;
      cross.strokeRect(left + 0.5, top + r * cell + 0.5, cols.length * cell - 1, cell - 1);
      cross.strokeRect(left + c * cell + 0.5, top + 0.5, cell - 1, rows.length * cell - 1);
    };
    const show = (r, c) => {
      if (r === null || r < 0 || c < 0 || r >= rows.length || c >= cols.length) {
        outline(null);
        $("heatmap-readout").textContent = resting;
        return;
      }
      outline(r, c);
      const q = S.data.tokens[rows[r]], k = S.keys[cols[c]];
      $("heatmap-readout").textContent = which + ": query " + JSON.stringify(tokenLabel(q)) + " (" + position(rows[r]) + ") → key " +
        JSON.stringify(tokenLabel(k)) + " (" + cols[c] + "): " +
        (masked(r, c) ? "masked (a causal model's query cannot see later keys)" : values[r * cols.length + c].toFixed(3));
    };
    canvas.onmousemove = (event) => {
      const box = canvas.getBoundingClientRect();
      show(Math.floor((event.clientY - box.top - top) / cell), Math.floor((event.clientX - box.left - left) / cell));
    };
    canvas.onmouseleave = () => show(null);
    // The keyboard's cell: arrow keys move it (with Shift, 10 cells), Home/End go to the row's
    // ends, Escape leaves it; the readout says its weight.
    let cursor = null;
    canvas.tabIndex = 0;
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", "Heatmap of " + which + ", " + rows.length + " queries × " + cols.length +
      " keys: arrow keys read a cell's weight");
    canvas.onkeydown = (event) => {
      const n = event.shiftKey ? 10 : 1, [r, c] = cursor || [0, 0];
      const to = { ArrowDown: [r + n, c], ArrowUp: [r - n, c], ArrowRight: [r, c + n], ArrowLeft: [r, c - n],
        Home: [r, 0], End: [r, cols.length - 1], PageDown: [r + 10, c], PageUp: [r - 10, c] }[event.key];
      if (to) {
        // The first key shows the first cell (Home, End and the page keys go where they say).
        const first = !cursor && event.key.startsWith("Arrow");
        cursor = first ? [0, 0] : [Math.max(0, Math.min(rows.length - 1, to[0])), Math.max(0, Math.min(cols.length - 1, to[1]))];
        show(...cursor);
        // Keep the cell in view in the scrolling box.
        const box = $("heatmap-box");
        const x = left + cursor[1] * cell, y = top + cursor[0] * cell;
        if (x < box.scrollLeft || x + cell > box.scrollLeft + box.clientWidth) box.scrollLeft = x - box.clientWidth / 2;
        if (y < box.scrollTop || y + cell > box.scrollTop + box.clientHeight) box.scrollTop = y - box.clientHeight / 2;
      } else if (event.key === "Escape" && cursor) {
        cursor = null;
        show(null);
      } else {
        return;
      }
      event.preventDefault();
    };
    canvas.onblur = () => { cursor = null; show(null); };
  }

  // The measure the Method select picks, or null for raw weights.
  function chosenMeasure() {
    const name = $("heatmap-method").value;
    return name === "weights" ? null : S.measures.get(name) || null;
  }

  function heatmapMatrix(choice) {
    const measure = chosenMeasure();
    if (measure) {
      const layer = measure.layers > 1 ? Math.min(S.layer, measure.layers - 1) : 0;
      return { which: measure.label + (measure.layers > 1 ? ", layer " + layer : "") + "; each row as shares of its sum",
        at: (i, j) => measure.values[(layer * S.T + i) * S.T + j] / S.scale };
    }
    if (choice === "rollout") {
      return { which: "rollout through all " + S.L + " layers: heads averaged, 0.5·A + 0.5·I per layer",
        at: (i, j) => S.R[i * S.T + j] / S.scale };
    }
    if (choice === "all") {
      return { which: "all " + S.L + " layers × " + S.H + " heads averaged", at: (i, j) => S.A[i * S.K + j] / S.scale };
    }
    const heads = choice === "mean" ? [...Array(S.H).keys()] : [Number(choice)];
    const which = "layer " + S.layer + ", " + (choice === "mean" ? "mean of heads" : "head " + choice);
    const at = (i, j) => {
      let sum = 0;
      for (const h of heads) sum += weight(S.layer, h, i, j);
      return sum / heads.length;
    };
    return { which, at };
  }

  // The heatmap as shown, saved as a file: PNG (the canvas) or CSV (a header of keys, then a
  // row per query; each token is written "index:label" with the page's label, which also keeps
  // a spreadsheet from reading a token such as "=" or "+" as a formula). Names and titles say
  // the matrix and the A/B filter.
  function saveFile(blob, name) {
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = name;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }

  function heatmapFileName(ext) {
    const choice = $("heatmap-head").value, measure = chosenMeasure();
    const what = (S.kinds ? S.kind + "-" : "") + (measure ? $("heatmap-method").value + (measure.layers > 1 ? "-layer" + S.layer : "")
      : choice === "rollout" || choice === "all" ? choice
      : "layer" + S.layer + "-" + (choice === "mean" ? "mean" : "head" + choice));
    return "attnscope-" + what + (S.filter === "all" ? "" : "-" + S.filter) + "." + ext;
  }

  // What a saved heatmap shows, for its title: the matrix and the A/B filter.
  function heatmapTitle() {
    const filter = S.filter === "all" ? "" : " · " + S.filter[0] + " → " + S.filter[1];
    return S.data.model + (S.kinds ? " · " + S.data.label : "") + " · " + S.heatmap.which + filter;
  }

  function heatmapCsv() {
    const { rows, cols, values } = S.heatmap;
    const field = (tokens, i, at) => {
      const text = at + ":" + tokenLabel(tokens[i]);
      return /[",\r\n]/.test(text) ? '"' + text.replace(/"/g, '""') + '"' : text;
    };
    const lines = [["query\\key", ...cols.map((j) => field(S.keys, j, j))].join(",")];
    rows.forEach((i, r) => {
      const cells = [field(S.data.tokens, i, position(i))];
      for (let c = 0; c < cols.length; c++) cells.push(values[r * cols.length + c].toFixed(3));
      lines.push(cells.join(","));
    });
    return lines.join("\r\n") + "\r\n";
  }

  // ---- neuron view: q, each k, q·k, scaled, softmax for one query ----
  function strip(values, maxAbs, cell) {
    const canvas = document.createElement("canvas");
    const ctx = sizedCanvas(canvas, values.length * cell, 12);
    values.forEach((v, d) => {
      const t = maxAbs > 0 ? Math.min(1, Math.abs(v) / maxAbs) : 0; // orange > 0, blue < 0
      ctx.fillStyle = v >= 0 ? "rgba(230,120,20," + t + ")" : "rgba(40,90,200," + t + ")";
      ctx.fillRect(d * cell, 0, cell, 12);
    });
    return canvas;
  }

  async function renderNeuron() {
    const body = $("view-neuron").querySelector("#neuron-body");
    body.replaceChildren();
    if (S.kinds && S.source.rows) {
      body.appendChild(el("p", "muted", "The neuron view is not available on a page of chosen rows (--rows): it holds those " +
        "rows' weights alone, not the model's queries and keys. The head view, the model view and the heatmap show the rows."));
      return;
    }
    if (S.kinds) {
      body.appendChild(el("p", "muted", "The neuron view is not available for an encoder-decoder model: attnscope does not " +
        "take out its queries and keys. Its encoder, decoder and cross-attention are in the head view, the model view and the heatmap."));
      return;
    }
    if (!S.data.neuron) {
      body.appendChild(el("p", "muted", "This data has no queries and keys, so the neuron view is not available."));
      return;
    }
    let qk = S.neuron.get(S.layer);
    if (!qk) {
      if (mode === "app") {
        body.appendChild(el("p", "muted", "Loading queries and keys of layer " + S.layer + "…"));
        // A submitted text still loading draws this view again when it comes, and asks for the
        // layer then; asking now, for the old text, would supersede it.
        if (!$("input-submit").disabled) await request(S.data.text, S.data.pair, S.layer, null);
        return;
      }
      body.appendChild(el("p", "muted", "Queries and keys of layer " + S.layer + " are not in this file (it holds " +
        (S.neuronLayers.length === 1 ? "layer " : "layers ") + S.neuronLayers.join(", ") + "). Write the file with --neuron-layer " + S.layer + " to see them."));
      return;
    }
    const n = S.data.neuron, d = n.head_dim, T = S.T;
    const head = Number($("neuron-head").value || 0), i = Number($("neuron-query").value || 0);
    const base = head * T * d;
    const q = qk.q.subarray(base + i * d, base + (i + 1) * d);
    const rows = [];
    let maxAbs = 0, maxProd = 0;
    for (const v of q) maxAbs = Math.max(maxAbs, Math.abs(v));
    for (let j = 0; j < T; j++) {
      const k = qk.k.subarray(base + j * d, base + (j + 1) * d);
      const prod = Array.from(k, (v, x) => v * q[x]);
      let dot = 0;
      for (const p of prod) { dot += p; maxProd = Math.max(maxProd, Math.abs(p)); }
      for (const v of k) maxAbs = Math.max(maxAbs, Math.abs(v));
      rows.push({ j, k, prod, dot, score: dot * n.scale, visible: !n.causal || j <= i });
    }
    // Softmax over the visible keys, shifted by the largest score.
    const top = Math.max(...rows.filter((r) => r.visible).map((r) => r.score));
    let total = 0;
    for (const r of rows) { r.e = r.visible ? Math.exp(r.score - top) : 0; total += r.e; }
    const cell = Math.max(2, Math.min(8, Math.floor(256 / d)));
    const t = S.data.tokens[i];
    const intro = el("p", "", "");
    intro.append(el("span", "", "Query "), el("strong", "", JSON.stringify(tokenLabel(t))),
      el("span", "", " (token " + i + "), layer " + S.layer + ", head " + head + ": "),
      el("span", "formula", "score = (q · k) × " + n.scale.toPrecision(4) + ",  weight = softmax(score)" +
        (n.causal ? " over keys up to the query" : "")));
    const legend = el("p", "muted", "Each strip is one vector, a cell per dimension: orange positive, blue negative, " +
      "darker for larger magnitude. q ∘ k multiplies them dimension by dimension; q · k is its sum.");
    body.append(intro, legend);
    const table = el("table", "neuron");
    table.appendChild(el("caption", "muted", "How query " + JSON.stringify(tokenLabel(t)) + " (" + i + ") scores every key, layer " +
      S.layer + ", head " + head));
    const header = el("tr");
    for (const name of ["key", "k", "q ∘ k", "q · k", "× scale", "softmax", "model", "weight"]) {
      const th = el("th", "", name);
      th.scope = "col";
      header.appendChild(th);
    }
    table.appendChild(header);
    const qRow = el("tr", "query");
    const qCell = el("td");
    qCell.appendChild(strip(q, maxAbs, cell));
    qRow.append(el("td", "token", "q of " + tokenLabel(t)), qCell);
    table.appendChild(qRow);
    for (const r of rows) {
      const tr = el("tr", r.j === i ? "key self" : "key");
      const w = total > 0 ? r.e / total : 0;
      tr.appendChild(el("td", "token", tokenLabel(S.data.tokens[r.j])));
      for (const [values, scale] of [[r.k, maxAbs], [r.prod, maxProd]]) {
        const td = el("td");
        td.appendChild(strip(values, scale, cell));
        tr.appendChild(td);
      }
      if (r.visible) {
        for (const text of [r.dot.toFixed(3), r.score.toFixed(3), w.toFixed(3)]) tr.appendChild(el("td", "", text));
      } else {
        tr.appendChild(el("td", "masked", "masked"));
        tr.appendChild(el("td", "masked", "−∞"));
        tr.appendChild(el("td", "masked", "0.000"));
      }
      tr.appendChild(el("td", "", weight(S.layer, head, i, r.j).toFixed(3)));
      const barCell = el("td");
      const bar = el("span", "bar");
      bar.style.width = Math.round(w * 120) + "px";
      bar.setAttribute("role", "img");
      bar.setAttribute("aria-label", "weight " + w.toFixed(3));
      barCell.appendChild(bar);
      tr.appendChild(barCell);
      table.appendChild(tr);
    }
    body.appendChild(table);
    body.appendChild(el("p", "muted", "softmax: from the queries and keys (stored as half floats); model: the model's own weight, to 3 decimals."));
  }

  // ---- controls ----
  function fillSelect(select, options, value) {
    select.replaceChildren();
    for (const [v, text] of options) {
      const option = el("option", "", text);
      option.value = v;
      select.appendChild(option);
    }
    select.value = String(value);
  }

  function buildControls() {
    $("controls").hidden = false;
    const clip = (text) => JSON.stringify(text.length > 300 ? text.slice(0, 300) + "…" : text);
    const summary = S.kinds && S.source.rows
      ? S.data.model + " · " + S.T + " of " + S.K + " tokens as queries, each over every token · " + S.L + " layers × " +
        S.H + " heads · " + clip(S.data.text) + (S.data.pair !== null ? " + " + clip(S.data.pair) : "")
      : S.kinds
      ? S.data.model + " (encoder-decoder) · " + S.data.label + ": " + S.T + " queries × " + S.K + " keys · " + S.L + " layers × " +
        S.H + " heads · source " + clip(S.data.text) + " → target " + clip(S.data.target)
      : S.data.model + " · " + S.T + " tokens · " + S.L + " layers × " + S.H + " heads · " +
        clip(S.data.text) + (S.data.pair !== null ? " + " + clip(S.data.pair) : "");
    $("summary").textContent = summary;
    $("kind-control").hidden = !manyKinds();
    $("kind-about").hidden = !S.kinds;
    if (S.kinds) {
      fillSelect($("kind"), S.source.kinds.map((k) => [k.name, k.label]), S.kind);
      $("kind-about").textContent = S.data.about;
    }
    // Weights stored as 0 (under a page file's floor, or under 0.0005, which 3 decimals round
    // to 0) hide this much of a row's attention: said when it is at least half a percent.
    const floor = S.data.weight_floor, rounded = S.data.zero_hidden_max >= 0.005;
    $("notice").hidden = !floor && !rounded;
    const hidden = (x) => (100 * x).toFixed(x < 0.1 ? 1 : 0) + "%";
    const share = " (" + hidden(S.data.zero_hidden_mean) + " of a row's attention on average, " +
      hidden(S.data.zero_hidden_max) + " at most)";
    $("notice").textContent = floor ? "To keep this page small, weights below " + (floor / S.scale).toFixed(3) +
      " are stored as 0" + share + "; every larger weight is exact to 3 decimals. " +
      "`attnscope serve` shows every weight to 3 decimals."
      : rounded ? "Weights are shown to 3 decimals: those under 0.0005 show as 0" + share + "." : "";
    document.title = "attnscope: " + S.data.text.slice(0, 60);
    fillSelect($("layer"), [...Array(S.L).keys()].map((l) => [l, String(l)]), S.layer);
    $("filter").value = S.filter;
    const keepMethod = $("heatmap-method").value || "weights";
    fillSelect($("heatmap-method"), [["weights", "attention weights"], ...[...S.measures].map(([name, m]) => [name, m.label])],
      S.measures.has(keepMethod) ? keepMethod : "weights");
    $("heatmap-method-control").hidden = S.measures.size === 0;
    const keepHead = $("heatmap-head").value || "mean";
    const named = ["mean", "all", "rollout"];
    // Rollout multiplies a layer's [T, T] matrices: cross-attention's [T, K] has none.
    const rolls = S.R ? [["rollout", "rollout (all layers)"]] : [];
    fillSelect($("heatmap-head"), [["mean", "mean of heads"], ...[...Array(S.H).keys()].map((h) => [h, String(h)]),
      ["all", "all layers, heads averaged"], ...rolls],
      Number(keepHead) < S.H || named.includes(keepHead) && (keepHead !== "rollout" || S.R) ? keepHead : "mean");
    fillSelect($("neuron-head"), [...Array(S.H).keys()].map((h) => [h, String(h)]), Math.min(Number($("neuron-head").value || 0), S.H - 1));
    fillSelect($("neuron-query"), S.data.tokens.map((t, i) => [i, i + ": " + tokenLabel(t)]), Math.min(Number($("neuron-query").value || 0), S.T - 1));
    const toggles = $("head-toggles");
    toggles.setAttribute("role", "group");
    toggles.setAttribute("aria-label", "Heads shown");
    toggles.replaceChildren(el("span", "muted", "Heads"));
    // After the buttons are rebuilt, focus goes back to the one that was pressed.
    const press = (index, change) => {
      change();
      buildControls();
      render();
      toggles.children[index].focus();
    };
    for (let h = 0; h < S.H; h++) {
      const button = el("button", S.heads[h] ? "" : "off", String(h));
      button.type = "button";
      button.style.background = headColour(h);
      button.style.color = textOn(headColour(h));
      button.title = "Show or hide head " + h + " (double-click or Shift+click: only this head)";
      button.setAttribute("aria-label", "Head " + h);
      button.setAttribute("aria-pressed", String(S.heads[h]));
      const only = () => { S.heads = S.heads.map((_, k) => k === h); };
      button.addEventListener("click", (event) => press(h + 1, event.shiftKey ? only : () => { S.heads[h] = !S.heads[h]; }));
      button.addEventListener("dblclick", () => press(h + 1, only));
      toggles.appendChild(button);
    }
    for (const [name, on] of [["all", true], ["none", false]]) {
      const button = el("button", "all", name);
      button.type = "button";
      button.title = (on ? "Show" : "Hide") + " every head";
      const index = toggles.children.length;
      button.addEventListener("click", () => press(index, () => S.heads.fill(on)));
      toggles.appendChild(button);
    }
    toggles.hidden = S.view !== "head";
  }

  async function render() {
    const renderId = ++S.renderId;
    const started = performance.now();
    setState("rendering");
    for (const button of document.querySelectorAll("#tabs button")) {
      const active = button.dataset.view === S.view;
      button.classList.toggle("active", active);
      button.setAttribute("aria-selected", String(active));
      button.tabIndex = active ? 0 : -1;
    }
    for (const name of ["head", "model", "heatmap", "neuron"]) $("view-" + name).hidden = name !== S.view;
    // The neuron view shows one query against every key: the A/B filter does not apply there.
    $("filter-control").hidden = S.view === "neuron" || !hasPair();
    // The neuron view is not available for an encoder-decoder model, whatever its kind, nor
    // for chosen rows.
    $("kind-control").hidden = !manyKinds() || S.view === "neuron";
    $("kind-about").hidden = !S.kinds || S.view === "neuron";
    $("head-toggles").hidden = S.view !== "head";
    // The model view shows every layer at once, and so do the heatmap's all-layer matrices;
    // a measure has no heads, and one rolled out no layers.
    const measure = chosenMeasure();
    $("heatmap-head-control").hidden = measure !== null;
    // An encoder-decoder model's neuron view only says why it is not there.
    $("view-neuron").querySelector(".row").hidden = !!S.kinds;
    $("layer-control").hidden = S.view === "model" || (S.view === "neuron" && !!S.kinds) || (S.view === "heatmap" &&
      (measure ? measure.layers === 1 : ["all", "rollout"].includes($("heatmap-head").value)));
    try {
      if (S.view === "head") renderHead();
      else if (S.view === "model") await renderModel(renderId);
      else if (S.view === "heatmap") renderHeatmap();
      else await renderNeuron();
    } catch (error) {
      showError("Could not draw the " + S.view + " view: " + error.message);
      return;
    }
    if (renderId === S.renderId && document.body.dataset.state !== "error") {
      document.body.dataset.renderMs = Math.round(performance.now() - started);
      saveState();
      setState("ready");
    }
  }

  function wireControls() {
    for (const button of document.querySelectorAll("#tabs button")) {
      button.addEventListener("click", () => { S.view = button.dataset.view; if (S.data) render(); });
    }
    $("layer").addEventListener("change", () => { S.layer = Number($("layer").value); render(); });
    $("filter").addEventListener("change", () => { S.filter = $("filter").value; render(); });
    $("kind").addEventListener("change", () => { applyKind($("kind").value); buildControls(); render(); });
    for (const id of ["heatmap-method", "heatmap-head", "heatmap-scale", "neuron-head", "neuron-query"]) $(id).addEventListener("change", () => render());
    $("heatmap-png").addEventListener("click", () => {
      // The canvas under a title that says what it shows.
      const { canvas } = S.heatmap, title = heatmapTitle();
      const page = document.createElement("canvas"), font = "13px system-ui, sans-serif";
      const probe = page.getContext("2d");
      probe.font = font;
      // The heatmap's size in CSS pixels (`sizedCanvas` scales its bitmap by the pixel ratio).
      const dpr = window.devicePixelRatio || 1, w = canvas.width / dpr, h = canvas.height / dpr;
      const width = Math.max(w, probe.measureText(title).width + 16), height = h + 28;
      const ctx = sizedCanvas(page, width, height);
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, width, height);
      ctx.fillStyle = "#1d2330";
      ctx.font = font;
      ctx.textBaseline = "middle";
      ctx.fillText(title, 8, 14);
      ctx.drawImage(canvas, 0, 28, w, h);
      page.toBlob((blob) => saveFile(blob, heatmapFileName("png")), "image/png");
    });
    $("heatmap-csv").addEventListener("click", () => {
      saveFile(new Blob([heatmapCsv()], { type: "text/csv" }), heatmapFileName("csv"));
    });
    $("overlay-close").addEventListener("click", closeOverlay);
    $("overlay").addEventListener("click", (event) => { if (event.target === $("overlay")) closeOverlay(); });
    document.addEventListener("keydown", (event) => {
      if ($("overlay").hidden) return;
      if (event.key === "Escape") {
        closeOverlay();
        return;
      }
      // Tab stays inside the dialog.
      if (event.key === "Tab") {
        const stops = [$("overlay-close"), ...$("overlay-body").querySelectorAll(".tokens")];
        const at = stops.indexOf(document.activeElement);
        const next = event.shiftKey ? (at <= 0 ? stops.length - 1 : at - 1) : (at + 1) % stops.length;
        stops[next].focus();
        event.preventDefault();
        return;
      }
      const { layer, head } = S.overlay;
      const to = { ArrowRight: [layer, head + 1], ArrowLeft: [layer, head - 1], ArrowDown: [layer + 1, head], ArrowUp: [layer - 1, head] }[event.key];
      if (to && !event.target.closest(".tokens") && to[0] >= 0 && to[0] < S.L && to[1] >= 0 && to[1] < S.H) {
        enlarge(to[0], to[1]);
        event.preventDefault();
      }
    });
    // A narrower or wider window (or a phone's address bar sliding away) redraws the head
    // views' lines to fit; pins and focus stay.
    let resizing = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => {
        if (S.data && S.view === "head" && S.redraw) S.redraw();
        if (S.overlayRedraw) S.overlayRedraw();
      }, 150);
    });
    // A link with another #fragment opened in this tab shows what it names, and what it does
    // not name as a new tab would show it (every head, no filter).
    window.addEventListener("hashchange", () => {
      if (!S.data) return;
      Object.assign(S, defaults(S.data));
      restoreState();
      buildControls();
      restoreSelects();
      render();
    });
    // Tabs: arrow keys move between them (the WAI-ARIA tabs pattern).
    $("tabs").addEventListener("keydown", (event) => {
      const tabs = [...document.querySelectorAll("#tabs button")];
      const at = tabs.indexOf(document.activeElement);
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (at < 0 || !step) return;
      const next = tabs[(at + step + tabs.length) % tabs.length];
      next.focus();
      next.click();
      event.preventDefault();
    });
  }

  // ---- app mode: ask the server ----
  let latestRequest = 0;

  // The app's model reads a source and a target (an encoder-decoder model), not a text and a
  // pair: the page's data element says so.
  let seq2seqApp = false;

  async function request(text, pair, neuronLayer, target) {
    const id = ++latestRequest;
    clearError();
    setState("loading");
    $("input-submit").disabled = true;
    try {
      const response = await fetch("/api/attention", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(seq2seqApp ? { text, target: target || null } : { text, pair: pair || null, neuron_layer: neuronLayer }),
      });
      const body = await response.text();
      // A newer request was sent meanwhile: its answer, not this one, is what is asked for.
      if (id !== latestRequest) return;
      let json = null;
      try { json = JSON.parse(body); } catch (_) { json = null; }
      if (!response.ok) {
        showError(json && json.error ? json.error : "The server answered " + response.status + ": " + body.slice(0, 300));
        return;
      }
      await load(json);
      // The address names what is shown, to bookmark or share: only a text that loaded.
      const query = new URLSearchParams({ text });
      if (pair) query.set("pair", pair);
      if (target) query.set("target", target);
      history.replaceState(null, "", "?" + query.toString() + location.hash);
    } catch (error) {
      if (id === latestRequest) showError("Could not get attention from the server: " + error.message + " (is `attnscope serve` still running?)");
    } finally {
      if (id === latestRequest) $("input-submit").disabled = false;
    }
  }

  async function start() {
    wireControls();
    const params = new URLSearchParams(location.search);
    if (mode === "app") {
      const app = JSON.parse($("attnscope-data").textContent);
      seq2seqApp = !!(app && app.seq2seq);
      $("input-pair-control").hidden = seq2seqApp;
      $("input-target-control").hidden = !seq2seqApp;
      const form = $("input-form");
      form.hidden = false;
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        request($("input-text").value, seq2seqApp ? "" : $("input-pair").value, S.data ? S.layer : null,
          seq2seqApp ? $("input-target").value : "");
      });
      form.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !$("input-submit").disabled) form.requestSubmit();
      });
      if (params.has("text")) {
        $("input-text").value = params.get("text");
        $("input-pair").value = params.get("pair") || "";
        $("input-target").value = params.get("target") || "";
        await request(params.get("text"), seq2seqApp ? null : params.get("pair"), null, seq2seqApp ? params.get("target") : null);
      } else if (seq2seqApp) {
        $("input-text").placeholder = "I love machine learning.";
        $("summary").textContent = "Type a source text (and, optionally, its translation as the target; empty, the target is " +
          "the model's own translation), then Show attention: the Attention select picks the encoder's, the decoder's or the " +
          "cross-attention, which the head view, the model view and the heatmap draw.";
        setState("idle");
      } else {
        $("input-text").placeholder = "The cat sat on the mat because it was tired.";
        $("summary").textContent = "Type a text (and, to see attention across two texts, a pair), then Show attention: " +
          "the head view draws each query's attention to every key, the model view every layer and head, " +
          "the heatmap one matrix, and the neuron view how q and k make one weight.";
        setState("idle");
      }
      return;
    }
    try {
      await load(JSON.parse($("attnscope-data").textContent));
    } catch (error) {
      showError("Could not read this page's data: " + error.message);
    }
  }

  start();
})();
