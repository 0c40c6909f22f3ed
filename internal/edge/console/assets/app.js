// tlgate console: plain JavaScript, no dependencies. Every change to the
// page goes through DOM calls with textContent (never markup from data), so
// a worker id or route name is always shown as text.
"use strict";
(() => {
  const SVGNS = "http://www.w3.org/2000/svg";
  const KEY = "tlgate.adminKey";
  const FLEET_POLL_MS = 1000;
  const TRAFFIC_POLL_MS = 2000;
  const $ = (id) => document.getElementById(id);

  const st = {
    key: sessionStorage.getItem(KEY) || "",
    authOff: false,
    page: "",
    timer: 0,
    gen: 0,
    lastOK: 0,
    skew: 0,
    fleet: { cards: new Map() },
    routes: { etag: "", epoch: 0, loadedText: "" },
    traffic: { model: "", data: null },
  };

  // ---- DOM helpers ----
  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    setProps(e, props);
    for (const k of kids.flat()) if (k !== null && k !== undefined && k !== false) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function sv(tag, attrs, ...kids) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  function setProps(e, props) {
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k === "on") for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
      else if (k === "style") Object.assign(e.style, v);
      else if (k.startsWith("data-") || k === "title" || k === "role" || k.startsWith("aria-")) e.setAttribute(k, v);
      else e[k] = v;
    }
  }
  function clear(e) { while (e.firstChild) e.firstChild.remove(); }
  function toast(msg, bad) {
    const t = $("toast");
    t.textContent = msg;
    t.className = "toast" + (bad ? " bad" : "");
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
  }

  // ---- API ----
  class AuthError extends Error {}

  async function api(method, path, opts) {
    const o = opts || {};
    const headers = Object.assign({}, o.headers);
    if (st.key) headers.Authorization = "Bearer " + st.key;
    if (o.body !== undefined) headers["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(path, { method, headers, body: o.body, cache: "no-store" });
    } catch (err) {
      live(false, "gateway unreachable");
      throw err;
    }
    // The gateway's clock, for heartbeat ages: the Date header has 1 s
    // resolution, so only a larger skew is corrected.
    const served = Date.parse(res.headers.get("Date") || "");
    if (served) st.skew = Math.abs(served - Date.now()) > 1500 ? served - Date.now() : 0;
    const text = await res.text();
    let json = null;
    try { json = JSON.parse(text); } catch (_) { json = null; }
    if (res.status === 401 || res.status === 403) {
      const msg = res.status === 401 ? "That key was not accepted." : "That key lacks the admin scope.";
      if (!o.probe) needKey(msg);
      throw new AuthError(msg);
    }
    live(true);
    return { status: res.status, ok: res.ok, json, text, etag: res.headers.get("ETag") || "" };
  }
  function errMessage(r) {
    return (r.json && r.json.error && r.json.error.message) || ("HTTP " + r.status);
  }

  function live(ok, why) {
    const l = $("live");
    l.hidden = false;
    if (ok) {
      st.lastOK = Date.now();
      l.className = "live ok";
      l.textContent = st.authOff ? "live · no keys configured" : "live";
    } else {
      l.className = "live bad";
      l.textContent = why || "error";
    }
  }

  // ---- key and navigation ----
  function needKey(msg) {
    stopPolling();
    st.key = "";
    sessionStorage.removeItem(KEY);
    for (const p of document.querySelectorAll(".page")) p.hidden = true;
    $("nav").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = msg || "";
    $("key").focus();
  }

  async function start() {
    if (!st.key) {
      // A gateway without keys (loopback only) needs none.
      try {
        const r = await api("GET", "/admin/v1/workers", { probe: true });
        if (r.ok) { st.authOff = true; live(true); show(); return; }
      } catch (_) { /* asks for the key below */ }
      needKey("");
      return;
    }
    show();
  }

  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const k = $("key").value.trim();
    if (!k) { $("login-error").textContent = "Enter a key."; return; }
    st.key = k;
    try {
      const r = await api("GET", "/admin/v1/workers", { probe: true });
      if (!r.ok) { $("login-error").textContent = errMessage(r); return; }
    } catch (err) {
      st.key = "";
      $("login-error").textContent = err.message;
      return;
    }
    sessionStorage.setItem(KEY, k);
    $("key").value = "";
    show();
  });
  $("forget").addEventListener("click", () => needKey(""));
  window.addEventListener("hashchange", () => { if ($("login").hidden) show(); });

  function show() {
    const page = (location.hash || "#fleet").slice(1).split("?")[0];
    const pages = { fleet: fleetPage, routes: routesPage, traffic: trafficPage };
    const fn = pages[page] || fleetPage;
    const name = pages[page] ? page : "fleet";
    stopPolling();
    $("login").hidden = true;
    $("nav").hidden = false;
    $("forget").hidden = st.authOff;
    for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== "page-" + name;
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === name);
    st.page = name;
    document.title = "tlgate · " + name;
    fn();
  }

  // poll runs fn now and every ms after each run ends, until the page
  // changes (stopPolling bumps the generation).
  function poll(fn, every) {
    const gen = st.gen;
    const tick = async () => {
      try { await fn(); } catch (err) { if (!(err instanceof AuthError)) live(false, String(err.message || err)); }
      if (st.gen === gen) st.timer = setTimeout(tick, every);
    };
    st.timer = setTimeout(tick, 0);
  }
  function stopPolling() { clearTimeout(st.timer); st.timer = 0; st.gen++; }

  // ---- formatting ----
  function now() { return Date.now() + (st.skew || 0); }
  function ago(iso) {
    const t = Date.parse(iso);
    if (!t) return "never";
    const s = Math.max(0, (now() - t) / 1000);
    if (s < 10) return s.toFixed(1) + " s";
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    return Math.round(s / 3600) + " h";
  }
  function fmtMs(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (v === 0) return "0";
    if (v >= 1000) return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + " s";
    if (v >= 10) return Math.round(v) + " ms";
    if (v >= 1) return v.toFixed(1) + " ms";
    return v.toFixed(2) + " ms";
  }
  function fmtNum(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (Number.isInteger(v)) return String(v);
    return v < 10 ? v.toFixed(2) : v.toFixed(1);
  }
  // modelPath is a model id as one path segment: every "/" is sent as %2F,
  // so the browser never resolves a "." or ".." segment into another
  // model's path (the admin API decodes the segment whole).
  function modelPath(m) { return encodeURIComponent(m); }

  // ---- fleet ----
  function workerState(w) {
    if (w.state === "down") {
      return { name: "down", label: "down", cls: "bad", title: w.last_error || "its probes fail" };
    }
    if (w.ejected_until) {
      const until = Date.parse(w.ejected_until);
      if (!until || until > now()) {
        const left = until ? " · " + Math.ceil((until - now()) / 1000) + " s" : "";
        const times = w.ejections > 1 ? ` (ejected ${w.ejections} times)` : "";
        return { name: "ejected", label: "ejected" + left, cls: "bad", title: (w.ejection_reason || "") + times };
      }
    }
    if (w.drained) return { name: "drained", label: "drained", cls: "warn", title: "an operator drained this model" };
    if (w.draining) return { name: "draining", label: "draining", cls: "warn", title: "the engine reports it is draining" };
    if (!w.routable) return { name: "unroutable", label: "not routable", cls: "bad", title: "" };
    if (w.consecutive_failures > 0) {
      const n = w.consecutive_failures;
      return { name: "suspect", label: "suspect", cls: "warn",
        title: `${n} failed attempt${n > 1 ? "s" : ""} in a row; one request at a time until it answers` };
    }
    return { name: "routable", label: "routable", cls: "ok", title: "" };
  }
  // takesRequests: routable, suspect included (it still takes requests, one
  // at a time).
  function takesRequests(w) {
    const s = workerState(w).name;
    return s === "routable" || s === "suspect";
  }
  function cap(s) { return s.charAt(0).toUpperCase() + s.slice(1); }
  function prefixFields(w) {
    return Object.keys(w).filter((k) => k.startsWith("prefix") && typeof w[k] === "number");
  }
  function kvBar(w) {
    const total = w.kv_total_blocks || 0;
    const used = Math.max(0, total - (w.kv_free_blocks || 0));
    const pct = total ? (100 * used) / total : 0;
    const cls = pct >= 90 ? "bar bad" : pct >= 70 ? "bar warn" : "bar";
    return el("div", { class: "kv", title: total ? `${used} of ${total} blocks used (${w.kv_block_tokens || "?"} tokens each)` : "no KV report" },
      el("div", { class: cls }, el("span", { style: { width: pct.toFixed(1) + "%" } })),
      el("span", { class: "num", text: total ? Math.round(pct) + "%" : "–" }));
  }

  // cacheChip shows how cache_aware sees the worker's KV cache: exact
  // (its KV events, with the blocks held per tier), stale (events lost or
  // late: the prefix index until they flow) or approximate (the prefix
  // index).
  function cacheChip(w) {
    const view = w.cache_view || "approximate";
    const blocks = w.kv_blocks || {};
    const tiers = Object.keys(blocks).sort().map((t) => `${fmtNum(blocks[t])} ${t}`).join(", ");
    const cls = view === "exact" ? "ok" : view === "stale" ? "warn" : "";
    const title = view === "exact" ? `from its KV events: ${tiers || "no block"} held` :
      view === "stale" ? "its KV events were lost or are late: routed on the prefix index until they flow again" :
      w.kv_events ? "subscribed to its KV events, none yet: routed on the prefix index" : "no KV events: the prefix index";
    return el("span", { class: "chip " + cls, "data-cache-view": view, text: view, title });
  }

  function fleetPage() { poll(refreshFleet, FLEET_POLL_MS); }

  async function refreshFleet() {
    const r = await api("GET", "/admin/v1/workers");
    if (!r.ok) { live(false, errMessage(r)); return; }
    if (st.page !== "fleet") return;
    const workers = (r.json && r.json.workers) || [];
    const byModel = new Map();
    for (const w of workers) {
      if (!byModel.has(w.model)) byModel.set(w.model, []);
      byModel.get(w.model).push(w);
    }
    const models = [...byModel.keys()].sort();
    const routable = workers.filter((w) => takesRequests(w)).length;
    const queued = (r.json && r.json.queued) || {};
    const bands = (r.json && r.json.queued_bands) || {};
    const waiting = Object.values(queued).reduce((a, b) => a + b, 0);
    $("fleet-summary").textContent = `${workers.length} workers · ${routable} routable · ${models.length} models · epoch ${r.json ? r.json.epoch : "?"}` +
      (waiting ? ` · ${waiting} waiting for admission` : "");
    const root = $("fleet-models");
    const cards = st.fleet.cards;
    for (const [m, c] of cards) if (!byModel.has(m)) { c.card.remove(); cards.delete(m); }
    if (!models.length) {
      if (!root.querySelector(".empty")) root.append(el("p", { class: "empty muted", text: "No workers have registered yet." }));
    } else {
      for (const e of root.querySelectorAll(".empty")) e.remove();
    }
    const prefixKeys = [...new Set(workers.flatMap(prefixFields))].sort();
    let prev = null;
    for (const m of models) {
      let c = cards.get(m);
      if (!c) { c = modelCard(m); cards.set(m, c); }
      // Keep the cards in model order without re-creating them (a click
      // in flight must not land on a replaced button).
      const want = prev ? prev.nextSibling : root.firstChild;
      if (want !== c.card) root.insertBefore(c.card, want);
      prev = c.card;
      fillCard(c, byModel.get(m).sort((a, b) => a.id.localeCompare(b.id)), prefixKeys, queued[m] || 0, bands[m] || []);
    }
  }

  function modelCard(model) {
    const drain = el("button", { type: "button", text: "Drain", "data-action": "drain", "data-model": model, on: { click: () => drainModel(model, true) } });
    const resume = el("button", { type: "button", text: "Resume", "data-action": "resume", "data-model": model, on: { click: () => drainModel(model, false) } });
    const counts = el("span", { class: "muted" });
    const badge = el("span", { class: "chip" });
    const thead = el("thead");
    const tbody = el("tbody");
    const bands = el("div", { class: "bands muted" });
    const card = el("div", { class: "card model", "data-model": model },
      el("div", { class: "cardhead" },
        // A down engine whose model no probe has read yet has none.
        el("h3", { text: model || "(model not known yet)" }), badge, counts, el("span", { class: "grow" }), model ? drain : null, model ? resume : null),
      bands,
      el("table", { class: "grid workers" }, thead, tbody));
    return { card, drain, resume, counts, badge, bands, thead, tbody, headKey: "" };
  }

  // fillBands lists the requests waiting for admission by priority band
  // (highest first) and API key; a negative band is sheddable.
  function fillBands(div, bands) {
    clear(div);
    const byPrio = new Map();
    for (const b of bands) {
      if (!byPrio.has(b.priority)) byPrio.set(b.priority, []);
      byPrio.get(b.priority).push(b);
    }
    const prios = [...byPrio.keys()].sort((a, b) => b - a);
    div.hidden = prios.length === 0;
    if (!prios.length) return;
    div.append(el("span", { text: "Waiting by priority: " }));
    for (const p of prios) {
      const list = byPrio.get(p);
      const n = list.reduce((a, b) => a + b.waiting, 0);
      div.append(el("span", { class: "chip " + (p < 0 ? "warn" : ""), "data-priority": String(p),
        title: list.map((b) => `${b.key}: ${b.waiting}`).join(", "),
        text: `${p}${p < 0 ? " (sheddable)" : ""}: ${n} (${list.map((b) => `${b.key} ${b.waiting}`).join(", ")})` }));
    }
  }

  function fillCard(c, ws, prefixKeys, waiting, bands) {
    fillBands(c.bands, bands);
    const heads = [["Worker"], ["Role"], ["Source"], ["State"], ["Queue"], ["Running"], ["In flight", "this replica's requests"],
      ["Peers", "peer_in_flight: the other replicas' requests (fleet sync)"], ["KV used"], ["Cache view"],
      ...prefixKeys.map((k) => [cap(k.replace(/^prefix_/, "").replace(/_/g, " ")), k]), ["Heartbeat"]];
    const headKey = heads.map((h) => h[0]).join("|");
    if (c.headKey !== headKey) {
      clear(c.thead);
      c.thead.append(el("tr", null, heads.map(([h, title], i) => el("th", { class: i === 8 ? "kvh" : i === 9 ? "" : i >= 4 ? "r" : "", text: h, title: title || "" }))));
      c.headKey = headKey;
    }
    const drained = ws.filter((w) => w.drained).length;
    const routable = ws.filter((w) => takesRequests(w)).length;
    const adapters = [...new Set(ws.flatMap((w) => w.adapters || []))].sort();
    c.counts.textContent = `${routable} of ${ws.length} routable` + (waiting ? ` · ${waiting} waiting` : "") +
      (adapters.length ? ` · LoRA adapters: ${adapters.join(", ")}` : "");
    c.badge.textContent = drained === ws.length ? "drained" : drained ? "partly drained" : routable ? "serving" : "no routable worker";
    c.badge.className = "chip " + (drained ? "warn" : routable ? "ok" : "bad");
    c.drain.disabled = drained === ws.length;
    c.resume.disabled = drained === 0;
    clear(c.tbody);
    for (const w of ws) {
      const s = workerState(w);
      const source = w.source === "probe" && w.kind ? `probe (${w.kind})` : w.source || "";
      c.tbody.append(el("tr", { "data-worker": w.id, "data-state": s.name },
        el("td", { class: "id", title: w.http_address || "" }, el("span", { text: w.id }), el("div", { class: "addr muted", text: w.http_address || "" }),
          (w.adapters || []).length ? el("div", { class: "adapters muted", "data-adapters": w.adapters.join(","), text: "LoRA: " + w.adapters.join(", ") }) : null),
        el("td", { text: w.role }),
        el("td", { text: source }),
        el("td", null, el("span", { class: "chip " + s.cls, text: s.label, title: s.title })),
        el("td", { class: "r num", text: w.queue_depth }),
        el("td", { class: "r num", text: w.running }),
        el("td", { class: "r num", text: w.in_flight }),
        el("td", { class: "r num", "data-peer-in-flight": "", text: w.peer_in_flight || 0 }),
        el("td", null, kvBar(w)),
        el("td", null, cacheChip(w)),
        prefixKeys.map((k) => el("td", { class: "r num", text: w[k] === undefined ? "–" : fmtNum(w[k]) })),
        el("td", { class: "r num", text: ago(w.last_heartbeat) })));
      if (w.last_error) {
        // A down engine's last error, under its row, across the table.
        const since = w.down_since ? `down for ${ago(w.down_since)}: ` : "down: ";
        c.tbody.append(el("tr", { class: "errrow", "data-error-of": w.id },
          el("td", { colSpan: heads.length, class: "lasterr badtext", "data-last-error": "", text: since + w.last_error })));
      }
    }
  }

  async function drainModel(model, on) {
    const action = on ? "drain" : "resume";
    try {
      const r = await api("POST", `/admin/v1/models/${modelPath(model)}:${action}`);
      if (!r.ok) { toast(`${action} ${model}: ${errMessage(r)}`, true); return; }
      const served = (on ? r.json.drained : r.json.resumed) || [];
      toast(`${on ? "Drained" : "Resumed"} ${served.join(", ") || model}: ${r.json.workers} worker${r.json.workers === 1 ? "" : "s"}`);
      if (st.page === "fleet") await refreshFleet();
    } catch (err) {
      if (!(err instanceof AuthError)) toast(`${action} ${model}: ${err.message}`, true);
    }
  }

  // ---- routes ----
  function routesPage() { loadRoutes(); }

  async function loadRoutes() {
    const r = await api("GET", "/admin/v1/routes").catch(() => null);
    if (!r) return;
    if (!r.ok) { toast("routes: " + errMessage(r), true); return; }
    st.routes.etag = r.etag;
    st.routes.epoch = r.json.epoch;
    const text = pretty(r.json.routes);
    st.routes.loadedText = text;
    $("routes-json").value = text;
    $("conflict").hidden = true;
    clearNotes();
    renderRoutes(r.json.routes);
    editorChanged();
  }
  function pretty(rs) { return JSON.stringify({ routes: rs }, null, 2); }

  function renderRoutes(rs) {
    const root = $("routes-list");
    clear(root);
    $("routes-summary").textContent = `${rs.length} route${rs.length === 1 ? "" : "s"} · epoch ${st.routes.epoch}`;
    $("routes-etag").textContent = `editing epoch ${st.routes.epoch} · If-Match: ${st.routes.etag}`;
    if (!rs.length) root.append(el("p", { class: "muted", text: "The table is empty: every request names a served model directly." }));
    rs.forEach((rt, i) => root.append(routeCard(rt, i)));
  }

  function routeCard(rt, i) {
    const kind = rt.cascade && rt.cascade.length ? "cascade" : rt.backends && rt.backends.length > 1 ? "canary" : rt.backends && rt.backends.length ? "one backend" : "direct";
    const targets = rt.targets && rt.targets.length ? rt.targets : ["unified"];
    const head = el("div", { class: "cardhead" },
      el("h3", { text: rt.model }),
      el("span", { class: "chip kind", text: kind }),
      targets.map((t) => el("span", { class: "chip " + (t === "disaggregated" ? "pd" : "plain"), text: t })));
    const body = el("div", { class: "routebody" });
    if (rt.aliases && rt.aliases.length) {
      body.append(el("div", { class: "row" }, el("span", { class: "label", text: "aliases" }), rt.aliases.map((a) => el("span", { class: "chip plain", text: a }))));
    }
    if (rt.backends && rt.backends.length) {
      const total = rt.backends.reduce((s, b) => s + (b.weight > 0 ? b.weight : 0), 0) || 1;
      const list = el("div", { class: "weights" });
      for (const b of rt.backends) {
        const pct = (100 * Math.max(0, b.weight)) / total;
        list.append(el("div", { class: "weight" },
          el("span", { class: "name", text: b.model }),
          el("div", { class: "bar" }, el("span", { style: { width: pct.toFixed(1) + "%" } })),
          el("span", { class: "num", text: (pct >= 10 ? Math.round(pct) : pct.toFixed(1)) + "%", title: "weight " + b.weight })));
      }
      body.append(el("div", { class: "row start" }, el("span", { class: "label", text: "split" }), list));
    }
    if (rt.cascade && rt.cascade.length) {
      const ol = el("ol", { class: "steps" });
      rt.cascade.forEach((s, j) => {
        const last = j === rt.cascade.length - 1;
        ol.append(el("li", null,
          el("span", { class: "name", text: s.model }),
          last ? el("span", { class: "muted", text: "final: always answers" })
            : el("span", null, el("span", { class: "muted", text: "accept if " }), el("code", { text: s.accept_if || "" }), el("span", { class: "muted", text: ", else escalate" }))));
      });
      body.append(el("div", { class: "row start" }, el("span", { class: "label", text: "cascade" }), ol));
      const strict = rt.on_escalation_failure === "error";
      body.append(el("div", { class: "row", "data-on-escalation-failure": strict ? "error" : "answer" },
        el("span", { class: "label", text: "fallback" }),
        el("span", { class: "muted", text: strict ? "a later step that cannot run is an error" : "a later step that cannot run: the last answer, flagged" })));
    }
    if (!rt.backends?.length && !rt.cascade?.length) {
      body.append(el("div", { class: "row" }, el("span", { class: "label", text: "serves" }), el("span", { class: "name", text: rt.model })));
    }
    return el("div", { class: "card route", "data-route": String(i) }, head, body);
  }

  // locate maps each JSON path of text ("routes[1].cascade[0].accept_if")
  // to the offset where its key (or array element) starts.
  function locate(text) {
    const map = new Map();
    let i = 0;
    const ws = () => { while (i < text.length && /\s/.test(text[i])) i++; };
    const str = () => {
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
      const s = JSON.parse(text.slice(i, j + 1));
      i = j + 1;
      return s;
    };
    const value = (path, at) => {
      ws();
      if (path) map.set(path, at === undefined ? i : at);
      const c = text[i];
      if (c === "{") {
        i++; ws();
        if (text[i] === "}") { i++; return; }
        for (;;) {
          ws();
          const kat = i;
          const k = str();
          ws(); i++; // ':'
          value(path ? path + "." + k : k, kat);
          ws();
          if (text[i] === ",") { i++; continue; }
          i++; return;
        }
      } else if (c === "[") {
        i++; ws();
        if (text[i] === "]") { i++; return; }
        for (let n = 0; ; n++) {
          value(path + "[" + n + "]");
          ws();
          if (text[i] === ",") { i++; continue; }
          i++; return;
        }
      } else if (c === '"') {
        str();
      } else {
        while (i < text.length && /[^,\]}\s]/.test(text[i])) i++;
      }
    };
    try { value("", 0); } catch (_) { /* a partial map is still useful */ }
    return map;
  }
  function lineOf(text, offset) {
    let n = 0;
    for (let k = 0; k < offset && k < text.length; k++) if (text[k] === "\n") n++;
    return n;
  }
  // offsetOf finds path, or its nearest ancestor, in text.
  function offsetOf(text, path) {
    const map = locate(text);
    let p = path;
    while (p) {
      if (map.has(p)) return map.get(p);
      const cut = Math.max(p.lastIndexOf("."), p.lastIndexOf("["));
      if (cut <= 0) break;
      p = p.slice(0, cut);
    }
    return map.has(p) ? map.get(p) : 0;
  }
  // pathsOf pulls the field paths out of a validation message.
  function pathsOf(param, message) {
    const out = [];
    if (param) out.push(param);
    const re = /\b((?:routes|epoch)(?:\[\d+\]|\.[A-Za-z_]+)*)\s*:/g;
    let m;
    while ((m = re.exec(message))) if (!out.includes(m[1])) out.push(m[1]);
    // "routes: bad route table JSON: routes[2].x: ..." names the table
    // first: keep the bare "routes" only when nothing finer is named.
    return out.length > 1 ? out.filter((p) => p !== "routes") : out;
  }
  function messageFor(path, message) {
    // "a: x; b: y" -> the part about path.
    for (const part of message.split(/;\s+|\n/)) {
      const k = part.indexOf(path + ":");
      if (k >= 0) return part.slice(k + path.length + 1).trim();
    }
    return message.replace(/^routes: (?:bad route table JSON|invalid route table): /, "");
  }

  const LINE = 20; // px; the editor's line height (app.css)
  const PAD = 8;
  function editorChanged() {
    const ta = $("routes-json");
    const lines = ta.value.split("\n").length;
    const g = $("gutter");
    const want = Array.from({ length: lines }, (_, k) => String(k + 1)).join("\n");
    if (g.textContent !== want) g.textContent = want;
    placeNotes();
  }
  function clearNotes() {
    st.routes.notes = [];
    clear($("notes"));
    clear($("hl"));
    clear($("routes-errors"));
  }
  function addNote(line, path, msg) {
    st.routes.notes.push({ line, path, msg });
    $("notes").append(el("div", { class: "note", "data-path": path, "data-line": String(line + 1) },
      el("b", { text: path || "JSON" }), " ", msg));
    $("hl").append(el("div", { class: "hline" }));
    $("routes-errors").append(el("li", null,
      el("button", { type: "button", class: "link", text: `line ${line + 1}`, on: { click: () => jumpTo(line) } }),
      " ", el("code", { text: path || "JSON" }), " ", msg));
    placeNotes();
  }
  function placeNotes() {
    const ta = $("routes-json");
    const top = (line) => PAD + line * LINE - ta.scrollTop;
    const notes = st.routes.notes || [];
    [...$("notes").children].forEach((n, k) => { n.style.top = top(notes[k].line) + LINE + "px"; });
    [...$("hl").children].forEach((n, k) => { n.style.top = top(notes[k].line) + "px"; });
    $("gutter").scrollTop = ta.scrollTop;
  }
  // showLine scrolls the editor so line and its note are in view.
  function showLine(line) {
    const ta = $("routes-json");
    const y = line * LINE;
    if (y < ta.scrollTop || y + 3 * LINE > ta.scrollTop + ta.clientHeight) ta.scrollTop = Math.max(0, y - ta.clientHeight / 3);
    placeNotes();
  }
  function jumpTo(line) {
    const ta = $("routes-json");
    const lines = ta.value.split("\n");
    let start = 0;
    for (let k = 0; k < line; k++) start += lines[k].length + 1;
    ta.focus();
    ta.setSelectionRange(start, start + (lines[line] || "").length);
    ta.scrollTop = Math.max(0, line * LINE - ta.clientHeight / 2);
    placeNotes();
  }
  $("routes-json").addEventListener("input", () => { clearNotes(); editorChanged(); });
  $("routes-json").addEventListener("scroll", placeNotes);
  $("routes-reload").addEventListener("click", () => loadRoutes());
  $("routes-save").addEventListener("click", () => saveRoutes(st.routes.etag));

  async function saveRoutes(etag) {
    const text = $("routes-json").value;
    clearNotes();
    try {
      JSON.parse(text);
    } catch (err) {
      const m = /position (\d+)/.exec(err.message) || [];
      const lc = /line (\d+) column/.exec(err.message);
      const line = lc ? Number(lc[1]) - 1 : m[1] ? lineOf(text, Number(m[1])) : 0;
      addNote(line, "", "not JSON: " + err.message);
      showLine(line);
      return;
    }
    let r;
    try {
      r = await api("PUT", "/admin/v1/routes", { body: text, headers: { "If-Match": etag } });
    } catch (_) { return; }
    if (r.ok) {
      st.routes.etag = r.etag;
      st.routes.epoch = r.json.epoch;
      st.routes.loadedText = pretty(r.json.routes);
      $("routes-json").value = st.routes.loadedText;
      $("conflict").hidden = true;
      renderRoutes(r.json.routes);
      editorChanged();
      const warnings = r.json.warnings || [];
      const list = $("routes-errors");
      clear(list);
      for (const w of warnings) list.append(el("li", { class: "warning", "data-warning": w.path, text: `${w.path}: ${w.message}` }));
      toast(`Saved: epoch ${r.json.epoch}` + (warnings.length ? ` · ${warnings.length} warning${warnings.length > 1 ? "s" : ""}` : ""), warnings.length > 0);
      return;
    }
    const code = r.json && r.json.error ? r.json.error.code : "";
    if (r.status === 412) { await showConflict(text); return; }
    if (r.status === 400) {
      const e = r.json.error;
      const paths = pathsOf(e.param, e.message);
      if (!paths.length) { addNote(0, "", e.message); return; }
      for (const p of paths) addNote(lineOf(text, offsetOf(text, p)), p, messageFor(p, e.message));
      showLine(st.routes.notes[0].line);
      return;
    }
    toast(`Save failed (${code || r.status}): ${errMessage(r)}`, true);
  }

  async function showConflict(mine) {
    const r = await api("GET", "/admin/v1/routes").catch(() => null);
    if (!r || !r.ok) { toast("The table changed since you loaded it; reload to see it.", true); return; }
    const theirs = pretty(r.json.routes);
    const box = $("conflict");
    clear(box);
    const mineLines = new Set(mine.split("\n").map((s) => s.trim()));
    const theirLines = new Set(theirs.split("\n").map((s) => s.trim()));
    const side = (title, text, other) => el("div", { class: "side" },
      el("h4", { text: title }),
      el("pre", null, text.split("\n").map((ln) => el("div", { class: other.has(ln.trim()) ? "ln" : "ln diff", text: ln || " " }))));
    box.append(
      el("div", { class: "cardhead" },
        el("h3", { text: "Changed since you loaded it" }),
        el("span", { class: "muted", text: `you loaded epoch ${st.routes.epoch}; the gateway is now at epoch ${r.json.epoch}. Nothing was saved.` })),
      el("div", { class: "sides", "data-epoch": String(r.json.epoch) },
        side(`Your edit (based on epoch ${st.routes.epoch})`, mine, theirLines),
        side(`Current (epoch ${r.json.epoch})`, theirs, mineLines)),
      el("div", { class: "editor-bar" },
        el("button", { type: "button", class: "primary", text: "Load the current version", "data-action": "take-theirs", on: { click: () => loadRoutes() } }),
        el("button", { type: "button", class: "danger", text: `Save mine over epoch ${r.json.epoch}`, "data-action": "overwrite", on: { click: () => saveRoutes(r.etag) } })));
    box.hidden = false;
    box.scrollIntoView({ block: "nearest" });
  }

  // ---- traffic ----
  function trafficPage() { poll(refreshTraffic, TRAFFIC_POLL_MS); }

  async function refreshTraffic() {
    const r = await api("GET", "/admin/v1/traffic");
    if (!r.ok) { live(false, errMessage(r)); return; }
    if (st.page !== "traffic") return;
    const snap = r.json;
    st.traffic.data = snap;
    const models = snap.models || [];
    const mins = Math.round((snap.buckets * snap.bucket_seconds) / 60);
    const replicas = snap.replicas || 1;
    $("traffic-summary").textContent = `last ${mins} minutes · ${snap.bucket_seconds} s buckets · ${models.length} model${models.length === 1 ? "" : "s"} · ` +
      (replicas > 1 ? `the fleet: ${replicas} replicas` : "this replica");
    $("traffic-summary").dataset.replicas = String(replicas);
    if (!models.find((m) => m.model === st.traffic.model)) {
      const busiest = [...models].sort((a, b) => b.totals.requests - a.totals.requests)[0];
      st.traffic.model = busiest ? busiest.model : "";
    }
    renderModelTable(models, snap);
    const m = models.find((x) => x.model === st.traffic.model);
    const root = $("traffic-charts");
    clear(root);
    if (!m) {
      $("traffic-title").textContent = "";
      root.append(el("p", { class: "muted", text: "No requests in the window yet." }));
      return;
    }
    $("traffic-title").textContent = m.model;
    const n = snap.buckets;
    const lastMinute = (xs) => { const k = Math.max(1, Math.round(60 / snap.bucket_seconds)); return xs.slice(-k).reduce((s, v) => s + v, 0) / k; };
    root.append(
      chart("requests", "Requests per second", [{ name: "req/s", values: m.rps, cls: "s1", kind: "area" }], { snap, unit: fmtNum, now: fmtNum(lastMinute(m.rps)) + " req/s" }),
      chart("ttft", "Time to first token", [{ name: "p50", values: m.ttft_p50_ms, cls: "s1" }, { name: "p99", values: m.ttft_p99_ms, cls: "s2" }], { snap, unit: fmtMs, now: "p99 " + fmtMs(m.totals.ttft_p99_ms) }),
      chart("latency", "Latency", [{ name: "p50", values: m.latency_p50_ms, cls: "s1" }, { name: "p99", values: m.latency_p99_ms, cls: "s2" }], { snap, unit: fmtMs, now: "p99 " + fmtMs(m.totals.latency_p99_ms) }),
      chart("errors", "Errors by code", Object.keys(m.errors).sort().map((c, k) => ({ name: c, values: m.errors[c], cls: "e" + (k % 6), kind: "bar" })), { snap, unit: fmtNum, stack: true, now: fmtNum(m.totals.errors) + " in window", empty: "no errors" }),
      chart("failovers", "Failovers", [{ name: "failovers", values: m.failovers, cls: "s3", kind: "bar" }], { snap, unit: fmtNum, now: fmtNum(m.totals.failovers) + " in window" }),
      chart("cascade", "Cascade verdicts", [{ name: "accepted", values: m.cascade_accepted, cls: "s4", kind: "bar" }, { name: "escalated", values: m.cascade_escalated, cls: "s2", kind: "bar" }],
        { snap, unit: fmtNum, stack: true, now: acceptance(m.totals), empty: "not a cascade, or no verdicts yet" }));
    void n;
  }
  function acceptance(t) {
    const all = t.cascade_accepted + t.cascade_escalated;
    return all ? `${Math.round((100 * t.cascade_accepted) / all)}% accepted · ${fmtNum(t.cascade_escalated)} escalated` : "–";
  }

  function renderModelTable(models, snap) {
    const tbl = $("traffic-models");
    clear(tbl);
    tbl.append(el("thead", null, el("tr", null,
      ["Model", "Requests", "Req/s (1 min)", "Errors", "Latency p50", "Latency p99", "TTFT p99", "Failovers", "Cascade"].map((h, i) => el("th", { class: i ? "r" : "", text: h })))));
    const body = el("tbody");
    const k = Math.max(1, Math.round(60 / snap.bucket_seconds));
    for (const m of models) {
      const t = m.totals;
      const rps = m.rps.slice(-k).reduce((s, v) => s + v, 0) / k;
      const errPct = t.requests ? (100 * t.errors) / t.requests : 0;
      body.append(el("tr", { class: m.model === st.traffic.model ? "sel" : "", "data-model": m.model, on: { click: () => { st.traffic.model = m.model; refreshTraffic(); } } },
        el("td", { class: "id", text: m.model }),
        el("td", { class: "r num", text: fmtNum(t.requests) }),
        el("td", { class: "r num", text: fmtNum(rps) }),
        el("td", { class: "r num" + (t.errors ? " badtext" : ""), text: t.errors ? `${fmtNum(t.errors)} (${errPct.toFixed(errPct < 1 ? 1 : 0)}%)` : "0" }),
        el("td", { class: "r num", text: fmtMs(t.latency_p50_ms) }),
        el("td", { class: "r num", text: fmtMs(t.latency_p99_ms) }),
        el("td", { class: "r num", text: fmtMs(t.ttft_p99_ms) }),
        el("td", { class: "r num", text: fmtNum(t.failovers) }),
        el("td", { class: "r num", text: acceptance(t) })));
    }
    if (!models.length) body.append(el("tr", null, el("td", { colSpan: 9, class: "muted", text: "No requests in the last 15 minutes." })));
    tbl.append(body);
  }

  // chart draws series over the window as inline SVG: lines (null breaks
  // the line), an area, or bars (stacked when opts.stack).
  function chart(id, title, series, opts) {
    const W = 520, H = 170, L = 46, R = 10, T = 10, B = 22;
    const n = opts.snap.buckets;
    const pw = W - L - R, ph = H - T - B;
    const x = (i) => L + (pw * (i + 0.5)) / n;
    let maxV = 0, sum = 0, points = 0;
    if (opts.stack) {
      for (let i = 0; i < n; i++) maxV = Math.max(maxV, series.reduce((s, se) => s + (se.values[i] || 0), 0));
    } else {
      for (const se of series) se.values.forEach((v, i) => { if (v !== null && (se.kind === "bar" || i < n - 1)) maxV = Math.max(maxV, v); });
    }
    for (const se of series) for (const v of se.values) if (v) { sum += v; points++; }
    const top = niceMax(maxV);
    const y = (v) => T + ph - (ph * v) / top;
    const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title, "data-chart": id, "data-sum": sum.toFixed(3), "data-points": points });
    for (let k = 0; k <= 4; k++) {
      const v = (top * k) / 4;
      g.append(sv("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: k ? "grid" : "axis" }));
      if (k % 2 === 0) g.append(sv("text", { x: L - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, opts.unit(v)));
    }
    const span = n * opts.snap.bucket_seconds;
    const step = [30, 60, 120, 300, 600, 900, 1800, 3600].find((t) => span / t <= 4) || span;
    for (let secs = 0; secs <= span + 1e-9; secs += step) {
      const xi = L + pw * (1 - secs / span);
      const label = secs === 0 ? "now" : secs % 60 ? `−${secs} s` : `−${secs / 60} min`;
      g.append(sv("text", { x: xi, y: H - 6, class: "tick", "text-anchor": secs === 0 ? "end" : secs >= span - 1e-9 ? "start" : "middle" }, label));
    }
    const bw = Math.max(1, pw / n - 0.6);
    const base = new Array(n).fill(0);
    for (const se of series) {
      if (se.kind === "bar") {
        for (let i = 0; i < n; i++) {
          const v = se.values[i] || 0;
          if (!v) continue;
          const b0 = opts.stack ? base[i] : 0;
          g.append(sv("rect", { x: x(i) - bw / 2, y: y(b0 + v), width: bw, height: Math.max(0.5, y(b0) - y(b0 + v)), class: "col " + se.cls }));
          if (opts.stack) base[i] += v;
        }
        continue;
      }
      // Lines end at the last complete bucket: the current one is partial.
      let d = "", pen = false;
      for (let i = 0; i < n - 1; i++) {
        const v = se.values[i];
        if (v === null || v === undefined) { pen = false; continue; }
        d += (pen ? "L" : "M") + x(i).toFixed(1) + " " + y(v).toFixed(1);
        pen = true;
      }
      if (se.kind === "area" && d) {
        g.append(sv("path", { d: `${d}L${x(n - 2).toFixed(1)} ${y(0)}L${x(0).toFixed(1)} ${y(0)}Z`, class: "area " + se.cls }));
      }
      if (d) g.append(sv("path", { d, class: "line " + se.cls }));
    }
    if (!sum && opts.empty) g.append(sv("text", { x: L + pw / 2, y: T + ph / 2, class: "empty", "text-anchor": "middle" }, opts.empty));
    const legend = el("div", { class: "legend" }, series.map((se) => el("span", null, el("i", { class: "sw " + se.cls }), se.name)));
    return el("div", { class: "card chartcard" },
      el("div", { class: "cardhead" }, el("h3", { text: title }), el("span", { class: "grow" }), el("span", { class: "muted num", text: opts.now || "" })),
      g, series.length > 1 || opts.stack ? legend : null);
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  start();
})();
