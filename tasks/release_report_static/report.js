// Draws the per-node tables of report.html from its embedded JSON: bar charts (SVG) with 90 %
// whiskers where the release publishes an interval, and the numbers beneath each chart.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  const fmt = (x) => (x === null || x === undefined ? "" : Math.round(x).toLocaleString("en-US"));
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

  function title(m) {
    const names = m.attrs.map((a) => a.name + (a.description ? " (" + a.description + ")" : ""));
    return m.unit[0].toUpperCase() + m.unit.slice(1) + " by " + names.join(" × ");
  }

  // groups on the x axis: the categories of the attribute with more of them; series (colours): the
  // other's. Cells are in C order over m.attrs.
  function chart(m, counts, lo, hi) {
    const swap = m.attrs.length === 2 && m.attrs[1].labels.length > m.attrs[0].labels.length;
    const a = swap ? m.attrs[1] : m.attrs[0], b = swap ? m.attrs[0] : m.attrs[1];
    const nx = a.labels.length, ns = b ? b.labels.length : 1;
    const cellOf = (i, j) => (swap ? j * nx + i : i * ns + j);
    const top = Math.max(1, ...counts, ...(hi || []).filter((v) => v !== null));
    const step = niceStep(top / 4), ymax = Math.ceil(top / step) * step;
    const longest = Math.max(...a.labels.map((l) => l.length));
    const rotate = nx * Math.min(longest, 18) * 6.5 > 440;
    const L = rotate ? Math.max(56, Math.min(longest, 24) * 4.6) : 56, R = 8, T = 8, B = rotate ? 18 + Math.min(longest, 24) * 5.2 : 28;
    const W = Math.max(480, L + R + nx * Math.max(14, ns * 9 + 8)), H = 210 + B;
    const ph = H - T - B, gw = (W - L - R) / nx, bw = Math.max(3, (gw - 6) / ns);
    const y = (v) => T + ph - (v / ymax) * ph;
    let s = `<svg viewBox="0 0 ${W} ${H}" width="100%" style="max-width:${W}px" role="img" aria-label="${esc(title(m))}">`;
    for (let v = 0; v <= ymax + 1e-9; v += step) {
      s += `<line x1="${L}" x2="${W - R}" y1="${y(v)}" y2="${y(v)}" stroke="#e3e6ec"/>`;
      s += `<text x="${L - 4}" y="${y(v) + 4}" font-size="11" text-anchor="end" fill="#444">${fmt(v)}</text>`;
    }
    for (let i = 0; i < nx; i++) {
      for (let j = 0; j < ns; j++) {
        const c = cellOf(i, j), x = L + i * gw + 3 + j * bw, v = counts[c];
        s += `<rect class="bar" x="${x.toFixed(1)}" y="${y(v).toFixed(1)}" width="${(bw - 1).toFixed(1)}" height="${(T + ph - y(v)).toFixed(1)}" fill="${COLORS[j % COLORS.length]}"><title>${esc(a.labels[i] + (b ? ", " + b.labels[j] : ""))}: ${fmt(v)}</title></rect>`;
        if (lo && lo[c] !== null && hi[c] !== null) {
          const cx = (x + (bw - 1) / 2).toFixed(1), w = Math.min(4, bw / 3);
          s += `<g class="whisker" stroke="#111" stroke-width="1.2"><line x1="${cx}" x2="${cx}" y1="${y(Math.max(0, lo[c]))}" y2="${y(hi[c])}"/>`;
          s += `<line x1="${cx - w}" x2="${+cx + w}" y1="${y(hi[c])}" y2="${y(hi[c])}"/><line x1="${cx - w}" x2="${+cx + w}" y1="${y(Math.max(0, lo[c]))}" y2="${y(Math.max(0, lo[c]))}"/></g>`;
        }
      }
      const tx = L + i * gw + gw / 2, label = esc(a.labels[i].length > 24 ? a.labels[i].slice(0, 23) + "…" : a.labels[i]);
      s += rotate
        ? `<text transform="translate(${tx},${T + ph + 12}) rotate(-40)" font-size="11" text-anchor="end" fill="#222">${label}</text>`
        : `<text x="${tx}" y="${T + ph + 16}" font-size="11" text-anchor="middle" fill="#222">${label}</text>`;
    }
    s += `<line x1="${L}" x2="${W - R}" y1="${T + ph}" y2="${T + ph}" stroke="#555"/></svg>`;
    if (b) {
      s += `<div class="legend">${esc(b.name)}: ` + b.labels.map((l, j) => `<span style="color:${COLORS[j % COLORS.length]}">■</span> ${esc(l)}`).join(" &nbsp;") + "</div>";
    }
    return s;
  }

  function niceStep(x) {
    const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1e-9))));
    for (const f of [1, 2, 2.5, 5, 10]) if (f * p >= x) return Math.max(1, f * p);
    return 10 * p;
  }

  function numbers(m, counts, lo, hi) {
    const a = m.attrs[0], b = m.attrs[1], ns = b ? b.labels.length : 1;
    let rows = "";
    counts.forEach((v, c) => {
      const i = Math.floor(c / ns), j = c % ns;
      const iv = lo && lo[c] !== null ? `${fmt(Math.max(0, lo[c]))} – ${fmt(hi[c])}` : "none published";
      rows += `<tr><td>${esc(a.labels[i])}</td>${b ? `<td>${esc(b.labels[j])}</td>` : ""}<td class="num">${fmt(v)}</td><td class="num">${iv}</td></tr>`;
    });
    return `<table class="numbers"><thead><tr><th>${esc(a.name)}</th>${b ? `<th>${esc(b.name)}</th>` : ""}<th>count</th><th>90 % interval</th></tr></thead><tbody>${rows}</tbody></table>`;
  }

  function render(level, key, target) {
    const node = data.levels[level].nodes[key], marginals = data.levels[level].marginals;
    let s = `<h3>${esc(key === "nation" ? "Nation" : key.replace("/", ", "))}</h3>`;
    s += `<table class="summary"><tr><th>synthetic households</th><td class="num">${fmt(node.households)}</td>`;
    s += `<th>synthetic persons</th><td class="num">${fmt(node.persons)}</td></tr></table><div class="grid">`;
    marginals.forEach((m, i) => {
      const lo = node.lo[i], hi = node.hi[i];
      const note = lo ? "with the published 90 % interval of each count" : "no interval is published for this count at this node";
      s += `<div class="card" data-marginal="${i}"><h4>${esc(title(m))}</h4><p class="note">${note}</p>${chart(m, node.counts[i], lo, hi)}`;
      s += `<details><summary>numbers</summary>${numbers(m, node.counts[i], lo, hi)}</details></div>`;
    });
    target.innerHTML = s + "</div>";
    target.dataset.node = key;
  }

  function picker(selectId, viewId, level, keys, label) {
    const sel = document.getElementById(selectId), view = document.getElementById(viewId);
    sel.innerHTML = keys.map((k) => `<option value="${esc(k[0])}">${esc(label(k))}</option>`).join("");
    sel.addEventListener("change", () => render(k2level(sel.value, level), sel.value, view));
    // a link to report.html#ST=50/PUMA=00100 opens with that node selected; else the first
    const wanted = decodeURIComponent(location.hash.slice(1)), first = keys.some((k) => k[0] === wanted) ? wanted : keys.length ? keys[0][0] : null;
    if (first !== null) {
      sel.value = first;
      render(k2level(first, level), first, view);
    }
  }
  const k2level = (key, level) => (key === "nation" ? "nation" : level);

  picker("state-select", "state-view", "state",
         [["nation"], ...Object.keys(data.levels.state.nodes).map((k) => [k])], (k) => (k[0] === "nation" ? "Nation" : k[0]));
  picker("puma-select", "puma-view", "puma", Object.keys(data.levels.puma.nodes).map((k) => [k]), (k) => k[0].replace("/", ", "));
  document.body.dataset.rendered = "yes";
})();
