// The tether status page (docs/operations.md, "Status page"). Polls status.json about every
// second, fills every element that has a data-key (the JSON path it shows; the raw value also
// goes to its data-value, for tests and scrapers), computes publishes/s and deliveries/s from
// two successive samples (counter delta over the server's uptime delta), and keeps the last
// minute of those rates for the sparklines. No dependencies, no build step.
"use strict";

(() => {
  const PERIOD_MS = 1000;
  const FETCH_TIMEOUT_MS = 4000;
  const SPARK_POINTS = 60;
  const TOKEN_KEY = "tether.admin_token";
  const SVG_NS = "http://www.w3.org/2000/svg";

  let token = takeToken();
  let previous = null;
  let samples = 0;
  let timer = null;
  const rates = { published_total: [], delivered_total: [] };

  // The admin token comes in the URL fragment (#token=…), which the browser never sends to
  // the server; it is kept in this tab's sessionStorage and the fragment is cleared from the
  // address bar so it does not linger on screen or in the history.
  function takeToken() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    const given = fragment.get("token");
    if (given) {
      try { sessionStorage.setItem(TOKEN_KEY, given); } catch (_) { /* storage disabled */ }
      clearFragment();
      return given;
    }
    try { return sessionStorage.getItem(TOKEN_KEY); } catch (_) { return null; }
  }

  function clearFragment() {
    try { window.history.replaceState(null, "", location.pathname + location.search); } catch (_) { /* ignore */ }
  }

  function get(obj, path) {
    let v = obj;
    for (const part of path.split(".")) {
      if (v === null || typeof v !== "object" || !(part in v)) return undefined;
      v = v[part];
    }
    return v;
  }

  function number(v) {
    return typeof v === "number" ? v.toLocaleString("en-US", { maximumFractionDigits: 1 }) : String(v);
  }

  function bytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? String(n) : n.toFixed(1)) + " " + units[i];
  }

  function duration(ms) {
    let s = Math.floor(ms / 1000);
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + s + "s";
  }

  function format(v, how, el) {
    if (v === null || v === undefined) return "–";
    switch (how) {
      case "duration": return duration(v);
      case "bytes": return bytes(v);
      case "plain": return String(v);
      case "drain":
        el.classList.toggle("down", v === true);
        return v ? "draining" : "serving";
      case "up":
        el.classList.toggle("up", v === true);
        el.classList.toggle("down", v !== true);
        return v ? "up" : "down";
      default: return number(v);
    }
  }

  // Shows `v` in `el`: the formatted text, and the raw value in data-value ("" for none).
  function show(el, v) {
    el.dataset.value = v === null || v === undefined ? "" : String(v);
    el.textContent = format(v, el.dataset.format, el);
  }

  function cell(row, field, v, how) {
    const td = document.createElement("td");
    td.dataset.field = field;
    if (how) td.dataset.format = how;
    show(td, v);
    row.appendChild(td);
    return td;
  }

  function renderCores(cores) {
    const body = document.querySelector("#cores tbody");
    const rows = cores.map((c) => {
      const tr = document.createElement("tr");
      tr.dataset.core = String(c.core);
      cell(tr, "core", c.core);
      cell(tr, "connections", c.connections);
      cell(tr, "published_total", c.published_total);
      cell(tr, "delivered_total", c.delivered_total);
      cell(tr, "queued_bytes", c.queued_bytes, "bytes");
      cell(tr, "queued_messages", c.queued_messages);
      cell(tr, "backlogged", c.backlogged);
      cell(tr, "drain_remaining", c.drain_remaining);
      cell(tr, "bus_spilled", c.bus_spilled);
      return tr;
    });
    body.replaceChildren(...rows);
  }

  // Replaces the rows of table `id` with one per item (`fill(tr, item)` adds its cells), and
  // shows the "#<id>-empty" line when there is none.
  function fillTable(id, items, fill) {
    const rows = items.map((item) => {
      const tr = document.createElement("tr");
      fill(tr, item);
      return tr;
    });
    document.querySelector("#" + id + " tbody").replaceChildren(...rows);
    document.getElementById(id + "-empty").hidden = rows.length > 0;
  }

  function renderTop(top) {
    fillTable("top", top, (tr, r) => {
      tr.dataset.id = r.id;
      cell(tr, "id", r.id).textContent = r.id;
      cell(tr, "peer", r.peer).textContent = r.peer;
      cell(tr, "queued_bytes", r.queued_bytes, "bytes");
      cell(tr, "queued_messages", r.queued_messages);
      cell(tr, "secs_since_drain", r.secs_since_drain).textContent = r.secs_since_drain.toFixed(1) + " s";
      const subs = cell(tr, "subscriptions", r.subscriptions.length);
      subs.className = "subs";
      const names = r.subscriptions.slice(0, 8).join(", ");
      subs.textContent = r.subscriptions.length > 8 ? names + ", … (" + r.subscriptions.length + ")" : names;
    });
  }

  // The presence channels with the most members (at most 10, largest first).
  function renderPresence(channels) {
    fillTable("presence", channels, (tr, p) => {
      tr.dataset.ch = p.ch;
      cell(tr, "ch", p.ch).textContent = p.ch;
      cell(tr, "members", p.members);
      cell(tr, "users", p.users);
    });
  }

  // Rates from two samples: the counter's growth over the server's clock, per second. The
  // first sample (and a server restart, where the uptime goes back) has none.
  function renderRates(s) {
    for (const el of document.querySelectorAll("[data-rate]")) {
      const key = el.dataset.rate;
      let rate = null;
      if (previous && s.uptime_ms > previous.uptime_ms && s[key] >= previous[key]) {
        rate = Math.round(((s[key] - previous[key]) * 10000) / (s.uptime_ms - previous.uptime_ms)) / 10;
      }
      show(el, rate);
      if (rate !== null) {
        const h = rates[key];
        h.push(rate);
        if (h.length > SPARK_POINTS) h.shift();
      }
    }
    spark("publish-spark", rates.published_total);
    spark("deliver-spark", rates.delivered_total);
  }

  function spark(id, points) {
    const svg = document.getElementById(id);
    const max = Math.max(1, ...points);
    const base = document.createElementNS(SVG_NS, "line");
    base.setAttribute("x1", "0"); base.setAttribute("x2", "120");
    base.setAttribute("y1", "31"); base.setAttribute("y2", "31");
    const line = document.createElementNS(SVG_NS, "polyline");
    const step = 120 / (SPARK_POINTS - 1);
    const x0 = 120 - step * (points.length - 1);
    line.setAttribute("points", points.map((v, i) => (x0 + i * step).toFixed(2) + "," + (31 - (v / max) * 29).toFixed(2)).join(" "));
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = "last " + points.length + " s, peak " + number(max) + "/s";
    svg.dataset.points = String(points.length);
    svg.dataset.max = String(max);
    svg.replaceChildren(title, base, line);
  }

  function setState(state, text) {
    const el = document.getElementById("state");
    el.dataset.state = state;
    el.textContent = text;
  }

  function render(s) {
    for (const el of document.querySelectorAll("[data-key]")) show(el, get(s, el.dataset.key));
    renderCores(s.cores);
    renderTop(s.top);
    renderPresence(s.presence.channels);
    renderRates(s);
    previous = s;
    samples += 1;
    const counter = document.getElementById("samples");
    counter.dataset.value = String(samples);
    counter.dataset.uptimeMs = String(s.uptime_ms);
    counter.textContent = String(samples);
    document.getElementById("auth").hidden = true;
    if (s.drain.draining) setState("draining", "draining (close code " + s.drain.close_code + ")");
    else setState("ok", "live");
  }

  async function refused(resp) {
    let reason = "HTTP " + resp.status;
    try { reason = (await resp.json()).error || reason; } catch (_) { /* not JSON */ }
    document.getElementById("auth-reason").textContent = reason;
    document.getElementById("auth").hidden = false;
    setState("auth", "refused: " + reason);
  }

  async function sample() {
    timer = null;
    const started = Date.now();
    const abort = new AbortController();
    const guard = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
    const headers = token ? { Authorization: "Bearer " + token } : {};
    try {
      const resp = await fetch("status.json", { headers, cache: "no-store", signal: abort.signal });
      if (resp.status === 401) {
        // Nothing changes until the token does (a new #token=… in the address bar).
        await refused(resp);
        return;
      }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      render(await resp.json());
    } catch (e) {
      setState("error", "unreachable (" + (e.name === "AbortError" ? "timeout" : e.message) + "), retrying");
    } finally {
      clearTimeout(guard);
    }
    schedule(Math.max(0, PERIOD_MS - (Date.now() - started)));
  }

  function schedule(ms) {
    if (timer === null) timer = setTimeout(sample, ms);
  }

  window.addEventListener("hashchange", () => {
    const given = takeToken();
    if (given) token = given;
    schedule(0);
  });

  schedule(0);
})();
