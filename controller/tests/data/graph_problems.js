// What is wrong with a drawn graph (docs/ui.md, Pages, "Layout"), as sentences; none when it is
// readable. Measured in the browser on what it drew: the boxes of nodes and edge labels as laid out
// on the screen, and each edge's path sampled every 2 px.
function graphProblems(svg) {
  if (!svg) return ["no graph drawn"];
  const problems = [];
  const tol = 0.5;
  const overlap = (a, b) => a.left < b.right - tol && b.left < a.right - tol
    && a.top < b.bottom - tol && b.top < a.bottom - tol;
  const inside = (p, r) => p.x > r.left + tol && p.x < r.right - tol && p.y > r.top + tol && p.y < r.bottom - tol;
  const nodes = Array.from(svg.querySelectorAll("g.node")).map((g) => ({ id: g.dataset.id, box: g.querySelector("rect").getBoundingClientRect() }));
  const labels = Array.from(svg.querySelectorAll("g.edge-label")).map((g) => ({ id: g.dataset.id, box: g.querySelector("text").getBoundingClientRect() }));
  if (!nodes.length) problems.push("no node drawn");
  for (let i = 0; i < nodes.length; i++) {
    for (let j = i + 1; j < nodes.length; j++) {
      if (overlap(nodes[i].box, nodes[j].box)) problems.push(`node ${nodes[i].id} overlaps node ${nodes[j].id}`);
    }
    for (const l of labels) {
      if (overlap(nodes[i].box, l.box)) problems.push(`label of ${l.id} overlaps node ${nodes[i].id}`);
    }
  }
  for (let i = 0; i < labels.length; i++) {
    for (let j = i + 1; j < labels.length; j++) {
      if (overlap(labels[i].box, labels[j].box)) problems.push(`label of ${labels[i].id} overlaps label of ${labels[j].id}`);
    }
  }
  const drawn = new Set();
  for (const g of svg.querySelectorAll("g.edge")) {
    const { id, from, to, state } = g.dataset;
    if (drawn.has(`${id} ${state}`)) problems.push(`edge ${id} (${state}) drawn twice`);
    drawn.add(`${id} ${state}`);
    if (!svg.querySelector(`g.edge-label[data-id="${CSS.escape(id)}"][data-state="${state}"]`)) problems.push(`edge ${id} (${state}) has no label`);
    const path = g.querySelector("path");
    const ctm = path.getScreenCTM();
    const length = path.getTotalLength();
    const crossed = new Set();
    for (let at = 0; at <= length; at += 2) {
      const p = new DOMPoint(path.getPointAtLength(at).x, path.getPointAtLength(at).y).matrixTransform(ctm);
      for (const n of nodes) {
        if (n.id !== from && n.id !== to && inside(p, n.box)) crossed.add(n.id);
      }
    }
    for (const n of crossed) problems.push(`edge ${id} passes through node ${n}`);
  }
  return problems;
}
