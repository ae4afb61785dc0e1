// ragkit web page: documents, upload, ask (streamed), citations, source viewer, compare.
// Plain JS, no build step, nothing loaded from another origin. Every request carries the
// access token (kept in sessionStorage) when one is set.
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "ragkit-token";
const state = {
  docs: [],            // [{doc_id, name, pages, sections, kind}]
  checked: new Set(),  // doc names
  asking: null,        // AbortController of the running question
  viewer: null,        // {doc_id, doc, kind, page, quote, requested}
  pageUrl: null,       // object URL of the page image shown
  checklists: [],
  compareJob: null,
};

// ------------------------------------------------------------------ requests

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function api(path, opts = {}) {
  const headers = new Headers(opts.headers || {});
  const t = token();
  if (t) headers.set("Authorization", "Bearer " + t);
  return fetch(path, { ...opts, headers });
}

async function errorText(res) {
  let text = "";
  try { text = await res.text(); } catch (e) { /* ignore */ }
  try {
    const j = JSON.parse(text);
    if (typeof j.detail === "string") return j.detail;
    if (Array.isArray(j.detail)) return j.detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
    if (j.error) return typeof j.error === "string" ? j.error : (j.error.message || JSON.stringify(j.error));
  } catch (e) { /* not JSON */ }
  if (res.status === 401) return "the server needs an access token (enter it at the top)";
  return text.slice(0, 300) || res.status + " " + res.statusText;
}

async function apiJson(path, opts) {
  const res = await api(path, opts);
  if (!res.ok) {
    const err = new Error(await errorText(res));
    err.status = res.status;
    throw err;
  }
  return res.json();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function locText(page, section) {
  const parts = [];
  if (page) parts.push("p. " + page);
  if (section) parts.push("§ " + section);
  return parts.join(", ");
}

// ------------------------------------------------------------------ token and health

function initToken() {
  $("token").value = token();
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = $("token").value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY);
    refreshAll();
  });
  $("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    refreshAll();
  });
}

async function loadHealth() {
  try {
    const h = await apiJson("/health");
    const bits = [`${h.documents ?? "?"} documents in the store`];
    if (h.generator) bits.push("model " + h.generator);
    if (h.busy) bits.push("busy");
    $("health").textContent = bits.join(" · ");
  } catch (e) {
    $("health").textContent = "Server unreachable: " + e.message;
  }
}

// ------------------------------------------------------------------ documents

function kindOf(docId, name) {
  const d = state.docs.find((x) => x.doc_id === docId) || state.docs.find((x) => x.name === name);
  if (d) return d.kind;
  const m = /\.([a-z0-9]+)$/i.exec(name || "");
  return m ? ({ markdown: "md" }[m[1].toLowerCase()] || m[1].toLowerCase()) : "other";
}

async function loadDocuments() {
  const list = $("doc-list");
  try {
    state.docs = await apiJson("/api/documents");
  } catch (e) {
    list.replaceChildren(el("li", { class: "error", text: "Cannot list documents: " + e.message }));
    return;
  }
  const names = new Set(state.docs.map((d) => d.name));
  for (const n of [...state.checked]) if (!names.has(n)) state.checked.delete(n);
  renderDocuments();
}

function renderDocuments() {
  const list = $("doc-list");
  const filter = $("doc-filter").value.trim().toLowerCase();
  list.replaceChildren();
  let shown = 0;
  for (const d of state.docs) {
    if (filter && !d.name.toLowerCase().includes(filter)) continue;
    shown += 1;
    const id = "doc-" + d.doc_id + "-" + shown;
    const meta = [d.kind.toUpperCase()];
    if (d.pages) meta.push(d.pages + (d.pages === 1 ? " page" : " pages"));
    if (d.sections) meta.push(d.sections + " sections");
    const box = el("input", { type: "checkbox", id, value: d.name, "data-doc-id": d.doc_id });
    box.checked = state.checked.has(d.name);
    box.addEventListener("change", () => {
      if (box.checked) state.checked.add(d.name); else state.checked.delete(d.name);
      updateScope();
    });
    list.append(el("li", {}, el("label", { for: id }, box,
      el("span", {}, el("span", { class: "doc-name", text: d.name }), el("span", { class: "doc-meta", text: meta.join(" · ") })))));
  }
  if (!state.docs.length) list.append(el("li", { class: "hint", text: "The store is empty: upload a document." }));
  else if (!shown) list.append(el("li", { class: "hint", text: "No document matches the filter." }));
  updateScope();
}

function updateScope() {
  const n = state.checked.size;
  $("scope").textContent = n === 0 ? `Asking across all ${state.docs.length} documents.`
    : `Asking ${n === 1 ? "" : n + " documents: "}${[...state.checked].join(", ")}.`;
  $("compare-scope").textContent = n >= 2 ? `Comparing ${[...state.checked].join(", ")}.`
    : "Check two or more documents in the list to compare them.";
  $("compare-btn").disabled = n < 2;
}

function initDocuments() {
  $("doc-filter").addEventListener("input", renderDocuments);
  $("check-all").addEventListener("click", () => {
    const filter = $("doc-filter").value.trim().toLowerCase();
    for (const d of state.docs) if (!filter || d.name.toLowerCase().includes(filter)) state.checked.add(d.name);
    renderDocuments();
  });
  $("check-none").addEventListener("click", () => { state.checked.clear(); renderDocuments(); });
}

// ------------------------------------------------------------------ jobs

async function pollJob(id, onUpdate) {
  for (;;) {
    const job = await apiJson("/api/jobs/" + encodeURIComponent(id));
    onUpdate(job);
    if (job.status === "done" || job.status === "error") return job;
    await new Promise((r) => setTimeout(r, 600));
  }
}

function showProgress(bar, job) {
  bar.hidden = false;
  bar.max = Math.max(job.total || 0, 1);
  bar.value = Math.min(job.done || 0, bar.max);
}

// ------------------------------------------------------------------ upload

function initUpload() {
  $("upload-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const input = $("upload-files");
    if (!input.files.length) { $("upload-status").textContent = "Choose one or more files first."; return; }
    const form = new FormData();
    for (const f of input.files) form.append("files", f, f.name);
    const btn = $("upload-btn");
    const bar = $("upload-progress");
    const results = $("upload-results");
    btn.disabled = true;
    results.replaceChildren();
    bar.hidden = false; bar.removeAttribute("value");
    $("upload-status").textContent = `Uploading ${input.files.length} file(s)…`;
    try {
      const first = await apiJson("/api/upload", { method: "POST", body: form });
      const job = await pollJob(first.id, (j) => {
        showProgress(bar, j);
        const what = j.current ? ` — ${j.current}${j.detail ? " (" + j.detail + ")" : ""}` : "";
        $("upload-status").textContent = j.status === "queued" ? "Waiting for another ingest to finish…"
          : `Ingesting: ${j.done} of ${j.total} file(s) done${what}`;
      });
      for (const f of job.files) {
        const ok = !f.error;
        results.append(el("li", { class: ok ? "ok" : "error" },
          `${f.file}: ` + (ok ? `${f.status}${f.chunks != null ? " (" + f.chunks + " chunks)" : ""}` : f.error)));
      }
      if (job.status === "error") $("upload-status").textContent = "Upload failed: " + job.error;
      else {
        const r = job.result || {};
        const bad = (r.failed || []).length;
        $("upload-status").textContent = `Done: ${r.added || 0} added, ${r.updated || 0} updated, ${r.unchanged || 0} unchanged` +
          (bad ? `, ${bad} failed` : "") + ".";
      }
      input.value = "";
      await loadDocuments();
      loadHealth();
    } catch (e) {
      $("upload-status").textContent = "Upload failed: " + e.message;
      $("upload-status").classList.add("error");
      setTimeout(() => $("upload-status").classList.remove("error"), 8000);
    } finally {
      btn.disabled = false;
      bar.hidden = true;
    }
  });
}

// ------------------------------------------------------------------ ask

function splitSources(text) {
  const at = text.indexOf("\n\nSources:\n");
  return at < 0 ? [text, ""] : [text.slice(0, at), text.slice(at + 2)];
}

function renderAnswer(text) {
  const [body, sources] = splitSources(text);
  $("answer").textContent = body;
  $("sources-text").textContent = sources;
  $("sources-block").hidden = !sources;
}

function renderWarnings(meta, citations, claims) {
  const box = $("ask-warning");
  const msgs = [];
  const unsupported = (claims || []).filter((c) => !c.supported).length;
  if (unsupported && !(meta && meta.unsupported_answer)) {
    msgs.push(`${unsupported} of ${claims.length} claims are not supported by any source sentence (marked below): do not rely on them.`);
  }
  if (meta && meta.outcome === "unverified") {
    msgs.push("Not verified against the sources" + (meta.unverified_reason ? ` (${meta.unverified_reason})` : "") +
      ": the passages below are the documents' own words" + (meta.model_answer ? "; the model's answer is shown apart, marked as not verified." : "."));
  } else if (meta && (meta.outcome === "not_found" || (!meta.outcome && meta.abstained))) {
    msgs.push("The documents do not answer this question" + (meta.abstain_reason ? ` (${meta.abstain_reason})` : "") + ".");
  }
  if (meta && meta.invalid_citations && meta.invalid_citations.length) {
    msgs.push(`The answer cites source(s) ${meta.invalid_citations.map((n) => "[" + n + "]").join(", ")} that were not given to the model: do not rely on those statements.`);
  }
  if (citations && citations.some((c) => c.inferred)) {
    msgs.push("Sources marked “inferred” were matched by wording: the model gave no citation for them.");
  }
  box.replaceChildren(...msgs.map((m) => el("p", { text: m })));
  box.hidden = msgs.length === 0;
}

function renderOutcome(meta) {
  // the end state of an answer (the final chunk's `ragkit` object): an unverified answer
  // shows "Not verified against the sources" and the passages that answer the question
  // best, each opening its page; the model's own text only in a block marked unverified;
  // a quoted answer (a question asking for the clause) lists its quotes the same way
  let box = $("passages-box");
  if (!box) {
    box = el("div", { id: "passages-box" });
    $("answer").after(box);
  }
  box.replaceChildren();
  if (!meta) return;
  const passages = meta.passages || [];
  if (meta.answer_kind === "per_document" && (meta.findings || []).length) {
    // a question over several documents, answered document by document: each document's
    // name, its outcome and what it says (or, not verified, the passages that say it)
    const label = { supported: "supported", unverified: "not verified", not_found: "nothing on point" };
    $("answer").replaceChildren(...meta.findings.map((f) => el("div", { class: "finding", "data-outcome": f.outcome },
      el("strong", { text: f.doc }), el("span", { class: "badge", text: " " + (label[f.outcome] || f.outcome) + " " }),
      el("div", { class: "finding-text", text: f.answer }))));
    return;
  }
  if (meta.outcome === "unverified") {
    const head = [el("p", { class: "outcome unverified", "data-outcome": "unverified" }, el("strong", { text: "Not verified against the sources." }))];
    if (meta.model_answer && !/the documents do not say/i.test(meta.model_answer)) {
      head.push(el("div", { class: "claim unsupported model-answer" },
        el("span", { class: "badge", text: "the model's answer, not verified" }), el("span", { class: "claim-text", text: " " + meta.model_answer })));
    }
    $("answer").replaceChildren(...head);
  } else if (meta.outcome === "supported" && meta.answer_kind === "quoted") {
    $("answer").replaceChildren(el("p", { class: "outcome quoted", "data-outcome": "supported", text: "Quoted from the documents:" }));
  } else {
    return;
  }
  if (!passages.length) return;
  const list = el("ol", { id: "passages", class: "claims", "aria-label": "The passages that answer the question best" });
  for (const p of passages) {
    const where = `[${p.n}] ${p.doc}${locText(p.page, p.section) ? " · " + locText(p.page, p.section) : ""}`;
    const link = el("button", { type: "button", class: "link where", text: where });
    link.addEventListener("click", () => openViewer({ doc_id: p.doc_id, doc: p.doc, page: p.page, section: p.section, quote: p.quote }));
    list.append(el("li", { class: "claim supported passage" }, el("blockquote", {}, el("span", { text: "“" + p.quote + "” " }), link)));
  }
  box.append(el("h3", { text: meta.outcome === "unverified" ? "The passages that answer the question best" : "Passages" }), list);
}

function renderClaims(claims) {
  // each claim of the answer with the source sentence that supports it; a claim no source
  // sentence supports is marked "not supported" (never shown as if it were cited)
  const list = $("claims");
  list.replaceChildren();
  claims = claims || [];
  $("claims-heading").hidden = !claims.length;
  for (const c of claims) {
    const li = el("li", { class: "claim " + (c.supported ? "supported" : "unsupported") },
      el("span", { class: "claim-text", text: c.text }),
      el("span", { class: "badge", text: c.supported ? "supported" : "not supported by the sources" }));
    if (c.flagged_markers && c.flagged_markers.length) {
      li.append(el("span", { class: "badge flagged", text: "cites " + c.flagged_markers.map((n) => "[" + n + "]").join(", ") + ", which does not say this" }));
    }
    if (c.missing_figures && c.missing_figures.length) {
      li.append(el("span", { class: "where", text: " (not in the sources: " + c.missing_figures.join(", ") + ")" }));
    }
    for (const comp of c.computed_figures || []) {
      const cells = comp.cells.map((x) => x.label ? `${x.written} (${x.label})` : x.written).join("; ");
      li.append(el("span", { class: "where", text: ` (computed: ${comp.formula}, from ${cells})` }));
    }
    if (c.missing_names && c.missing_names.length) {
      li.append(el("span", { class: "where", text: " (names what its source does not: " + c.missing_names.join(", ") + ")" }));
    }
    for (const s of c.citations || []) {
      const where = `[${s.n}] ${s.doc}${locText(s.page, s.section) ? " · " + locText(s.page, s.section) : ""}${s.inferred ? " (inferred)" : ""}`;
      const link = el("button", { type: "button", class: "link where", text: where });
      link.addEventListener("click", () => openViewer({ doc_id: s.doc_id, doc: s.doc, page: s.page, section: s.section, quote: s.quote }));
      li.append(el("blockquote", {}, el("span", { text: "“" + s.quote + "” " }), link));
    }
    list.append(li);
  }
}

function renderChips(citations) {
  const list = $("chips");
  list.replaceChildren();
  $("chips-heading").hidden = !citations.length;
  citations.forEach((c, i) => {
    const label = `${c.doc}${locText(c.page, c.section) ? " · " + locText(c.page, c.section) : ""}`;
    const chip = el("button", {
      type: "button", class: "chip" + (c.inferred ? " inferred" : ""), "aria-pressed": "false",
      "data-n": c.n, "data-doc-id": c.doc_id, "data-page": c.page, title: c.quote ? "“" + c.quote + "”" : null,
      "aria-label": `Source ${c.n}: ${label}${c.inferred ? " (inferred)" : ""}. Show it.`,
    }, el("span", { class: "n", text: "[" + c.n + "]" }), label, c.inferred ? el("span", { class: "tag", text: "inferred" }) : null);
    chip.addEventListener("click", () => {
      for (const b of list.querySelectorAll(".chip")) b.setAttribute("aria-pressed", "false");
      chip.setAttribute("aria-pressed", "true");
      openViewer({ doc_id: c.doc_id, doc: c.doc, page: c.page, section: c.section, quote: c.quote });
    });
    list.append(el("li", {}, chip));
  });
}

async function ask(question) {
  const ctrl = new AbortController();
  state.asking = ctrl;
  $("ask-btn").disabled = true;
  $("stop-btn").hidden = false;
  $("answer").setAttribute("aria-busy", "true");
  renderAnswer("");
  renderChips([]);
  renderClaims([]);
  renderWarnings(null, null);
  renderOutcome(null);
  $("answer").textContent = "…";
  const body = { model: "ragkit", messages: [{ role: "user", content: question }], stream: true };
  if (state.checked.size) body.docs = [...state.checked];
  let text = "";
  let citations = [];
  let claims = [];
  let meta = null;
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: ctrl.signal,
    });
    if (!res.ok) throw new Error(await errorText(res));
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let done = false;
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (!line.startsWith("data:")) continue;  // comments, event names, blank separators
        const data = line.slice(5).trim();
        if (data === "[DONE]") { done = true; break; }
        let chunk;
        try { chunk = JSON.parse(data); } catch (e) { continue; }
        if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) { text += delta.content; renderAnswer(text); }
        if (Array.isArray(chunk.citations)) citations = chunk.citations;
        if (Array.isArray(chunk.claims)) claims = chunk.claims;
        if (chunk.ragkit) meta = chunk.ragkit;
      }
    }
    renderAnswer(text);
    renderChips(citations);
    renderClaims(claims);
    renderWarnings(meta, citations, claims);
    if (!text) $("answer").textContent = "(no answer)";
    renderOutcome(meta);
  } catch (e) {
    if (e.name === "AbortError") renderAnswer(text + (text ? "\n\n" : "") + "[stopped]");
    else {
      const box = $("ask-warning");
      box.replaceChildren(el("p", { class: "error", text: "The question failed: " + e.message }));
      box.hidden = false;
      if (!text) $("answer").textContent = "";
    }
  } finally {
    state.asking = null;
    $("ask-btn").disabled = false;
    $("stop-btn").hidden = true;
    $("answer").setAttribute("aria-busy", "false");
    loadHealth();
  }
}

function initAsk() {
  $("ask-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = $("question").value.trim();
    if (q && !state.asking) ask(q);
  });
  $("question").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); $("ask-form").requestSubmit(); }
  });
  $("stop-btn").addEventListener("click", () => state.asking && state.asking.abort());
}

// ------------------------------------------------------------------ viewer

function closeViewer() {
  $("viewer").hidden = true;
  $("layout").classList.remove("viewing");
  if (state.pageUrl) { URL.revokeObjectURL(state.pageUrl); state.pageUrl = null; }
  state.viewer = null;
  const pressed = document.querySelector(".chip[aria-pressed=true]");
  if (pressed) { pressed.setAttribute("aria-pressed", "false"); pressed.focus(); }
}

async function openViewer(src) {
  const kind = kindOf(src.doc_id, src.doc);
  state.viewer = { ...src, kind, requested: src.page };
  $("viewer").hidden = false;
  $("layout").classList.add("viewing");
  $("viewer-title").textContent = src.doc;
  $("viewer-info").textContent = "Loading…";
  if (kind === "pdf") {
    $("section-view").hidden = true;
    await showPage(src.page || 1, src.quote, src.page || 1);
  } else {
    $("page-wrap").hidden = true;
    $("page-nav").hidden = true;
    await showSection(src);
  }
  $("viewer-title").focus();
}

async function showPage(page, quote, requested) {
  const v = state.viewer;
  const q = quote ? "?quote=" + encodeURIComponent(quote) : "";
  const base = `/api/documents/${encodeURIComponent(v.doc_id)}/page/`;
  try {
    const boxes = await apiJson(`${base}${page}/boxes${q}`);
    const res = await api(`${base}${boxes.page}.png`);
    if (!res.ok) throw new Error(await errorText(res));
    const blob = await res.blob();
    if (state.viewer !== v) return;  // another source was opened meanwhile
    const img = $("page-img");
    const url = URL.createObjectURL(blob);
    await new Promise((resolve, reject) => {
      img.onload = resolve;
      img.onerror = () => reject(new Error("the page image could not be shown"));
      img.src = url;
    });
    if (state.pageUrl) URL.revokeObjectURL(state.pageUrl);
    state.pageUrl = url;
    img.alt = `${v.doc}, page ${boxes.page}` + (boxes.boxes.length ? ", with the quote highlighted" : "");
    v.page = boxes.page;
    v.pages = boxes.pages;
    v.quote = quote;
    drawOverlay(boxes);
    $("page-wrap").hidden = false;
    $("page-nav").hidden = false;
    $("page-label").textContent = `Page ${boxes.page} of ${boxes.pages}`;
    $("prev-page").disabled = boxes.page <= 1;
    $("next-page").disabled = boxes.page >= boxes.pages;
    $("viewer-info").textContent = describeMatch(boxes, quote, requested);
    const first = $("overlay").firstElementChild;
    const zoomed = $("page-scroll").classList.contains("zoomed");
    if (first) first.scrollIntoView({ block: zoomed ? "center" : "nearest", inline: zoomed ? "center" : "nearest", behavior: "instant" });
  } catch (e) {
    $("viewer-info").textContent = "Cannot show the page: " + e.message;
    $("page-wrap").hidden = true;
  }
}

function describeMatch(b, quote, requested) {
  if (!quote) return "";
  if (b.match === "full") {
    return b.page !== requested ? `The quote is on page ${b.page} (the citation names page ${requested}, where its passage starts).`
      : "The quote is highlighted.";
  }
  if (b.match === "partial") return `Part of the quote is highlighted; the rest is on page ${b.continues || "next"}.`;
  return "The quote was not found on this page's text layer; showing the cited page.";
}

function drawOverlay(b) {
  const overlay = $("overlay");
  overlay.replaceChildren();
  for (const [x0, y0, x1, y1] of b.boxes) {
    const d = el("div", { class: "hl" });
    // percentages of the image, so the boxes follow the image at any displayed size
    d.style.left = (100 * x0 / b.width) + "%";
    d.style.top = (100 * y0 / b.height) + "%";
    d.style.width = (100 * (x1 - x0) / b.width) + "%";
    d.style.height = (100 * (y1 - y0) / b.height) + "%";
    overlay.append(d);
  }
}

async function showSection(src) {
  const params = new URLSearchParams();
  if (src.section) params.set("section", src.section);
  if (src.chunk !== undefined && src.chunk !== null) params.set("chunk", src.chunk);
  if (src.quote) params.set("quote", src.quote);
  const view = $("section-view");
  try {
    const s = await apiJson(`/api/documents/${encodeURIComponent(src.doc_id)}/section?${params}`);
    view.innerHTML = s.html;  // the server escaped the text; only <mark> is markup
    view.hidden = false;
    $("viewer-info").textContent = (s.section ? "§ " + s.section : "") + (s.found ? " — the quote is marked." : src.quote ? " — the quote was not found in this section." : "");
    const mark = view.querySelector("mark");
    if (mark) mark.scrollIntoView({ block: "center", behavior: "instant" });
  } catch (e) {
    view.hidden = true;
    $("viewer-info").textContent = "Cannot show the section: " + e.message;
  }
}

function setZoom(on) {
  $("page-scroll").classList.toggle("zoomed", on);
  $("zoom-btn").setAttribute("aria-pressed", String(on));
  $("zoom-btn").textContent = on ? "Fit to panel" : "Zoom in";
  const first = $("overlay").firstElementChild;
  if (first) first.scrollIntoView({ block: "center", inline: "center", behavior: "instant" });
}

function initViewer() {
  $("viewer-close").addEventListener("click", closeViewer);
  $("zoom-btn").addEventListener("click", () => setZoom(!$("page-scroll").classList.contains("zoomed")));
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && !$("viewer").hidden) closeViewer();
  });
  $("prev-page").addEventListener("click", () => {
    const v = state.viewer;
    if (v && v.page > 1) showPage(v.page - 1, null, v.page - 1);
  });
  $("next-page").addEventListener("click", () => {
    const v = state.viewer;
    if (v && v.page < (v.pages || 1)) showPage(v.page + 1, null, v.page + 1);
  });
}

// ------------------------------------------------------------------ compare

async function loadChecklists() {
  try {
    state.checklists = await apiJson("/api/checklists");
  } catch (e) {
    $("compare-status").textContent = "Cannot load the checklists: " + e.message;
    return;
  }
  const sel = $("checklist");
  sel.replaceChildren(...state.checklists.map((c) => el("option", { value: c.name, text: c.name })));
  renderItems();
}

function renderItems() {
  const c = state.checklists.find((x) => x.name === $("checklist").value);
  const list = $("item-list");
  list.replaceChildren();
  if (!c) return;
  // a few clauses by default: each one runs the model once per document
  const preset = new Set(["term", "governing-law", "nda-19", "nda-20"]);
  c.items.forEach((it, i) => {
    const id = "item-" + i;
    const box = el("input", { type: "checkbox", id, value: it.id });
    box.checked = preset.has(it.id);
    list.append(el("label", { for: id, title: it.question }, box, `${it.title}`));
  });
}

function chosenItems() {
  return [...$("item-list").querySelectorAll("input:checked")].map((b) => b.value);
}

function renderComparison(result) {
  const table = $("compare-table");
  table.replaceChildren();
  const head = el("tr", {}, el("th", { scope: "col", text: "Clause" }),
    ...result.docs.map((d) => el("th", { scope: "col", text: d })), el("th", { scope: "col", text: "Difference" }));
  table.append(el("thead", {}, head));
  const body = el("tbody");
  for (const row of result.rows) {
    const tr = el("tr", { class: row.difference.startsWith("differs") ? "differs" : null },
      el("th", { scope: "row" }, row.title, el("br"), el("small", { text: row.question })));
    for (const d of result.docs) {
      const f = row.findings[d];
      const td = el("td");
      if (!f) { td.textContent = "-"; tr.append(td); continue; }
      td.append(el("span", { class: "label", text: f.label }));
      if (f.confidence !== null && f.confidence !== undefined) td.append(el("span", { class: "prob", text: ` (${Math.round(f.confidence * 100)}%)` }));
      if (f.label === "Not mentioned" && f.quote) td.append(el("small", { text: " closest clause" }));
      if (f.quote) {
        const doc = state.docs.find((x) => x.name === d || x.name === f.doc);
        const q = el("button", {
          type: "button", class: "quote", text: "“" + f.quote + "”",
          "aria-label": `Show the quote in ${d}${f.page ? ", page " + f.page : ""}`,
        });
        q.addEventListener("click", () => doc && openViewer({ doc_id: doc.doc_id, doc: doc.name, page: f.page, section: f.section, quote: f.quote }));
        td.append(q, el("small", { text: locText(f.page, f.section) }));
      } else td.append(el("small", { text: " not found" }));
      if (f.note) td.append(el("span", { class: "note", text: "⚠ " + f.note }));
      tr.append(td);
    }
    tr.append(el("td", { text: row.difference }));
    body.append(tr);
  }
  table.append(body);
}

async function exportComparison(ev, fmt) {
  ev.preventDefault();
  const id = state.compareJob;
  if (!id) return;
  try {
    const res = await api(`/api/compare/${id}.${fmt}`);
    if (!res.ok) throw new Error(await errorText(res));
    const url = URL.createObjectURL(await res.blob());
    const a = el("a", { href: url, download: `ragkit-compare.${fmt}` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) {
    $("compare-status").textContent = "Export failed: " + e.message;
  }
}

function initCompare() {
  $("checklist").addEventListener("change", renderItems);
  $("items-all").addEventListener("click", () => { for (const b of $("item-list").querySelectorAll("input")) b.checked = true; });
  $("items-none").addEventListener("click", () => { for (const b of $("item-list").querySelectorAll("input")) b.checked = false; });
  $("export-html").addEventListener("click", (ev) => exportComparison(ev, "html"));
  $("export-md").addEventListener("click", (ev) => exportComparison(ev, "md"));
  $("export-docx").addEventListener("click", (ev) => exportComparison(ev, "docx"));
  $("compare-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const docs = [...state.checked];
    const items = chosenItems();
    if (docs.length < 2) { $("compare-status").textContent = "Check two or more documents."; return; }
    if (!items.length) { $("compare-status").textContent = "Choose at least one clause."; return; }
    const btn = $("compare-btn");
    const bar = $("compare-progress");
    btn.disabled = true;
    $("compare-exports").hidden = true;
    $("compare-table").replaceChildren();
    $("compare-status").textContent = "Starting…";
    try {
      const first = await apiJson("/api/compare", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ docs, checklist: $("checklist").value, items }),
      });
      state.compareJob = first.id;
      const job = await pollJob(first.id, (j) => {
        showProgress(bar, j);
        $("compare-status").textContent = j.status === "queued" ? "Waiting for the model…"
          : `${j.done} of ${j.total} checks done${j.current ? " — " + j.current : ""}`;
      });
      if (job.status === "error") throw new Error(job.error);
      renderComparison(job.result);
      $("compare-status").textContent = `Done in ${job.seconds} s. Labels come from a small local model: check each quote.`;
      $("compare-exports").hidden = false;
    } catch (e) {
      $("compare-status").textContent = "Comparison failed: " + e.message;
    } finally {
      btn.disabled = state.checked.size < 2;
      bar.hidden = true;
    }
  });
}

// ------------------------------------------------------------------ tabs

function initTabs() {
  const tabs = [$("tab-ask"), $("tab-compare")];
  const select = (tab) => {
    for (const t of tabs) {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      $(t.getAttribute("aria-controls")).hidden = !on;
    }
    tab.focus();
  };
  tabs.forEach((t, i) => {
    t.addEventListener("click", () => select(t));
    t.addEventListener("keydown", (ev) => {
      if (ev.key === "ArrowRight" || ev.key === "ArrowLeft") {
        ev.preventDefault();
        select(tabs[(i + (ev.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length]);
      }
    });
  });
}

function refreshAll() {
  loadHealth();
  loadDocuments();
  loadChecklists();
}

document.addEventListener("DOMContentLoaded", () => {
  initToken();
  initDocuments();
  initUpload();
  initAsk();
  initViewer();
  initCompare();
  initTabs();
  refreshAll();
});
