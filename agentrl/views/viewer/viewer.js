// agentrl inspect viewer: plain JS, no libraries, no network. Reads the JSON embedded in the page.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("agentrl-data").textContent);
  const $ = (id) => document.getElementById(id);
  const PAGE = 50;
  const state = { page: 0, sortKey: null, sortDir: 1, rows: [], current: null, overlay: "role", pinned: null };
  const byId = new Map(DATA.tokens.map((t, i) => [t.id, i]));
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  const fmt = (x, nd = 3) => (x === null || x === undefined ? "–" : typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(nd)) : String(x));
  const stepMetrics = new Map(DATA.metrics.map((m) => [m.step, m]));
  const N = DATA.curves; // the trainer's metric names (agentrl/training/metrics.py CURVES): N.gate, N.W, N.M, ...

  // -- header, warnings, theme ------------------------------------------------------------------
  $("run-name").textContent = "· " + DATA.run.name;
  $("sampling-note").textContent = "showing " + DATA.sampling.note + (DATA.tokenizer ? "" : " · no tokenizer: token boundaries approximate");
  $("metrics-source").textContent = "(" + DATA.metrics_source + ", " + DATA.metrics.length + " steps)";
  if (DATA.warnings.length) { $("warnings").hidden = false; $("warnings").textContent = DATA.warnings.join("\n"); }
  if ((DATA.history || []).length) {
    $("history-section").hidden = false;
    $("history").innerHTML = DATA.history.map((h) => "<li>" + esc(h) + "</li>").join("");
  }
  $("theme-toggle").addEventListener("click", () => {
    const root = document.documentElement;
    const dark = root.dataset.theme ? root.dataset.theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
    root.dataset.theme = dark ? "light" : "dark";
  });

  // -- curves (inline SVG built as markup: the HTML parser puts it in the SVG namespace) ---------
  function metricKeys() {
    const keys = new Set();
    for (const m of DATA.metrics) for (const [k, v] of Object.entries(m)) if (k !== "step" && typeof v === "number") keys.add(k);
    const first = DATA.important.filter((k) => keys.has(k));
    return first.concat([...keys].filter((k) => !first.includes(k)).sort());
  }
  function curveSvg(key) {
    const pts = DATA.metrics.filter((m) => typeof m[key] === "number").map((m, i) => [m.step ?? i, m[key]]);
    const W = 230, H = 90, L = 34, B = 16;
    if (!pts.length) return "";
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = (x) => L + (x1 > x0 ? ((x - x0) / (x1 - x0)) * (W - L - 4) : (W - L) / 2);
    const sy = (y) => 4 + (y1 > y0 ? (1 - (y - y0) / (y1 - y0)) * (H - B - 8) : (H - B) / 2);
    let body = "";
    if (key === N.gate) {
      const bw = Math.max(2, (W - L - 4) / Math.max(1, pts.length));
      body = pts.map(([x, y]) => (y ? `<rect class="gate" x="${sx(x) - bw / 2}" y="4" width="${bw}" height="${H - B - 8}"></rect>` : "")).join("");
    }
    const line = pts.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
    body += `<polyline class="line" points="${line}"></polyline>`;
    if (pts.length < 40) body += pts.map(([x, y]) => `<circle cx="${sx(x)}" cy="${sy(y)}" r="2"><title>step ${x}: ${fmt(y, 4)}</title></circle>`).join("");
    const axes = `<line class="axis" x1="${L}" y1="${H - B}" x2="${W}" y2="${H - B}"></line>` +
      `<text x="2" y="12">${fmt(y1, 3)}</text><text x="2" y="${H - B}">${fmt(y0, 3)}</text>` +
      `<text x="${L}" y="${H - 2}">${fmt(x0, 0)}</text><text x="${W - 24}" y="${H - 2}">${fmt(x1, 0)}</text>`;
    return `<div class="curve" data-key="${esc(key)}"><div class="title"><span>${esc(key)}</span><span class="muted">${fmt(ys[ys.length - 1], 4)}</span></div>` +
      `<svg width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">${axes}${body}</svg></div>`;
  }
  $("curves").innerHTML = metricKeys().map(curveSvg).join("") || '<p class="muted">no metrics</p>';

  // -- episode table ----------------------------------------------------------------------------
  function fillSelect(id, values) {
    const sel = $(id);
    for (const v of values) { const o = document.createElement("option"); o.value = String(v); o.textContent = String(v); sel.appendChild(o); }
  }
  const uniq = (f) => [...new Set(DATA.episodes.map(f).filter((v) => v !== null && v !== undefined))].sort((a, b) => (a > b ? 1 : a < b ? -1 : 0));
  fillSelect("f-step", uniq((e) => e.step));
  fillSelect("f-env", uniq((e) => e.env));
  fillSelect("f-stop", uniq((e) => e.stop));
  fillSelect("f-fail", uniq((e) => e.failure));

  function filtered() {
    const step = $("f-step").value, env = $("f-env").value, stop = $("f-stop").value, fail = $("f-fail").value;
    const rmin = $("f-rmin").value === "" ? -Infinity : +$("f-rmin").value;
    const rmax = $("f-rmax").value === "" ? Infinity : +$("f-rmax").value;
    const idq = $("f-id").value.trim();
    let rows = DATA.episodes.filter((e) =>
      (step === "" || String(e.step) === step) && (env === "" || e.env === env) && (stop === "" || e.stop === stop) &&
      (fail === "" || (fail === "none" ? !e.failure : fail === "any" ? !!e.failure : e.failure === fail)) &&
      (e.reward ?? 0) >= rmin && (e.reward ?? 0) <= rmax && (idq === "" || String(e.id).includes(idq)));
    if (state.sortKey) {
      const k = state.sortKey, d = state.sortDir;
      rows = rows.slice().sort((a, b) => ((a[k] ?? -Infinity) > (b[k] ?? -Infinity) ? d : (a[k] ?? -Infinity) < (b[k] ?? -Infinity) ? -d : 0));
    }
    return rows;
  }
  function renderTable() {
    state.rows = filtered();
    const pages = Math.max(1, Math.ceil(state.rows.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const slice = state.rows.slice(state.page * PAGE, (state.page + 1) * PAGE);
    $("episodes").tBodies[0].innerHTML = slice.map((e) =>
      `<tr data-id="${esc(e.id)}" class="${state.current === e.id ? "current" : ""}"><td class="num">${fmt(e.step)}</td><td>${esc(e.id)}</td><td>${esc(e.env)}</td>` +
      `<td class="num">${fmt(e.reward)}</td><td>${esc(e.stop ?? "–")}</td><td class="${e.failure ? "fail" : ""}" title="${esc(e.failure_msg ?? "")}">${esc(e.failure ?? "")}</td>` +
      `<td class="num">${e.turns}</td><td class="num">${e.tokens}</td><td class="num">${fmt(e.entropy)}</td><td class="num">${e.selected}</td></tr>`).join("");
    $("page-info").textContent = `rows ${state.rows.length ? state.page * PAGE + 1 : 0}–${state.page * PAGE + slice.length} of ${state.rows.length} (page ${state.page + 1}/${pages}, ${PAGE} per page)`;
  }
  for (const id of ["f-step", "f-env", "f-rmin", "f-rmax", "f-stop", "f-fail", "f-id"]) {
    for (const ev of ["input", "change"]) $(id).addEventListener(ev, () => { state.page = 0; renderTable(); });
  }
  $("f-reset").addEventListener("click", () => { $("filters").reset(); state.page = 0; renderTable(); });
  $("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); renderTable(); });
  $("next").addEventListener("click", () => { state.page += 1; renderTable(); });
  $("episodes").tHead.addEventListener("click", (ev) => {
    const k = ev.target.dataset.k; if (!k) return;
    state.sortDir = state.sortKey === k ? -state.sortDir : 1; state.sortKey = k; renderTable();
  });
  $("episodes").tBodies[0].addEventListener("click", (ev) => { const tr = ev.target.closest("tr"); if (tr) openEpisode(tr.dataset.id); });

  // -- episode view -----------------------------------------------------------------------------
  const KNOWN = new Set(["logp_old", "logp_new", "entropy", "advantage", "weight", "selected", "clipped"]);
  function tokenInfo(t, i) {
    const ov = t.overlays, seg = t.segAt[i];
    const g = (k) => (ov[k] ? ov[k][i] : null);
    const lpOld = g("logp_old"), lpEng = t.engine_logp[i];
    const lp = lpOld ?? lpEng;
    return { i, text: t.pieces[i], role: seg[0], turn: seg[1], engine_logp: lpEng, logp_old: lpOld, logp_new: g("logp_new"),
      surprisal: lp === null || lp === undefined ? null : -lp, entropy: g("entropy"), advantage: g("advantage"),
      weight: g("weight"), selected: g("selected"), clipped: g("clipped"),
      extra: Object.keys(ov).filter((k) => !KNOWN.has(k)).map((k) => [k, ov[k][i]]) };
  }
  function openEpisode(id, scroll = true) {
    const k = byId.get(id);
    if (k === undefined) return;
    const t = DATA.tokens[k], row = DATA.episodes[k];
    state.current = id; state.pinned = null;
    t.segAt = []; for (const s of t.segments) for (let i = s[2]; i < s[3]; i++) t.segAt[i] = s;
    $("episode-section").hidden = false;
    $("ep-title").textContent = id;
    const comps = Object.entries(row.components || {}).map(([a, b]) => `${a}=${fmt(b)}`).join(", ");
    const gate = stepMetrics.get(row.step);
    $("ep-header").innerHTML = [["env", row.env], ["task", row.task], ["step", row.step], ["group", row.group],
      ["reward", fmt(row.reward) + (comps ? ` (${comps})` : "")], ["stop", row.stop], ["turns", row.turns],
      ["tokens", `${row.tokens} (${row.policy_tokens} policy)`], ["weighting", row.weighting],
      ["STARE gate", gate && N.gate in gate ? (gate[N.gate] ? "on" : "off") : null]]
      .filter(([, v]) => v !== null && v !== undefined).map(([a, b]) => `<span><span class="k">${a}</span>${esc(b)}</span>`).join("") +
      (t.failure ? `<span class="failure">FAILED at the ${esc(t.failure.boundary)} boundary: ${esc(t.failure.message)}</span>` : "");
    let html = "", lastTurn = -1;
    const breaks = new Map((t.breaks || []).map(([at, title]) => [at, title]));
    for (let i = 0; i < t.pieces.length; i++) {
      const x = tokenInfo(t, i);
      const attrs = [["i", i], ["break", breaks.has(i) ? esc(breaks.get(i)) : null], ["role", x.role], ["turn", x.turn], ["logp", x.logp_old ?? x.engine_logp], ["entropy", x.entropy],
        ["adv", x.advantage], ["weight", x.weight], ["selected", x.selected], ["clipped", x.clipped]]
        .filter(([, v]) => v !== null && v !== undefined).map(([a, v]) => ` data-${a}="${v}"`).join("");
      const cls = "tok role-" + x.role + (x.role === "policy" && x.turn !== lastTurn ? " turn-start" : "");
      if (x.role === "policy") lastTurn = x.turn;
      html += `<span class="${cls}"${attrs}>${esc(x.text)}</span>`;
    }
    $("tokens").innerHTML = html;
    state.spans = $("tokens").children;
    renderTurnChart(t);
    $("why").innerHTML = '<p class="muted">Click a token to pin its details: why it got its weight.</p>';
    applyOverlay();
    renderTable();
    if (scroll) $("episode-section").scrollIntoView({ block: "start" });
    if (location.hash !== "#episode=" + encodeURIComponent(id)) history.replaceState(null, "", "#episode=" + encodeURIComponent(id));
  }

  function renderTurnChart(t) {
    const ent = t.overlays.entropy, lps = t.overlays.logp_old || t.engine_logp;
    const turns = new Map();
    for (let i = 0; i < t.pieces.length; i++) {
      if (t.segAt[i][0] !== "policy") continue;
      const v = ent ? ent[i] : lps[i] === null ? null : -lps[i];
      if (v === null || v === undefined) continue;
      const a = turns.get(t.segAt[i][1]) || { sum: 0, n: 0, first: i };
      a.sum += v; a.n += 1; turns.set(t.segAt[i][1], a);
    }
    const items = [...turns.entries()].sort((a, b) => a[0] - b[0]);
    if (!items.length) { $("turn-chart").innerHTML = ""; return; }
    const label = ent ? "mean entropy per turn (nats)" : "mean surprisal per turn (no entropy overlay)";
    const max = Math.max(...items.map(([, a]) => a.sum / a.n), 1e-9), bw = 26, H = 56;
    const bars = items.map(([turn, a], j) => {
      const v = a.sum / a.n, h = Math.max(1, (v / max) * (H - 18));
      return `<rect data-first="${a.first}" x="${j * (bw + 4)}" y="${H - 12 - h}" width="${bw}" height="${h}"><title>turn ${turn}: ${fmt(v, 3)} over ${a.n} tokens</title></rect>` +
        `<text x="${j * (bw + 4) + 2}" y="${H - 1}">t${turn}</text>`;
    }).join("");
    $("turn-chart").innerHTML = `<div class="muted" style="font-size:12px">${label} · click a bar to jump</div><svg width="${items.length * (bw + 4)}" height="${H}">${bars}</svg>`;
  }
  $("turn-chart").addEventListener("click", (ev) => {
    const f = ev.target.getAttribute && ev.target.getAttribute("data-first");
    if (f !== null && state.spans) state.spans[+f].scrollIntoView({ block: "center" });
  });

  // -- overlays: recolour in place via a per-token CSS variable -----------------------------------
  const lerp = (a, b, u) => a.map((x, k) => Math.round(x + (b[k] - x) * u));
  const rgb = (c, alpha) => `rgba(${c[0]},${c[1]},${c[2]},${alpha})`;
  const HEAT = [[255, 235, 130], [230, 60, 40]], POS = [30, 160, 70], NEG = [215, 50, 50];
  const OVERLAYS = {
    surprisal: { attr: "logp", value: (v) => -v, kind: "heat", label: "surprisal −log p_old (nats)" },
    entropy: { attr: "entropy", value: (v) => v, kind: "heat", label: "entropy H (nats, full vocabulary)" },
    advw: { attr: "adv", value: (v, el) => v * (el.dataset.weight === undefined ? 1 : +el.dataset.weight), kind: "div", label: "advantage × weight" },
    selected: { attr: "selected", value: (v) => v, kind: "sel", label: "selected tokens (STARE L+ / L−; dashed = weight ≠ 1)" },
  };
  function applyOverlay() {
    const box = $("tokens"), name = state.overlay;
    box.className = "tokens " + (name === "role" ? "ov-role" : "ov-value ov-" + name);
    const spans = state.spans || [];
    if (name === "role") { renderLegend(name); return; }
    const o = OVERLAYS[name];
    let lo = Infinity, hi = -Infinity;
    const vals = new Array(spans.length);
    for (let i = 0; i < spans.length; i++) {
      const raw = spans[i].dataset[o.attr];
      if (raw === undefined || spans[i].dataset.role !== "policy") { vals[i] = null; continue; }
      const v = o.value(+raw, spans[i]); vals[i] = v; lo = Math.min(lo, v); hi = Math.max(hi, v);
    }
    const amax = Math.max(Math.abs(lo), Math.abs(hi), 1e-9);
    for (let i = 0; i < spans.length; i++) {
      const v = vals[i];
      let c = "transparent";
      if (v !== null) {
        if (o.kind === "heat") { const u = hi > lo ? (v - lo) / (hi - lo) : 0.5; c = rgb(lerp(HEAT[0], HEAT[1], u), 0.25 + 0.6 * u); }
        else if (o.kind === "div") c = rgb(v >= 0 ? POS : NEG, 0.1 + 0.75 * Math.abs(v) / amax);
        else c = v > 0 ? rgb(POS, 0.75) : v < 0 ? rgb(NEG, 0.75) : "transparent";
      }
      spans[i].style.setProperty("--bg", c);
    }
    renderLegend(name, lo, hi, amax);
  }
  function renderLegend(name, lo, hi, amax) {
    let h;
    if (name === "role") {
      h = ["policy (loss mask 1)", "prompt", "tool", "env", "scaffold"].map((r) => `<span class="chip tok role-${r.split(" ")[0]}">${r}</span>`).join("") + '<span class="muted">mask 0 for all but policy; wavy underline = clipped</span>';
      $("legend").innerHTML = `<span class="ov-role" style="display:contents">${h}</span>`;
      return;
    }
    const o = OVERLAYS[name];
    if (lo === Infinity) { $("legend").innerHTML = `<span class="muted">${o.label}: not recorded for this episode</span>`; return; }
    if (o.kind === "heat") h = `<span>${fmt(lo)}</span><span class="ramp" style="background:linear-gradient(90deg,${rgb(HEAT[0], 0.25)},${rgb(HEAT[1], 0.85)})"></span><span>${fmt(hi)}</span>`;
    else if (o.kind === "div") h = `<span>${fmt(-amax)}</span><span class="ramp" style="background:linear-gradient(90deg,${rgb(NEG, 0.85)},transparent,${rgb(POS, 0.85)})"></span><span>${fmt(amax)}</span>`;
    else h = `<span class="chip" style="background:${rgb(POS, 0.75)}">+1 L+ / kept</span><span class="chip" style="background:${rgb(NEG, 0.75)}">−1 L−</span>`;
    $("legend").innerHTML = `<span>${o.label}:</span>${h}<span class="muted">non-policy tokens are not scored</span>`;
  }
  for (const r of document.querySelectorAll('input[name="overlay"]')) r.addEventListener("change", () => { state.overlay = r.value; applyOverlay(); });

  // -- hover details and "why this weight" --------------------------------------------------------
  const CLIP = { 0: "not clipped", 1: "clipped at the low side (1−ε_low)", 2: "clipped at the high side (1+ε_high)", 3: "dual-clip (A<0, ratio > c)" };
  function detailRows(x) {
    const ratio = x.logp_new !== null && x.logp_old !== null ? Math.exp(x.logp_new - x.logp_old) : null;
    return [["token", `<code>${esc(JSON.stringify(x.text))}</code> #${x.i}`], ["role", `${x.role} (mask ${x.role === "policy" ? 1 : 0})`], ["turn", x.turn],
      ["engine logp", fmt(x.engine_logp, 4)], ["logp old", fmt(x.logp_old, 4)], ["logp new", fmt(x.logp_new, 4)], ["ratio new/old", fmt(ratio, 4)],
      ["surprisal", fmt(x.surprisal, 4)], ["entropy", fmt(x.entropy, 4)], ["advantage", fmt(x.advantage, 4)], ["weight", fmt(x.weight, 4)],
      ["selected", x.selected === null ? "–" : x.selected > 0 ? "+1 (L+)" : x.selected < 0 ? "−1 (L−)" : "0"], ["clip", x.clipped === null ? "–" : CLIP[x.clipped] ?? x.clipped], ...x.extra.map(([k, v]) => [esc(k), fmt(v, 4)])]
      .map(([a, b]) => `<tr><td>${a}</td><td>${b}</td></tr>`).join("");
  }
  function explain(x, row) {
    if (x.role !== "policy") return `Not trained on: a <b>${x.role}</b> token has loss mask 0, so it gets no advantage, weight or selection (and never enters the surprisal ranking).`;
    if (x.weight === null && x.advantage === null) return "No training overlays were recorded for this episode (the trainer attaches them after the update).";
    const m = stepMetrics.get(row.step) || {}, method = row.weighting || "none";
    const cut = (DATA.cutoffs[String(row.step)] || {});
    const parts = [`Weighting method: <b>${esc(method)}</b>. Advantage A = ${fmt(x.advantage, 4)} (${x.advantage > 0 ? "T+" : x.advantage < 0 ? "T−" : "A = 0: never selected"}).`];
    if (method === "stare") {
      if (x.selected) {
        const c = x.selected > 0 ? cut.plus : cut.minus;
        parts.push(`Selected as <b>${x.selected > 0 ? "L+" : "L−"}</b>: among the step's ${x.selected > 0 ? "A>0" : "A<0"} policy tokens its surprisal ${fmt(x.surprisal, 3)} is in the top P` + (c !== undefined ? ` (lowest selected surprisal at step ${row.step} among shown episodes: ${fmt(c, 3)})` : "") + ".");
      } else if (x.advantage) parts.push(`Not selected: its surprisal ${fmt(x.surprisal, 3)} is below the step's top-P cutoff` + (cut.plus !== undefined || cut.minus !== undefined ? ` (≈ ${fmt(x.advantage > 0 ? cut.plus : cut.minus, 3)})` : "") + ".");
      if (N.gate in m) {
        const target = m[N.target] !== undefined ? `, target H_tgt = ${fmt(m[N.target], 4)}` : "";
        parts.push(`Gate at step ${row.step}: <b>${m[N.gate] ? "on" : "off"}</b>` + (m[N.entropy] !== undefined ? ` (batch entropy H̄ = ${fmt(m[N.entropy], 4)}${target})` : "") + (m[N.gate] ? "" : ", so every weight stays 1") + ".");
      }
      if (x.selected && m[N.gate]) {
        const which = x.selected > 0 ? "W" : "M", key = x.selected > 0 ? N.W : N.M;
        parts.push(`It received <b>${which}</b>: weight ${fmt(x.weight, 3)}` + (m[key] !== undefined ? ` (${which} = ${fmt(m[key], 3)} at this step)` : "") + ".");
      } else if (x.selected && N.gate in m) parts.push("Selected, but the gate was off: its weight stays 1.");
    } else parts.push(`Weight ${fmt(x.weight, 3)}; selected flag ${fmt(x.selected)} (+1 = selected/kept/penalised by ${esc(method)}).`);
    if (x.clipped) parts.push(`The ratio was ${CLIP[x.clipped]}: this token's gradient was cut by the clipped surrogate.`);
    return parts.join(" ");
  }
  function tokenAt(ev) { const el = ev.target.closest && ev.target.closest(".tok"); return el && el.parentElement === $("tokens") ? el : null; }
  const tip = $("tooltip");
  $("tokens").addEventListener("mousemove", (ev) => {
    const el = tokenAt(ev);
    if (!el) { tip.hidden = true; return; }
    const t = DATA.tokens[byId.get(state.current)];
    tip.innerHTML = `<table>${detailRows(tokenInfo(t, +el.dataset.i))}</table>`;
    tip.hidden = false;
    tip.style.left = Math.min(ev.clientX + 14, innerWidth - 330) + "px";
    tip.style.top = Math.min(ev.clientY + 14, innerHeight - tip.offsetHeight - 4) + "px";
  });
  $("tokens").addEventListener("mouseleave", () => { tip.hidden = true; });
  $("tokens").addEventListener("click", (ev) => {
    const el = tokenAt(ev); if (!el) return;
    if (state.pinned) state.pinned.classList.remove("pinned");
    state.pinned = el; el.classList.add("pinned");
    const k = byId.get(state.current), x = tokenInfo(DATA.tokens[k], +el.dataset.i);
    $("why").innerHTML = `<b>Token ${x.i}</b><table>${detailRows(x)}</table><div class="explain">${explain(x, DATA.episodes[k])}</div>`;
  });

  // -- start: table, then the episode named in the URL (#episode=ID) -------------------------------
  renderTable();
  function openFromHash() {
    const m = location.hash.match(/^#episode=(.+)$/);
    if (m && decodeURIComponent(m[1]) !== state.current) openEpisode(decodeURIComponent(m[1]));
  }
  addEventListener("hashchange", openFromHash);
  const linked = location.hash.match(/^#episode=(.+)$/);
  if (linked && byId.has(decodeURIComponent(linked[1]))) {
    // a deep link opens with the episode first, under the title, and the page does not scroll: a
    // reload keeps it there, and a headless `chromium --screenshot` (which draws a page that
    // scrolls itself on load as a blank viewport) shows the episode. The curves and the table follow.
    history.scrollRestoration = "manual";
    document.querySelector("header.top").after($("episode-section"));
    openEpisode(decodeURIComponent(linked[1]), false);
  }
  openFromHash();
  window.agentrlViewer = { openEpisode, setOverlay: (n) => { $("ov-" + n).checked = true; state.overlay = n; applyOverlay(); } };
})();
