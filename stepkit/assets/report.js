// stepkit report: draws the page from the JSON block #stepkit-data (see stepkit/stages/report.py).
// Every string from the data goes into the page as a text node (textContent), never as markup.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("stepkit-data").textContent);
  const LABS = D.labellers;
  const SVGNS = "http://www.w3.org/2000/svg";

  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = String(v);
      else if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
      else e.setAttribute(k, String(v));
    }
    for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function s(tag, attrs, ...kids) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = String(v); else e.setAttribute(k, String(v));
    }
    for (const k of kids.flat()) if (k) e.append(k);
    return e;
  }
  const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : Number.isInteger(x) ? String(x) : x.toFixed(d));
  const feText = (f) => (f === null || f === undefined ? "–" : f === -1 ? "none" : String(f));
  function hue(v, sc) {  // red (low) to green (high) over the column's range
    const t = Math.max(0, Math.min(1, (v - sc[1]) / (sc[2] - sc[1] || 1)));
    return "hsl(" + Math.round(t * 120) + ", 65%, 82%)";
  }

  // ---------------------------------------------------------------------------------------- header
  function header() {
    const top = document.getElementById("top");
    const ins = D.inputs.map((x) => x.path + " (" + x.rows + " rows)").join(", ");
    const sample = D.sampled
      ? "This page carries a random sample of " + D.carried + " of " + D.total_rows + " rows (seed " + D.seed +
        "; stepkit report --all carries every row). The summary figures cover all " + D.total_rows + " rows."
      : "This page carries all " + D.total_rows + " rows.";
    top.append(h("h1", { text: D.title }),
      h("div", { class: "note", text: "stepkit " + D.stepkit_version + " report, " + D.created + ", from " + ins }),
      h("div", { class: "sample", id: "sample-note", "data-sampled": D.sampled ? "1" : "0", text: sample }));
  }

  // ---------------------------------------------------------------------------------------- summary
  function bars(items, width = 320, height = 110) {  // items: [label, count, colour]
    const max = Math.max(1, ...items.map((x) => x[1]));
    const bw = Math.max(4, Math.min(36, (width - 30) / Math.max(1, items.length) - 3));
    const svg = s("svg", { width: 30 + items.length * (bw + 3), height: height + 28, role: "img" });
    items.forEach(([label, n, colour], i) => {
      const bh = Math.round((height * n) / max), x = 26 + i * (bw + 3);
      svg.append(s("rect", { x, y: height - bh + 12, width: bw, height: bh, fill: colour },
        s("title", { text: label + ": " + n + " rows" })));
      svg.append(s("text", { x: x + bw / 2, y: height + 24, "text-anchor": "middle", text: label }));
      if (n) svg.append(s("text", { x: x + bw / 2, y: height - bh + 10, "text-anchor": "middle", text: n }));
    });
    return svg;
  }
  function lines(series, sc, width = 340, height = 120) {  // series: [name, [[pos, mean, n]]]
    const maxPos = Math.max(1, ...series.flatMap(([, pts]) => pts.map((p) => p[0])));
    const X = (p) => 34 + (p * (width - 44)) / maxPos;
    const Y = (v) => 8 + height - ((Math.max(sc[1], Math.min(sc[2], v)) - sc[1]) * height) / (sc[2] - sc[1] || 1);
    const svg = s("svg", { width, height: height + 30, role: "img" });
    svg.append(s("line", { x1: 34, x2: width - 8, y1: Y(sc[1]), y2: Y(sc[1]), stroke: "#999" }));
    svg.append(s("text", { x: 30, y: Y(sc[2]) + 4, "text-anchor": "end", text: fmt(sc[2], 2) }));
    svg.append(s("text", { x: 30, y: Y(sc[1]) + 4, "text-anchor": "end", text: fmt(sc[1], 2) }));
    svg.append(s("text", { x: width / 2, y: height + 28, "text-anchor": "middle", text: "step position (0-based)" }));
    const colours = ["#2a6fdb", "#d9534f", "#3a9d5d", "#a05cc8", "#c8881e"];
    series.forEach(([name, pts], k) => {
      const c = colours[k % colours.length];
      svg.append(s("polyline", { fill: "none", stroke: c, "stroke-width": 2,
        points: pts.map((p) => X(p[0]) + "," + Y(p[1])).join(" ") }));
      for (const p of pts) svg.append(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: c },
        s("title", { text: name + " step " + p[0] + ": mean " + fmt(p[1]) + " over " + p[2] + " rows" })));
    });
    return svg;
  }
  function summary() {
    const sec = document.getElementById("summary");
    const o = D.outcomes;
    sec.append(h("h2", { text: "Summary" }), h("p", { text: D.total_rows + " rows" +
      (o.correct !== undefined ? "; outcome correct " + o.correct + ", incorrect " + o.incorrect + ", ungraded " + o.ungraded : "") +
      "; rows with an error " + D.errors + (Object.keys(D.filter_reasons).length
        ? "; filter: " + Object.entries(D.filter_reasons).map(([k, v]) => k + " " + v).join(", ") : "") + "." }));
    const cards = h("div", { class: "cards" });
    if (!LABS.length) cards.append(h("p", { text: "No labeller's columns in this input (no declared step labels)." }));
    for (const lab of LABS) {
      const S = D.summary[lab.key];
      const t = h("table", { class: "figs" });
      t.append(h("tr", {}, h("td", { text: "rows with labels" }), h("td", { class: "num", text: S.rows })));
      for (const [k, v] of Object.entries(S.statuses))
        t.append(h("tr", {}, h("td", { text: lab.status + " = " + k + (lab.no_labels.includes(k) ? " (no labels)" : "") }),
          h("td", { class: "num", text: v })));
      for (const [c, b] of Object.entries(S.balance)) {
        const all = b.true + b.false;
        t.append(h("tr", {}, h("td", { text: c + ": steps true / false / null" }),
          h("td", { class: "num", text: b.true + " / " + b.false + " / " + b.null +
            (all ? " (" + Math.round((100 * b.true) / all) + "% true)" : "") })));
      }
      const card = h("div", { class: "card", "data-labeller": lab.key }, h("h3", { text: lab.title }), t);
      const fe = Object.entries(S.first_error);
      if (fe.length) {
        card.append(h("div", { class: "legend", text: "first error (" + (lab.first_error || lab.labels[0] + ", first false") + "); none: every step correct" }),
          bars(fe.map(([k, n]) => [k === "-1" ? "none" : k, n, k === "-1" ? "#3a9d5d" : "#d9534f"])));
      }
      const series = Object.entries(S.by_position);
      if (series.length) {
        const groups = {};
        for (const [c, pts] of series) (groups[lab.scales[c].join()] = groups[lab.scales[c].join()] || []).push([c, pts]);
        for (const g of Object.values(groups)) {
          const sc = lab.scales[g[0][0]];
          card.append(h("div", { class: "legend", text: "mean by step position: " + g.map((x) => x[0]).join(", ") + " (" + sc[0] + ")" }),
            lines(g, sc));
        }
      }
      cards.append(card);
    }
    sec.append(cards);
  }

  // ---------------------------------------------------------------------------------------- filters
  const state = { q: "", outcome: "", status: "", a: "", b: "", mode: "", split: "", reason: "", page: 0, selected: null };
  let haystack = null;
  function matches(r) {
    if (state.outcome) {
      const oc = r.oc === true ? "correct" : r.oc === false ? "incorrect" : "ungraded";
      if (oc !== state.outcome) return false;
    }
    if (state.status) {
      if (state.status === "@error") { if (!r.err) return false; }
      else { const [k, v] = JSON.parse(state.status); if (String(r.st[k]) !== v) return false; }
    }
    if (state.reason) {
      const why = r.fr === null || r.fr === undefined ? "kept" : r.fr;
      if (why !== state.reason) return false;
    }
    if (state.split) {  // the distinct first errors of the labellers that label the row
      const seen = new Set(Object.values(r.fe).filter((x) => x !== null && x !== undefined));
      if (state.split === "some" ? seen.size < 2 : seen.size !== 1) return false;
    }
    if (state.mode && state.a && state.b) {
      const fa = r.fe[state.a], fb = r.fe[state.b];
      if (fa === null || fb === null || fa === undefined || fb === undefined) return false;
      if (state.mode === "ne" ? fa === fb : fa !== fb) return false;
    }
    if (state.q) {
      if (!haystack) haystack = new Map();
      let text = haystack.get(r);
      if (text === undefined) {
        text = [r.id, r.pid, r.prompt, ...r.steps].join("\n").toLowerCase();
        haystack.set(r, text);
      }
      if (!text.includes(state.q)) return false;
    }
    return true;
  }
  function select(id, label, options, key) {
    const el = h("select", { id, "aria-label": label, on: { change: (e) => { state[key] = e.target.value; state.page = 0; refresh(); } } },
      options.map(([v, t]) => h("option", { value: v, text: t })));
    return h("label", {}, label + " ", el);
  }
  function controls(sec) {
    const statusOpts = [["", "any"]];
    for (const lab of LABS) if (lab.status)
      for (const k of Object.keys(D.summary[lab.key].statuses)) if (k !== "null") statusOpts.push([JSON.stringify([lab.key, k]), lab.status + " = " + k]);
    if (D.errors) statusOpts.push(["@error", "row has an error"]);
    const withFe = LABS.filter((l) => l.first_error || l.labels.length);
    const labOpts = [["", "–"], ...withFe.map((l) => [l.key, l.title])];
    let timer = null;
    const q = h("input", { type: "search", id: "search", placeholder: "id or text", "aria-label": "search",
      on: { input: (e) => {
        clearTimeout(timer);
        document.body.dataset.pending = "1";  // (a search waits for the typing to pause)
        timer = setTimeout(() => { state.q = e.target.value.trim().toLowerCase(); state.page = 0; refresh(); }, 120);
      } } });
    const box = h("div", { class: "controls" }, h("label", {}, "search ", q),
      select("outcome", "outcome", [["", "any"], ["correct", "correct"], ["incorrect", "incorrect"], ["ungraded", "ungraded"]], "outcome"),
      select("status", "status", statusOpts, "status"));
    if (withFe.length >= 2)
      box.append(h("span", {}, "first error of ", select("dis-a", "labeller A", labOpts, "a"),
        select("dis-mode", "", [["", "(off)"], ["ne", "≠"], ["eq", "="]], "mode"), select("dis-b", "labeller B", labOpts, "b")),
        select("split", "all first errors", [["", "any"], ["some", "some labellers disagree"], ["none", "all labellers agree"]], "split"));
    if (Object.keys(D.filter_reasons).length)
      box.append(select("reason", "filter", [["", "any"], ...Object.keys(D.filter_reasons).map((k) => [k, k])], "reason"));
    box.append(h("span", { id: "count", "data-count": "0" }));
    sec.append(box);
  }
  function rowsSection() {
    const sec = document.getElementById("rows");
    sec.append(h("h2", { text: "Rows" }));
    controls(sec);
    const head = h("tr", {}, h("th", { text: "id" }), h("th", { text: "outcome" }), h("th", { text: "steps", class: "num" }),
      h("th", { text: "status" }), h("th", { text: "first error" }), h("th", { text: "filter" }));
    sec.append(h("table", { id: "rows-table" }, h("thead", {}, head), h("tbody", {})));
    sec.append(h("div", { class: "pager" },
      h("button", { id: "prev", text: "◀ previous", on: { click: () => { state.page--; refresh(); } } }),
      h("span", { id: "page" }),
      h("button", { id: "next", text: "next ▶", on: { click: () => { state.page++; refresh(); } } })));
  }
  function outcomeTag(oc) {
    return oc === true ? h("span", { class: "tag ok", text: "correct" }) : oc === false
      ? h("span", { class: "tag bad", text: "incorrect" }) : h("span", { class: "tag dim", text: "ungraded" });
  }
  function statusTags(r) {
    const out = [];
    for (const lab of LABS) if (lab.status && r.st[lab.key] !== null && r.st[lab.key] !== undefined)
      out.push(h("span", { class: "tag" + (lab.no_labels.includes(r.st[lab.key]) ? " dim" : ""), text: lab.key + " " + r.st[lab.key] }));
    if (r.err) out.push(h("span", { class: "tag bad", text: "error" }));
    return out;
  }
  function feTags(r) {
    return LABS.filter((l) => l.key in r.fe).map((l) => h("span", { class: "tag", text: l.key + " " + feText(r.fe[l.key]) }));
  }
  let visible = [];
  function refresh() {
    visible = D.rows.filter(matches);
    delete document.body.dataset.pending;
    const size = D.page_size, pages = Math.max(1, Math.ceil(visible.length / size));
    state.page = Math.max(0, Math.min(state.page, pages - 1));
    const count = document.getElementById("count");
    count.dataset.count = String(visible.length);
    count.textContent = visible.length + " of " + D.rows.length + " rows match";
    const body = document.querySelector("#rows-table tbody");
    const trs = visible.slice(state.page * size, (state.page + 1) * size).map((r) =>
      h("tr", { "data-id": r.id, tabindex: 0, class: r === state.selected ? "selected" : null,
        on: { click: () => showRow(r), keydown: (e) => { if (e.key === "Enter") showRow(r); } } },
        h("td", { text: r.id }), h("td", {}, outcomeTag(r.oc)), h("td", { class: "num", text: r.steps.length }),
        h("td", {}, statusTags(r)), h("td", {}, feTags(r)), h("td", { text: r.fr || "" })));
    body.replaceChildren(...trs);
    document.getElementById("page").textContent = "page " + (state.page + 1) + " of " + pages;
    document.getElementById("prev").disabled = state.page === 0;
    document.getElementById("next").disabled = state.page >= pages - 1;
  }

  // ---------------------------------------------------------------------------------------- one row
  const TEX = [{ left: "$$", right: "$$", display: true }, { left: "\\[", right: "\\]", display: true },
    { left: "\\(", right: "\\)", display: false }, { left: "$", right: "$", display: false }];
  let typeset = Boolean(D.typeset && window.renderMathInElement);
  function tex(el) {  // KaTeX (inlined by --typeset) renders the TeX of a text node; trust: false (no links, no HTML)
    if (typeset) window.renderMathInElement(el, { delimiters: TEX, throwOnError: false, trust: false });
    return el;
  }
  function labelled(lab, r) {
    return !(lab.status && lab.no_labels.includes(r.st[lab.key]));
  }
  function cellsFor(r, k) {  // [th text, td] for step k, every labeller
    const out = [];
    for (const lab of LABS) {
      const has = labelled(lab, r), fe = r.fe[lab.key];
      const cols = [...lab.labels, ...lab.values].filter((c) => r.c[c]);
      if (!cols.length && lab.first_error) {  // a first error only (ProcessBench's human label)
        let td;
        if (fe === null || fe === undefined) td = h("td", { class: "cell dim", text: "–" });
        else if (fe === -1 || k < fe) td = h("td", { class: "cell ok", text: "✓" });
        else if (k === fe) td = h("td", { class: "cell bad first", text: "✗ first error" });
        else td = h("td", { class: "cell dim", text: "(after)" });
        td.dataset.col = lab.first_error;
        out.push([lab.first_error, td]);
      }
      for (const c of cols) {
        const x = r.c[c][k];
        let td;
        if (!has) td = h("td", { class: "cell dim", text: "n/a", title: lab.status + " = " + r.st[lab.key] + ": no labels" });
        else if (x === null || x === undefined) td = h("td", { class: "cell dim", text: "–" });
        else if (typeof x === "boolean") td = h("td", { class: "cell " + (x ? "ok" : "bad"), text: x ? "✓" : "✗ wrong" });
        else { td = h("td", { class: "cell", text: fmt(x) }); td.style.background = hue(x, lab.scales[c]); }
        if (has && fe === k && c === cols[0]) { td.classList.add("first"); td.title = lab.key + ": first error"; }
        td.dataset.col = c;
        out.push([c, td]);
      }
    }
    return out;
  }
  function message(m) {
    const long = (m.r === "tool" || m.r === "system") && m.t.length > 300;
    const body = long
      ? h("details", {}, h("summary", { text: m.t.slice(0, 300) + "… show all (" + m.t.length + " chars)" }), h("div", { class: "txt", text: m.t }))
      : h("span", { class: "txt", text: m.t });
    const div = h("div", { class: "msg " + m.r }, h("span", { class: "role", text: m.r + (m.n ? " (" + m.n + ")" : "") + ":" }), body);
    for (const [name, args] of m.calls || [])
      div.append(h("div", { class: "call" }, "→ call ", h("b", { text: name }), " ", h("span", { class: "txt", text: args })));
    return div;
  }
  function showRow(r) {
    state.selected = r;
    for (const tr of document.querySelectorAll("#rows-table tbody tr")) tr.classList.toggle("selected", tr.dataset.id === r.id);
    const sec = document.getElementById("row");
    const head = h("div", { class: "rowhead" }, h("h2", { text: r.id }),
      h("div", {}, outcomeTag(r.oc), " generator " + (r.gen ?? "–") + " · reference answer " + (r.ref ?? "–") +
        " · final answer " + (r.final ?? "–") + " · problem " + (r.pid ?? "–")),
      h("div", {}, "first errors: ", feTags(r), " statuses: ", statusTags(r)));
    if (r.fr) head.append(h("div", { text: "filter: " + r.fr + (r.frule ? " (rule " + r.frule + ")" : "") }));
    if (r.err) head.append(h("div", { class: "tag bad", text: "error: " + r.err }));
    const parts = [head];
    if (r.conv) {
      r.conv.prompt.forEach((m) => parts.push(message(m)));
      r.conv.turns.forEach((msgs, k) => {
        const turn = h("div", { class: "turn", "data-step": k }, "turn " + k + "  ");
        for (const [c, td] of cellsFor(r, k)) {
          const tag = h("span", { class: "tag " + td.className.replace("cell", ""), "data-col": c, text: c + " " + td.textContent });
          tag.style.background = td.style.background;
          turn.append(tag);
        }
        parts.push(turn, ...msgs.map(message));
      });
    } else {
      parts.push(tex(h("div", { class: "prompt txt", text: r.prompt })));
      const cols = cellsFor(r, 0).map(([c]) => c);
      const t = h("table", { id: "steps" }, h("thead", {}, h("tr", {}, h("th", { text: "#" }), h("th", { text: "step" }),
        cols.map((c) => h("th", { class: "num", text: c })))));
      const tb = h("tbody", {});
      r.steps.forEach((step, k) => tb.append(h("tr", { "data-step": k }, h("td", { class: "num", text: k }),
        tex(h("td", { class: "step txt", text: step })), cellsFor(r, k).map(([, td]) => td))));
      t.append(tb);
      parts.push(t, h("div", { class: "legend", text: "✓ correct, ✗ wrong, – no label, n/a: the labeller's status says the row has no labels; values coloured red (low) to green (high) over their scale; the outlined cell is the labeller's first error. " +
        (D.typeset ? "LaTeX typeset by the KaTeX inlined in this file." : "LaTeX is shown as written (stepkit report --typeset typesets it with the machine's KaTeX).") }));
      if (D.typeset) parts.push(h("label", {}, h("input", { type: "checkbox", id: "typeset", checked: typeset ? "" : null,
        on: { change: (e) => { typeset = e.target.checked; showRow(r); } } }), " typeset LaTeX"));
    }
    const tree = r.nodes && D.trees[r.pid];
    if (tree) parts.push(drawTree(tree, new Set(r.nodes.filter(Boolean))));
    sec.replaceChildren(...parts);
  }
  function drawTree(nodes, path) {  // nodes: [id, parent, depth, step, visits, rollouts, successes, v_own, v_subtree]
    const kids = new Map(), byId = new Map(nodes.map((n) => [n[0], n]));
    for (const n of nodes) if (n[1] !== null && byId.has(n[1])) (kids.get(n[1]) || kids.set(n[1], []).get(n[1])).push(n);
    const roots = nodes.filter((n) => n[1] === null || !byId.has(n[1]));
    if (path.size) roots.forEach((n) => path.add(n[0]));  // (every path starts at the problem)
    const pos = new Map();
    let leaf = 0, maxLevel = 0;
    const place = (n, level) => {  // depth-first: leaves one row apart, a parent beside its first child
      maxLevel = Math.max(maxLevel, level);
      const ch = kids.get(n[0]) || [];
      if (!ch.length) pos.set(n[0], [level, leaf++]);
      else { ch.forEach((c) => place(c, level + 1)); pos.set(n[0], [level, pos.get(ch[0][0])[1]]); }
    };
    roots.forEach((n) => place(n, 0));
    const X = (l) => 12 + l * 150, Y = (i) => 24 + i * 28;
    const svg = s("svg", { width: X(maxLevel) + 160, height: Y(leaf) + 4, role: "img", id: "tree" });
    for (const n of nodes) if (n[1] !== null && byId.has(n[1])) {
      const [a, b] = [pos.get(n[1]), pos.get(n[0])];
      svg.append(s("path", { d: "M" + X(a[0]) + "," + Y(a[1]) + " V" + Y(b[1]) + " H" + X(b[0]), fill: "none",
        stroke: path.has(n[0]) && path.has(n[1]) ? "#1b4fa8" : "#bbb", "stroke-width": path.has(n[0]) ? 2.5 : 1 }));
    }
    for (const n of nodes) {
      const [l, i] = pos.get(n[0]);
      const v = n[7] === null ? null : n[7];
      const g = s("g", { "data-node": n[0] }, s("title", { text: n[0] + " (depth " + n[2] + "): " + (n[3] ?? "(the problem)") +
        "\nvalue own " + fmt(n[7]) + ", subtree " + fmt(n[8]) + "; visits " + n[4] + ", rollouts " + n[5] + ", successes " + n[6] }));
      g.append(s("circle", { cx: X(l), cy: Y(i), r: 6, fill: v === null ? "#ccc" : hue(v, ["unit", 0, 1]),
        stroke: path.has(n[0]) ? "#1b4fa8" : "#666", "stroke-width": path.has(n[0]) ? 3 : 1 }));
      g.append(s("text", { x: X(l) + 7, y: Y(i) - 7, text: n[0] + " v=" + fmt(n[7], 2) + " n=" + n[5] }));
      svg.append(g);
    }
    return h("div", { class: "tree" }, h("h3", { text: "tree search (mcts-label --tree-out): " + nodes.length + " nodes" }),
      h("div", { class: "legend", text: "x: tree level; colour and v: the node's own value (red 0, green 1); n: its rollouts; thick: this row's path. Hover a node for its step." }),
      svg);
  }

  header();
  summary();
  rowsSection();
  refresh();
  if (D.rows.length) showRow(D.rows[0]);
  document.body.dataset.readyMs = performance.now().toFixed(0);  // (read by bench/bench_report.py)
  document.body.dataset.ready = "1";
})();
