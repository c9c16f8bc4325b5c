// network-enforcer web view: read-only pages over the JSON API under /api/v1/ (docs/ui.md).
// Plain DOM and SVG; every text from the cluster goes through textContent, never innerHTML.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
let timer = null;
let lastBody = "";
let seenEdges = null; // edge ids of the previous graph answer (new violations are highlighted)
let view = null; // the SVG viewBox {x, y, w, h}, kept across polls once the user zoomed or panned
let moved = false; // the user zoomed or panned: keep their view; else fit each new graph

function el(tag, attrs, ...children) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function status(text, error) {
  const s = $("status");
  s.textContent = text;
  s.className = error ? "status error" : "status";
}

async function api(path) {
  const r = await fetch("api/v1/" + path, { cache: "no-store" });
  const text = await r.text();
  if (!r.ok) {
    let message = text;
    try { message = JSON.parse(text).error.message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return text;
}

function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query || "") };
}

function go(hash) { location.hash = hash; }

let lastNamespaces = "";

async function loadNamespaces(selected) {
  const text = await api("namespaces");
  const body = JSON.parse(text);
  const select = $("namespace");
  if (text === lastNamespaces) {
    if (selected) select.value = selected;
    return body.namespaces;
  }
  lastNamespaces = text;
  select.replaceChildren(...body.namespaces.map((n) =>
    el("option", { value: n.name }, `${n.name} (${n.policies} policies, ${n.proposals} proposals, ${n.activeViolations} violations)`)));
  if (selected) select.value = selected;
  return body.namespaces;
}

function poll(fn) {
  clearTimeout(timer);
  const tick = async () => {
    try {
      await fn();
      status("updated " + new Date().toLocaleTimeString());
    } catch (e) {
      status("error: " + e.message, true);
    }
    timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

// ---- cluster overview ----

const sorts = {}; // table id → {col, desc}: the user's sort, kept across polls

// A table whose header cells sort it (click again: the other way). columns: [{title, value, cell}],
// value(row) the sort key (numbers sort as numbers), cell(row) the cell's content.
function sortableTable(id, columns, rows) {
  const sort = sorts[id];
  const sorted = sort ? rows.slice().sort((a, b) => {
    const [x, y] = [columns[sort.col].value(a), columns[sort.col].value(b)];
    const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return sort.desc ? -order : order;
  }) : rows;
  const table = el("table", { id, class: "sortable" },
    el("tr", {}, ...columns.map((c, i) => {
      const mark = sort && sort.col === i ? (sort.desc ? " ▼" : " ▲") : "";
      const th = el("th", { title: "sort" }, c.title + mark);
      th.addEventListener("click", () => {
        sorts[id] = { col: i, desc: sort && sort.col === i ? !sort.desc : false };
        table.replaceWith(sortableTable(id, columns, rows));
      });
      return th;
    })),
    ...sorted.map((r) => el("tr", {}, ...columns.map((c) => el("td", {}, c.cell(r))))));
  return table;
}

const STATES = ["none", "learning", "monitor", "protect"];
const stateTag = (s) => el("span", { class: `tag ${s}` }, s === "none" ? "—" : s);

async function overviewPage() {
  await loadNamespaces();
  poll(async () => {
    const body = await api("overview");
    if (body === lastBody) return;
    lastBody = body;
    const o = JSON.parse(body);
    const graphLink = (ns) => el("a", { href: `#/graph/${encodeURIComponent(ns)}` }, ns);
    const namespaces = sortableTable("overview-namespaces", [
      { title: "namespace", value: (n) => n.namespace, cell: (n) => graphLink(n.namespace) },
      { title: "workloads", value: (n) => n.workloads, cell: (n) => String(n.workloads) },
      { title: "learning", value: (n) => n.learning, cell: (n) => String(n.learning) },
      { title: "monitor", value: (n) => n.monitor, cell: (n) => String(n.monitor) },
      { title: "protect", value: (n) => n.protect, cell: (n) => String(n.protect) },
      { title: "active violations", value: (n) => n.activeViolations, cell: (n) => String(n.activeViolations) },
      { title: "would block", value: (n) => n.wouldBlock, cell: (n) => String(n.wouldBlock) },
      { title: "unused rules", value: (n) => n.unusedRules, cell: (n) => String(n.unusedRules) },
    ], o.namespaces);
    const workloads = sortableTable("overview-workloads", [
      { title: "namespace", value: (w) => w.namespace, cell: (w) => graphLink(w.namespace) },
      { title: "workload", value: (w) => `${w.kind}/${w.name}`, cell: (w) => el("a", {
        href: `#/workload/${encodeURIComponent(w.namespace)}/${encodeURIComponent(w.name)}?kind=${encodeURIComponent(w.kind)}`,
        "data-workload": `${w.namespace}/${w.name}` }, `${w.kind}/${w.name}`) },
      { title: "state", value: (w) => STATES.indexOf(w.state), cell: (w) => stateTag(w.state) },
      { title: "egress", value: (w) => STATES.indexOf(w.egress), cell: (w) => stateTag(w.egress) },
      { title: "ingress", value: (w) => STATES.indexOf(w.ingress), cell: (w) => stateTag(w.ingress) },
      { title: "active violations", value: (w) => w.activeViolations, cell: (w) => String(w.activeViolations) },
      { title: "warnings", value: (w) => Number(w.wouldBlock) + Number(w.unusedRules), cell: (w) =>
        [w.wouldBlock ? "protect would block observed flows (WouldBlock)" : "", w.unusedRules ? "unused rules" : ""].filter(Boolean).join("; ") || "—" },
    ], o.workloads);
    $("main").replaceChildren(
      el("h1", {}, "Cluster overview"),
      el("p", {}, "Workloads with a proposal or a policy. A workload is as enforced as its less enforced direction (a direction with neither counts for nothing). Click a header to sort."),
      el("h2", {}, "Namespaces"), o.namespaces.length ? namespaces : el("p", { class: "empty" }, "nothing learned yet"),
      el("h2", {}, "Workloads"), o.workloads.length ? workloads : el("p", { class: "empty" }, "none"),
      ...(o.truncated ? [el("p", { class: "empty" }, "more workloads than shown: see each namespace's graph")] : []));
  });
}

// ---- cluster guardrails page ----

async function clusterPage() {
  poll(async () => {
    const body = await api("cluster");
    if (body === lastBody) return;
    lastBody = body;
    const c = JSON.parse(body);
    const rows = sortableTable("cluster-proposals", [
      { title: "proposal", value: (p) => p.name, cell: (p) => el("span", { "data-proposal": p.name }, p.name) },
      { title: "tier", value: (p) => p.tier, cell: (p) => p.tier },
      { title: "priority", value: (p) => p.priority, cell: (p) => String(p.priority) },
      { title: "namespace", value: (p) => p.namespace || "", cell: (p) => p.namespace
        ? el("a", { href: `#/graph/${encodeURIComponent(p.namespace)}` }, p.namespace) : "—" },
      { title: "rules (in / out)", value: (p) => p.ingressRules + p.egressRules, cell: (p) => `${p.ingressRules} / ${p.egressRules}` },
      { title: "state", value: (p) => p.state, cell: (p) => el("span", { class: `tag ${p.state === "in force" ? "protect" : p.promote ? "monitor" : "learning"}`,
        title: p.message || "" }, p.reason && p.state !== "in monitor" ? `${p.state} (${p.reason})` : p.state) },
      { title: "would deny", value: (p) => p.state === "in monitor" ? p.activeViolations : -1, cell: (p) => p.state !== "in monitor" ? "—"
        : p.activeViolations
        ? el("span", { class: "violations", title: p.violations.join("\n") }, `${p.activeViolations}: ${p.violations[0]}${p.activeViolations > 1 ? " …" : ""}`)
        : "none yet" },
      { title: "learned", value: (p) => p.lastLearned || "", cell: (p) => p.lastLearned ? ago(p.lastLearned, Date.now()) : "—" },
      { title: "notes", value: (p) => p.notes.length, cell: (p) => p.notes.join("; ") || "—" },
      { title: "command", value: (p) => p.command, cell: (p) => command(p.command, "promote") },
    ], c.proposals);
    const policies = sortableTable("cluster-policies", [
      { title: "order", value: (p) => c.policies.indexOf(p), cell: (p) => String(c.policies.indexOf(p) + 1) },
      { title: "policy", value: (p) => p.name, cell: (p) => el("span", { "data-policy": p.name }, p.name) },
      { title: "tier", value: (p) => p.tier, cell: (p) => p.tier },
      { title: "priority", value: (p) => p.priority, cell: (p) => String(p.priority) },
      { title: "subject", value: (p) => p.subject, cell: (p) => p.subject },
      { title: "ingress", value: (p) => p.ingress.length, cell: (p) => p.ingress.join(", ") || "—" },
      { title: "egress", value: (p) => p.egress.length, cell: (p) => p.egress.join(", ") || "—" },
      { title: "from", value: (p) => p.promotedFrom || "", cell: (p) => p.promotedFrom ? `proposal ${p.promotedFrom}` : "written by hand" },
      { title: "used", value: (p) => p.invalid ? 1 : 0, cell: (p) => p.invalid
        ? el("span", { class: "tag violation", title: p.invalid }, "left out: invalid") : "yes" },
    ], c.policies);
    $("main").replaceChildren(
      el("h1", {}, "Cluster guardrails"),
      el("p", {}, "ClusterNetworkPolicyProposals learned from the traffic between namespaces: an Admin isolation per namespace (Pass what was seen, Deny the rest) and a Baseline floor. Monitor one with the command to see what it would deny, then promote it to protect: it then becomes a ClusterNetworkPolicy."),
      !c.listed ? el("p", { class: "empty" }, "not listed (yet): is the ClusterNetworkPolicyProposal CRD installed? kubectl apply --server-side -f charts/network-enforcer/crds/")
        : c.proposals.length ? rows : el("p", { class: "empty" }, "none learned yet"),
      el("h2", {}, "ClusterNetworkPolicies"),
      el("p", {}, "Every ClusterNetworkPolicy, in the order the tiers consult them: Admin before NetworkPolicies, Baseline after; within a tier by priority. The graph says which tier decides each observed edge."),
      !c.policiesListed ? el("p", { class: "empty" }, "not listed (yet): is the ClusterNetworkPolicy CRD (policy.networking.k8s.io/v1alpha2) installed?")
        : c.policies.length ? policies : el("p", { class: "empty" }, "none"));
  });
}

// ---- graph page ----

// ---- graph layout (dagre, embedded by the controller's build: docs/ui.md, Pages, "Layout") ----

const NODE_H = 56, NODE_MIN_W = 150, NODE_MAX_W = 320, LABEL_H = 14, LABEL_MAX_PORTS = 6;
const measureCtx = document.createElement("canvas").getContext("2d");

// The width `text` takes in `font` (the page's own fonts, as the SVG draws it).
let measureFont = null;
function textWidth(text, font) {
  if (measureFont !== font) measureCtx.font = measureFont = font; // parsing a font costs more than measuring
  return measureCtx.measureText(text).width;
}

// `text` cut with an ellipsis to at most `width` pixels in `font`.
function fit(text, font, width) {
  if (textWidth(text, font) <= width) return text;
  let cut = text;
  while (cut.length > 1 && textWidth(cut + "…", font) > width) cut = cut.slice(0, -1);
  return cut + "…";
}

const NODE_FONT = "12px system-ui, sans-serif", SUB_FONT = "10px system-ui, sans-serif";
const EDGE_FONT = "600 10px system-ui, sans-serif"; // the bold of violations: wide enough for both

// A node's two lines and the width they need (within NODE_MIN_W..NODE_MAX_W).
function nodeText(n) {
  const modes = n.governance.map((x) => x.mode);
  const mode = modes.includes("protect") ? "protect" : modes.includes("monitor") ? "monitor" : modes.length ? "learning" : "";
  const sub = n.kind === "workload" ? `${n.workloadKind}${mode ? " · " + mode : ""}`
    : n.kind === "name" ? `DNS name${n.members ? ` · ${n.members.length} address${n.members.length === 1 ? "" : "es"}` : ""}`
    : n.kind;
  const label = fit(n.name, NODE_FONT, NODE_MAX_W - 20);
  const width = Math.min(NODE_MAX_W, Math.max(NODE_MIN_W, Math.ceil(Math.max(textWidth(label, NODE_FONT), textWidth(sub, SUB_FONT))) + 24));
  return { mode, label, sub, width };
}

// The tiers that decide observed flows (docs/ui.md, "Graph"): short names for labels.
const TIERS = { admin: "Admin", networkPolicy: "NP", baseline: "Baseline", default: "open" };

// An edge's label: the tiers deciding its observed flows, then its ports (one edge per pair and state
// bundles them), the first few and a count.
function edgeLabel(e) {
  const shown = e.ports.slice(0, LABEL_MAX_PORTS).join(", ");
  const ports = e.ports.length > LABEL_MAX_PORTS ? `${shown} +${e.ports.length - LABEL_MAX_PORTS}` : shown;
  return e.tiers ? `${e.tiers.map((t) => TIERS[t] || t).join("/")} · ${ports}` : ports;
}

// One observed flow's decision per side, for an edge's hover text.
function decisionText(d) {
  const side = (name, s) => `${name} ${TIERS[s.tier] || s.tier} ${s.allowed ? "allows" : "denies"}${s.by ? ` (${s.by.join(", ")})` : ""}`;
  return `${d.port}: ${side("egress", d.egress)}; ${side("ingress", d.ingress)}`;
}

// The layered layout's cost grows faster than the graph, and it runs on the page's thread. Measured
// with dagre 3.1.3 on this project's 2-core machine under load: 200 workloads in four tiers with 520
// edges 0.7 s, but 100 nodes with 600 random edges 6.5 s. Up to this many edges the page lays out in
// layers; beyond it, or once a layered layout of a graph this size took over LAYERED_SLOW_MS, in plain
// columns, and it says so (filter by workload).
const LAYERED_MAX_EDGES = 300, LAYERED_SLOW_MS = 1500;
let layeredTooSlowAt = Infinity; // the edge count of a graph whose layered layout was too slow
let lastLayout = { key: null, value: null };

// The layout of a graph answer, cached while the graph keeps its nodes, edges and labels (a poll that
// only brings new violation times redraws without laying out again). Routes are keyed by the edge's
// index in `edges`: two edges of one pair may share an id (a learned and an allowed edge to grouped
// outside addresses).
function layout(nodes, edges) {
  // Columns cost a few milliseconds even at 10,000 edges: less than the cache key would.
  if (edges.length > LAYERED_MAX_EDGES || edges.length >= layeredTooSlowAt) return columnLayout(nodes, edges);
  const key = JSON.stringify([nodes.map((n) => [n.id, n.name, n.kind, n.workloadKind, n.governance.map((x) => x.mode), (n.members || []).length]),
    edges.map((e) => [e.id, e.from, e.to, e.state, edgeLabel(e)])]);
  if (lastLayout.key === key) return lastLayout.value;
  let value = null;
  const started = performance.now();
  try {
    value = layeredLayout(nodes, edges);
  } catch (err) {
    console.error("the layered layout failed; columns instead", err);
  }
  if (performance.now() - started > LAYERED_SLOW_MS) layeredTooSlowAt = edges.length;
  value = value || columnLayout(nodes, edges);
  lastLayout = { key, value };
  return value;
}

// Columns by longest path from the sources (cycles cut), rows in id order, edges as single bends:
// cheap at any size, but an edge may cross a node and labels may meet.
function columnLayout(nodes, edges) {
  const text = new Map(nodes.map((n) => [n.id, nodeText(n)]));
  const out = new Map(nodes.map((n) => [n.id, []]));
  const indeg = new Map(nodes.map((n) => [n.id, 0]));
  for (const e of edges) {
    if (e.from === e.to || !out.has(e.from) || !out.has(e.to)) continue;
    out.get(e.from).push(e.to);
    indeg.set(e.to, indeg.get(e.to) + 1);
  }
  const rank = new Map(nodes.map((n) => [n.id, 0]));
  const queue = nodes.filter((n) => indeg.get(n.id) === 0).map((n) => n.id);
  const left = new Map(indeg);
  while (queue.length) {
    const id = queue.shift();
    for (const to of out.get(id)) {
      rank.set(to, Math.max(rank.get(to), rank.get(id) + 1));
      left.set(to, left.get(to) - 1);
      if (left.get(to) === 0) queue.push(to);
    }
  }
  const columns = new Map();
  for (const n of nodes) {
    const r = rank.get(n.id);
    if (!columns.has(r)) columns.set(r, []);
    columns.get(r).push(n);
  }
  const pos = new Map();
  for (const [r, list] of columns) {
    list.sort((a, b) => a.id.localeCompare(b.id));
    list.forEach((n, i) => {
      const p = { x: 40 + r * (NODE_MAX_W + 120), y: 40 + i * 110, width: text.get(n.id).width, text: text.get(n.id) };
      pos.set(n.id, p);
    });
  }
  const routes = new Map();
  const pairs = new Map();
  for (const [i, e] of edges.entries()) {
    const a = pos.get(e.from), b = pos.get(e.to);
    if (!a || !b) continue;
    const key = [e.from, e.to].sort().join("|");
    const n = pairs.get(key) || 0;
    pairs.set(key, n + 1);
    const label = edgeLabel(e);
    const x1 = a.x + a.width, y1 = a.y + NODE_H / 2, x2 = b.x, y2 = b.y + NODE_H / 2;
    const bend = 30 + n * 28; // parallel edges of one pair fan out
    const mx = (x1 + x2) / 2, my = (y1 + y2) / 2 - bend;
    const d = e.from === e.to
      ? `M ${a.x + a.width / 2} ${a.y} c 40 -60 80 -60 ${a.width / 2 - 10} 0`
      : `M ${x1} ${y1} Q ${mx} ${my} ${x2} ${y2}`;
    // The label's width only widens the view's bounds here: an estimate saves measuring 10,000 texts.
    routes.set(i, { d, x: mx, y: my + bend / 2 - 4, label, width: label.length * 7 + 8, low: Math.min(y1, y2, a.y - 45) });
  }
  return { pos, routes, layered: false };
}

// Layered layout, left to right: nodes in ranks, each edge label a box of its own that dagre keeps
// clear of nodes and other labels, edges routed between ranks (so never through a node they do not
// connect). Returns node boxes (top-left x, y, width), edge routes and label centres, and the size.
function layeredLayout(nodes, edges) {
  const g = new dagre.graphlib.Graph({ multigraph: true });
  // greedy: a cycle is broken at its fewest edges (a reply or a rare call back), so the main flow reads
  // left to right.
  g.setGraph({ acyclicer: "greedy", rankdir: "LR", nodesep: 28, ranksep: 80, edgesep: 16, marginx: 20, marginy: 20 });
  const text = new Map();
  for (const n of nodes) {
    const t = nodeText(n);
    text.set(n.id, t);
    g.setNode(n.id, { width: t.width, height: NODE_H });
  }
  for (const [i, e] of edges.entries()) {
    if (!text.has(e.from) || !text.has(e.to)) continue;
    const label = edgeLabel(e);
    g.setEdge(e.from, e.to, { width: Math.ceil(textWidth(label, EDGE_FONT)) + 8, height: LABEL_H, labelpos: "c", label }, String(i));
  }
  dagre.layout(g);
  const pos = new Map();
  for (const id of g.nodes()) {
    const n = g.node(id);
    pos.set(id, { x: n.x - n.width / 2, y: n.y - n.height / 2, width: n.width, text: text.get(id) });
  }
  // Each rank's column (in LR, the nodes of a rank share their centre's x): an edge leaves and enters
  // a node sideways, level, out to its column's edge, so that it never cuts through a wider
  // neighbour of its own rank (dagre aims ends at the node's centre).
  const columns = new Map();
  for (const { x, width } of pos.values()) {
    const key = Math.round(x + width / 2);
    const c = columns.get(key) || { left: Infinity, right: -Infinity };
    columns.set(key, { left: Math.min(c.left, x), right: Math.max(c.right, x + width) });
  }
  const side = (node, toward, y) => {
    const column = columns.get(Math.round(node.x + node.width / 2));
    const right = toward.x >= node.x + node.width / 2;
    const level = Math.min(Math.max(y, node.y + 10), node.y + NODE_H - 10);
    return [{ x: right ? node.x + node.width : node.x, y: level }, { x: right ? column.right + 12 : column.left - 12, y: level }];
  };
  const routes = new Map();
  for (const ref of g.edges()) {
    const e = g.edge(ref);
    const p = e.points;
    let points = p;
    if (ref.v !== ref.w && p.length >= 3) {
      const [start, exit] = side(pos.get(ref.v), p[1], p[0].y);
      const [end, entry] = side(pos.get(ref.w), p[p.length - 2], p[p.length - 1].y);
      points = [start, exit, ...p.slice(1, -1), entry, end];
    }
    routes.set(Number(ref.name), { points, x: e.x, y: e.y, label: e.label, width: e.width });
  }
  return { pos, routes, layered: true };
}

const CORNER = 8; // px: the most a rounded bend leaves the straight route dagre kept clear

// The SVG path through a route's points: straight segments, each bend rounded within CORNER px of
// its corner (dagre keeps its routes about 20 px from any node: a wider curve could cut one). A self
// edge loops below its node, above the label dagre placed there.
function routePath(route, node, self) {
  if (route.d) return route.d; // the column layout's own
  if (self) {
    const bottom = node.y + NODE_H, x1 = node.x + node.width * 0.35, x2 = node.x + node.width * 0.65;
    return `M ${x1} ${bottom} C ${x1} ${selfLoopControl(route, node)} ${x2} ${selfLoopControl(route, node)} ${x2} ${bottom}`;
  }
  const p = route.points;
  let d = `M ${p[0].x} ${p[0].y}`;
  for (let i = 1; i < p.length - 1; i++) {
    const [a, c, b] = [p[i - 1], p[i], p[i + 1]];
    const r1 = Math.min(CORNER, Math.hypot(c.x - a.x, c.y - a.y) / 2), r2 = Math.min(CORNER, Math.hypot(b.x - c.x, b.y - c.y) / 2);
    const toward = (q, r) => { const l = Math.hypot(q.x - c.x, q.y - c.y) || 1; return { x: c.x + (q.x - c.x) * r / l, y: c.y + (q.y - c.y) * r / l }; };
    const [in_, out] = [toward(a, r1), toward(b, r2)];
    d += ` L ${in_.x} ${in_.y} Q ${c.x} ${c.y} ${out.x} ${out.y}`;
  }
  const last = p[p.length - 1];
  return d + ` L ${last.x} ${last.y}`;
}

// The y of a self loop's control points: its lowest point (three quarters of the way) stays 3 px
// above the label's box, and at least 12 px below the node.
function selfLoopControl(route, node) {
  const bottom = node.y + NODE_H;
  const lowest = Math.max(bottom + 12, route.y - LABEL_H / 2 - 3);
  return bottom + (lowest - bottom) / 0.75;
}

// The box around everything drawn: nodes, labels, routes, self loops (dagre's own size leaves out a
// self edge's label), with a margin.
function bounds(pos, routes) {
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  const add = (x, y) => { x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x); y1 = Math.max(y1, y); };
  for (const p of pos.values()) { add(p.x, p.y); add(p.x + p.width, p.y + NODE_H + 40); }
  for (const r of routes.values()) {
    add(r.x - r.width / 2, r.y - LABEL_H / 2);
    add(r.x + r.width / 2, r.y + LABEL_H / 2);
    for (const q of r.points || []) add(q.x, q.y);
    if (r.low !== undefined) add(r.x, r.low);
  }
  if (x0 === Infinity) return { x: 0, y: 0, w: 400, h: 300 };
  const m = 20;
  return { x: x0 - m, y: y0 - m, w: Math.max(400, x1 - x0 + 2 * m), h: Math.max(300, y1 - y0 + 2 * m) };
}

// Why an edge is allowed or denied (the explain route: `check --explain` against the cluster now),
// port by port, with the command that reproduces the answer offline.
async function explainEdge(ns, e, box) {
  const ports = [...new Set(e.ports.map((p) => /^(TCP|UDP|SCTP) (\d+)(?: |$)/.exec(p)).filter(Boolean).map((m) => `${m[1]} ${m[2]}`))];
  // A later click (or close) owns the box: this one stops adding to it.
  const token = {};
  box.token = token;
  const close = el("button", { type: "button", class: "close", title: "close" }, "×");
  close.addEventListener("click", () => { box.token = null; box.replaceChildren(); });
  box.replaceChildren(close, el("h3", {}, `Why ${e.from.slice(2)} → ${e.to.slice(2)}`));
  if (!ports.length) {
    box.append(el("p", { class: "empty" }, "Only a flow on one port can be explained (not a range, a named port or any port)."));
    return;
  }
  for (const label of ports) {
    if (box.token !== token) return;
    const [protocol, port] = label.split(" ");
    const row = el("div", { class: "explained", "data-port": label });
    box.append(row);
    // One at a time: the route computes two at once and answers 503 beyond.
    await explainInto(row, ns, e.from, e.to, protocol, port);
  }
}

// One flow explained into `row`: the verdict, each side's reason, the offline command (or the error).
async function explainInto(row, ns, from, to, protocol, port) {
  const label = `${protocol} ${port}`;
  row.replaceChildren(el("strong", {}, `${label}: …`));
  try {
    const q = new URLSearchParams({ from, to, protocol, port });
    const a = JSON.parse(await api(`namespaces/${encodeURIComponent(ns)}/explain?${q}`));
    row.dataset.allowed = a.allowed;
    row.replaceChildren(el("strong", { class: a.allowed ? "allowed" : "violation" }, `${label}: ${a.allowed ? "allowed" : "denied"} now`),
      el("div", {}, `egress (at the source): ${a.egress}`), el("div", {}, `ingress (at the destination): ${a.ingress}`),
      el("div", { class: "empty" }, "reproduce offline (with the web view port-forwarded on 8090):"), command(a.command, "explain"));
  } catch (err) {
    row.dataset.error = "true";
    row.replaceChildren(el("strong", {}, `${label}: `), el("span", { class: "error" }, err.message || String(err)));
  }
}

function renderGraph(g, onEdge) {
  const { pos, routes, layered } = layout(g.nodes, g.edges);
  const svg = el("svg:svg", { id: "graph-svg", "data-nodes": g.nodes.length, "data-edges": g.edges.length, "data-layout": layered ? "layered" : "columns" });
  const edgeLayer = el("svg:g", { class: "edges" });
  const labelLayer = el("svg:g", { class: "edge-labels" });
  const nodeLayer = el("svg:g", { class: "nodes" });
  for (const [i, e] of g.edges.entries()) {
    const route = routes.get(i);
    if (!route) continue;
    const isNew = seenEdges && !seenEdges.has(e.id) && (e.state === "violation" || e.state === "blocked");
    const title = `${e.state}: ${e.ports.join(", ")}` + (e.allowedBy.length ? `\nallowed by ${e.allowedBy.join(", ")}` : "")
      + (e.violations ? `\n${e.violations.length} record(s), last ${new Date(e.lastSeenMs).toLocaleString()}` : "")
      + (e.decisions ? `\ndecided now:\n${e.decisions.map(decisionText).join("\n")}` : "");
    const attrs = {
      class: `edge ${e.state}${isNew ? " highlight" : ""}`, "data-id": e.id, "data-state": e.state,
      "data-from": e.from, "data-to": e.to, "data-ports": e.ports.join(","),
    };
    // The tiers (before the first " · ") stand out from the ports.
    const cut = e.tiers ? route.label.indexOf(" · ") : -1;
    const parts = cut < 0 ? [route.label] : [el("svg:tspan", { class: "tier" }, route.label.slice(0, cut)), route.label.slice(cut)];
    const text = el("svg:text", { x: route.x, y: route.y, "text-anchor": "middle", "dominant-baseline": "central" }, ...parts);
    const edge = el("svg:g", attrs,
      el("svg:title", {}, title + "\n(click: why)"),
      el("svg:path", { d: routePath(route, pos.get(e.from), e.from === e.to), "marker-end": `url(#arrow-${e.state})` }),
      // In the column layout (large graphs) the label is the edge's own text: a group, box and hover
      // text of its own would triple the elements of 10,000 edges.
      ...(layered ? [] : [text]));
    if (onEdge) edge.addEventListener("click", () => onEdge(e));
    edgeLayer.append(edge);
    if (!layered) continue;
    // Layered: labels above every path (a path may pass under another edge's label, never hide it),
    // each on the box dagre kept clear for it, so that a path under it never hides a letter.
    const label = el("svg:g", { ...attrs, class: `edge-label ${e.state}` },
      el("svg:title", {}, title + "\n(click: why)"),
      el("svg:rect", { class: "bg", x: route.x - route.width / 2, y: route.y - LABEL_H / 2, width: route.width, height: LABEL_H, rx: 3 }),
      text);
    if (onEdge) label.addEventListener("click", () => onEdge(e));
    labelLayer.append(label);
  }
  for (const n of g.nodes) {
    const p = pos.get(n.id);
    const { mode, label, sub } = p.text;
    const g1 = el("svg:g", { class: `node ${n.kind} ${mode}`, "data-id": n.id, transform: `translate(${p.x},${p.y})` },
      el("svg:title", {}, n.kind === "name" ? [n.name].concat(n.members || []).join("\n")
        : n.members ? n.members.join("\n") : n.governance.map((x) => `${x.direction}: ${x.mode} (${x.name})`).join("\n") || n.name),
      el("svg:rect", { width: p.width, height: NODE_H, rx: 6 }),
      el("svg:text", { x: 10, y: 22 }, label),
      el("svg:text", { x: 10, y: 42, class: "sub" }, sub));
    if (n.kind === "workload" && n.namespace) {
      g1.addEventListener("click", () => go(`#/workload/${encodeURIComponent(n.namespace)}/${encodeURIComponent(n.name)}?kind=${encodeURIComponent(n.workloadKind)}`));
    }
    nodeLayer.append(g1);
  }
  const defs = el("svg:defs", {});
  for (const [state, color] of [["observed", "#1565c0"], ["learned", "#8a94a6"], ["allowed", "#2f7d32"], ["violation", "#d32f2f"], ["blocked", "#6a1b9a"]]) {
    defs.append(el("svg:marker", { id: `arrow-${state}`, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      el("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", fill: color })));
  }
  svg.append(defs, edgeLayer, nodeLayer, labelLayer);
  const full = bounds(pos, routes);
  if (!view || !moved) view = { ...full };
  setView(svg);
  panAndZoom(svg, full);
  seenEdges = new Set(g.edges.map((e) => e.id));
  return svg;
}

function setView(svg) { svg.setAttribute("viewBox", `${view.x} ${view.y} ${view.w} ${view.h}`); }

function panAndZoom(svg, full) {
  const zoom = (factor, cx, cy) => {
    const x = cx ?? view.x + view.w / 2, y = cy ?? view.y + view.h / 2;
    view = { x: x - (x - view.x) * factor, y: y - (y - view.y) * factor, w: view.w * factor, h: view.h * factor };
    moved = true;
    setView(svg);
  };
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect();
    zoom(ev.deltaY > 0 ? 1.15 : 1 / 1.15, view.x + (ev.clientX - r.left) / r.width * view.w, view.y + (ev.clientY - r.top) / r.height * view.h);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (ev) => { drag = { x: ev.clientX, y: ev.clientY, view: { ...view } }; svg.classList.add("panning"); });
  svg.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect();
    view = { ...drag.view, x: drag.view.x - (ev.clientX - drag.x) / r.width * view.w, y: drag.view.y - (ev.clientY - drag.y) / r.height * view.h };
    moved = true;
    setView(svg);
  });
  const stop = () => { drag = null; svg.classList.remove("panning"); };
  svg.addEventListener("pointerup", stop);
  svg.addEventListener("pointerleave", stop);
  svg.zoomBy = zoom;
  svg.reset = () => { view = { ...full }; moved = false; setView(svg); };
}

async function graphPage(ns, params) {
  const namespaces = await loadNamespaces(ns);
  if (!ns) {
    if (namespaces.length) return go(`#/graph/${encodeURIComponent(namespaces[0].name)}`);
    $("main").replaceChildren(el("p", { class: "empty" }, "No proposals or policies yet: nothing learned."));
    return;
  }
  $("workload").value = params.get("workload") || "";
  $("window").value = params.get("window") || "all";
  const container = el("div", { id: "graph" });
  const zoomBox = el("div", { class: "zoom" });
  for (const [text, f] of [["+", 1 / 1.25], ["−", 1.25]]) {
    const b = el("button", { type: "button", title: "zoom" }, text);
    b.addEventListener("click", () => container.querySelector("svg")?.zoomBy(f));
    zoomBox.append(b);
  }
  const reset = el("button", { type: "button", title: "fit" }, "⤢");
  reset.addEventListener("click", () => container.querySelector("svg")?.reset());
  zoomBox.append(reset);
  const legend = el("div", { class: "legend" }, el("strong", {}, ns),
    el("span", { class: "learned" }, "learned only"), el("span", { class: "allowed" }, "allowed by a policy"),
    el("span", { class: "violation" }, "violation (monitor)"), el("span", { class: "blocked" }, "blocked (protect)"),
    el("span", { class: "observed" }, "observed, no rule"),
    el("span", { class: "key", title: "The tier that decides an edge's observed flows now: an Admin or Baseline ClusterNetworkPolicy, NetworkPolicies (NP), or none (open)" },
      "Admin / NP / Baseline / open: who decides"),
    el("span", { id: "counts", class: "empty" }, ""));
  const explainBox = el("div", { id: "explain" });
  $("main").replaceChildren(legend, container);
  const query = new URLSearchParams();
  for (const k of ["workload", "window"]) if (params.get(k)) query.set(k, params.get(k));
  poll(async () => {
    await loadNamespaces(ns);
    const body = await api(`namespaces/${encodeURIComponent(ns)}/graph?${query}`);
    if (body === lastBody) return;
    const g = JSON.parse(body);
    const svg = renderGraph(g, (e) => explainEdge(ns, e, explainBox));
    $("counts").textContent = Object.entries(g.counts).map(([k, v]) => `${v} ${k}`).join(" · ") + (g.truncated ? " (truncated)" : "")
      + (svg.dataset.layout === "columns" ? " · too many edges to lay out in layers here: in columns (filter by workload)" : "");
    container.replaceChildren(svg, zoomBox, explainBox);
    lastBody = body; // only once drawn: a failed drawing is tried again at the next poll
  });
}

// ---- workload page ----

function table(headers, rows) {
  if (!rows.length) return el("p", { class: "empty" }, "none");
  return el("table", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h))),
    ...rows.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c)))));
}

// "3 min ago" for a time in the past (RFC 3339), in its largest whole unit.
function ago(time, now) {
  const secs = Math.max(0, Math.floor((now - Date.parse(time)) / 1000));
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "min"]]) {
    if (secs >= size) return `${Math.floor(secs / size)} ${unit} ago`;
  }
  return `${secs} s ago`;
}

// A rule's status.ruleUsage entry in words: "last matched 3 min ago · 2 peers · watched since 4 d ago",
// the absolute times on hover; entries of an older shape are shown as they are.
function usageCell(u, now = Date.now()) {
  if (u === undefined || u === null) return "—";
  if (typeof u !== "object" || !u.since) return typeof u === "object" ? JSON.stringify(u) : String(u);
  const peers = Number(u.peers || 0);
  const parts = [u.lastMatched ? `last matched ${ago(u.lastMatched, now)}` : "never matched",
    `${peers}${peers >= 1000 ? "+" : ""} peer${peers === 1 ? "" : "s"}`,
    `watched since ${ago(u.since, now)}`];
  const title = (u.lastMatched ? `last matched ${u.lastMatched}; ` : "") + `watched since ${u.since}`;
  return el("span", { class: "usage", title }, parts.join(" · "));
}

function rulesTable(rules, withUsage) {
  const headers = ["#", "peers", "ports"].concat(withUsage ? ["usage"] : []);
  return table(headers, rules.map((r) => [String(r.index), r.peers.join("; "), r.ports.join(", ")].concat(withUsage ? [usageCell(r.usage)] : [])));
}

// A payload's spec.egressNames: outside services by DNS name (absent: none).
function namesTable(entries, withUsage) {
  if (!entries || !entries.length) return [];
  const headers = ["#", "names", "ports"].concat(withUsage ? ["usage"] : []);
  return [el("h4", {}, "Names (spec.egressNames)"),
    table(headers, entries.map((e) => [String(e.index), e.names.join(", "), e.ports.join(", ")].concat(withUsage ? [usageCell(e.usage)] : [])))];
}

// What a condition means, in words (docs/behaviour.md §5.1, §5.2), by type and status.
const CONDITION_MEANINGS = {
  "Ready/True": "the policy is in force as its mode says",
  "Ready/False": "the policy is not in force as its mode says: see the reason",
  "DuplicateTarget/True": "another policy governs the same workload and direction: only one of them is in force",
  "DuplicateTarget/False": "the only policy for this workload and direction",
  "SelectorOverlapsWorkload/True": "its selector also picks pods of other workloads",
  "SelectorOverlapsWorkload/False": "its selector picks only the target's pods",
  "UnusedRules/True": "some rules allowed no observed flow for a long time: candidates to remove",
  "UnusedRules/False": "every rule allowed observed traffic recently",
  "WouldBlock/True": "in protect, this policy would block flows that were observed",
  "WouldBlock/False": "no observed flow would be blocked (or no history to tell yet)",
  "Promoted/True": "promoted into a policy",
  "Promoted/False": "a promotion was refused: see the reason",
};

function conditions(list) {
  return table(["type", "status", "meaning", "reason", "message"],
    list.map((c) => [c.type, c.status, CONDITION_MEANINGS[`${c.type}/${c.status}`] || "—", c.reason, c.message]));
}

// Violations per hour over the last 48 hours (status.violationHistory, oldest first, hours without any
// left out), as bars: the newest hour on the right, each bar's hour and count on hover. The controller's
// clock decides the hours: a newer hour than the browser's "now" moves the window, it is not dropped.
const PLOT_HOURS = 48, PLOT_BAR = 6, PLOT_H = 36, HOUR_MS = 3600000;
function violationPlot(history, now = Date.now()) {
  const counts = new Map();
  for (const b of history || []) {
    const start = Date.parse(b.start);
    if (Number.isFinite(start)) counts.set(start, (counts.get(start) || 0) + (Number(b.count) || 0));
  }
  const last = Math.max(Math.floor(now / HOUR_MS) * HOUR_MS, ...counts.keys());
  const first = last - (PLOT_HOURS - 1) * HOUR_MS;
  const shown = [...counts].filter(([start, n]) => start >= first && n > 0);
  const most = Math.max(0, ...shown.map(([, n]) => n));
  const total = shown.reduce((sum, [, n]) => sum + n, 0);
  const width = PLOT_HOURS * PLOT_BAR;
  const svg = el("svg:svg", { width, height: PLOT_H + 2, viewBox: `0 0 ${width} ${PLOT_H + 2}`, role: "img",
    "aria-label": `${total} violations in the last 48 hours` },
    el("svg:line", { x1: 0, x2: width, y1: PLOT_H + 0.5, y2: PLOT_H + 0.5, class: "axis" }));
  for (const [start, n] of shown) {
    const h = Math.max(2, Math.round(PLOT_H * n / most));
    const at = new Date(start);
    svg.append(el("svg:rect", { x: Math.round((start - first) / HOUR_MS) * PLOT_BAR, y: PLOT_H - h, width: PLOT_BAR - 1, height: h,
      "data-start": at.toISOString(), "data-count": n },
    el("svg:title", {}, `${at.toISOString().slice(0, 16).replace("T", " ")} UTC + 1 h: ${n} violation${n === 1 ? "" : "s"}`)));
  }
  return el("figure", { class: "violation-plot" }, svg,
    el("figcaption", {}, total ? `${total} in the last 48 h, per hour (most ${most} in an hour); 48 h ago → now` : "none in the last 48 h"));
}

// Active violations, each followed by the command that acknowledges it on a row of its own, and a
// "why" that explains the flow as the policies decide it now.
function violationsTable(ns, list) {
  if (!list.length) return el("p", { class: "empty" }, "none");
  const headers = ["id", "last seen", "source", "destination", "port", "action", ""];
  const rows = list.flatMap((v) => {
    const why = el("div", { class: "explained", "data-violation": v.id });
    const cells = [String(v.id), v.timestamp, v.source, v.dest, v.port, v.action].map((c) => el("td", {}, c));
    const button = el("td", {});
    if (v.explain) {
      const b = el("button", { type: "button", class: "why" }, "why");
      b.addEventListener("click", () => explainInto(why, ns, v.explain.from, v.explain.to, v.explain.protocol, String(v.explain.port)));
      button.append(b);
    }
    return [el("tr", {}, ...cells, button),
      el("tr", {}, el("td", { colspan: headers.length }, command(v.acknowledgeCommand, "acknowledge"), why))];
  });
  return el("table", { class: "violations" }, el("tr", {}, ...headers.map((h) => el("th", {}, h))), ...rows);
}

function command(text, cls) { return el("code", { class: `command ${cls}` }, text); }

async function workloadPage(ns, name, params) {
  await loadNamespaces(ns);
  const kind = params.get("kind");
  poll(async () => {
    const body = await api(`namespaces/${encodeURIComponent(ns)}/workloads/${encodeURIComponent(name)}${kind ? "?kind=" + encodeURIComponent(kind) : ""}`);
    if (body === lastBody) return;
    lastBody = body;
    const w = JSON.parse(body);
    const back = el("a", { href: `#/graph/${encodeURIComponent(ns)}?workload=${encodeURIComponent(name)}` }, "← graph");
    const proposals = el("div", {}, el("h2", {}, "Proposals (learned)"), ...(w.proposals.length ? [] : [el("p", { class: "empty" },
      "none: a promoted proposal is deleted; learning writes a new one when traffic its policy lacks appears")]), ...w.proposals.map((p) => el("section", { class: "card proposal", "data-name": p.name },
      el("h3", {}, `${p.direction} · ${p.name} `, el("span", { class: "tag" }, p.promoteLabel ? `promote=${p.promoteLabel}` : "learning")),
      el("p", {}, `${p.peerCount ?? 0} peers; last learned ${p.lastLearnedTime || "—"}` + (p.policy ? `; promoted into ${p.policy}` : "")),
      rulesTable(p.rules, false),
      ...namesTable(p.egressNames),
      el("p", {}, el("a", { href: `#/diff/${encodeURIComponent(ns)}/${encodeURIComponent(p.name)}` }, "what would promoting allow? (diff)")),
      el("h4", {}, "Promote"), ...p.promoteCommands.map((c) => command(c, "promote")),
      el("h4", {}, "Conditions"), conditions(p.conditions))));
    const policies = el("div", {}, el("h2", {}, "Policies (in force)"), ...(w.policies.length ? w.policies.map((p) => el("section", { class: "card policy", "data-name": p.name },
      el("h3", {}, `${p.direction} · ${p.name} `, el("span", { class: `tag ${p.mode}` }, p.mode)),
      el("p", {}, `${p.activeViolationCount} active violations (${p.violationCount} observed in all)` + (p.promotedFrom ? `; from proposal ${p.promotedFrom}` : "")),
      violationPlot(p.violationHistory),
      rulesTable(p.rules, true),
      ...namesTable(p.egressNames, true),
      el("h4", {}, "Active violations"),
      violationsTable(ns, p.violations),
      el("h4", {}, "Acknowledged"),
      table(["id", "source", "destination", "port", "reason", "at"], p.acknowledgedViolations.map((v) => [String(v.id), v.source, v.dest, v.port, v.reason, v.acknowledgedAt])),
      ...(p.protectCommand ? [el("h4", {}, "Switch to protect"), command(p.protectCommand, "protect")] : []),
      el("h4", {}, "Conditions"), conditions(p.conditions))) : [el("p", { class: "empty" }, "none: promote a proposal")]));
    $("main").replaceChildren(el("p", {}, back), el("h1", {}, `${w.kinds.join("/")} ${w.namespace}/${w.name}`), el("div", { class: "columns" }, proposals, policies));
  });
}

// ---- proposal diff page ----

async function diffPage(ns, name) {
  await loadNamespaces(ns);
  poll(async () => {
    const body = await api(`namespaces/${encodeURIComponent(ns)}/proposals/${encodeURIComponent(name)}/diff`);
    if (body === lastBody) return;
    lastBody = body;
    const d = JSON.parse(body);
    const yes = (b) => (b ? "yes" : "—");
    const rows = d.rows.map((r) => {
      const tr = el("tr", { class: r.allowedNow !== r.allowedAfter ? "change" : "" },
        ...[r.peer, r.port, yes(r.learned), r.violations ? String(r.violations) : "—", yes(r.allowedNow), yes(r.allowedAfter)].map((c) => el("td", {}, c)));
      return tr;
    });
    const workloadName = d.workload.split("/")[1];
    $("main").replaceChildren(
      el("p", {}, el("a", { href: `#/workload/${encodeURIComponent(ns)}/${encodeURIComponent(workloadName)}` }, "← workload")),
      el("h1", {}, `Promoting ${d.proposal}`),
      el("p", {}, `${d.workload}, ${d.direction}; in force now: ${d.policy || "no policy"}. Promoting would newly allow ${d.added} and stop allowing ${d.removed} peer/port pair(s); ${d.violationsAllowedAfter} observed violation(s) would be allowed.`),
      d.rows.length ? el("table", { id: "diff" }, el("tr", {}, ...["peer", "port", "learned", "violations seen", "allowed now", "allowed after promoting"].map((h) => el("th", {}, h))), ...rows)
        : el("p", { class: "empty" }, "nothing learned yet"));
  });
}

function render() {
  clearTimeout(timer);
  lastBody = "";
  seenEdges = null;
  view = null;
  moved = false;
  const { parts, params } = route();
  const [page, ns, name] = parts;
  const failed = (e) => status("error: " + e.message, true);
  if (page === "workload" && ns && name) workloadPage(ns, name, params).catch(failed);
  else if (page === "diff" && ns && name) diffPage(ns, name).catch(failed);
  else if (page === "graph") graphPage(ns, params).catch(failed);
  else if (page === "cluster") clusterPage().catch(failed);
  else overviewPage().catch(failed);
}

function filtersChanged() {
  const q = new URLSearchParams();
  if ($("workload").value.trim()) q.set("workload", $("workload").value.trim());
  if ($("window").value !== "all") q.set("window", $("window").value);
  go(`#/graph/${encodeURIComponent($("namespace").value)}?${q}`);
}

$("namespace").addEventListener("change", filtersChanged);
$("window").addEventListener("change", filtersChanged);
$("workload").addEventListener("change", filtersChanged);
window.addEventListener("hashchange", render);
render();
