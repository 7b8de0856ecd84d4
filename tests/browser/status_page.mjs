// The status page in a real headless Chromium (docs/operations.md, "Status page").
//
//   node tests/browser/status_page.mjs TETHER_BINARY [SCREENSHOT.png]
//
// Starts `tether serve` (2 cores, an admin token, presence on the demo channels) on 127.0.0.1
// port 0, puts a small load on it (WebSocket subscribers on two channels, the first subscriber
// of each asking for joins and leaves; an HTTP publisher), and drives Debian's chromium
// through puppeteer-core:
//   1. /status without the token: the page still loads (401) and explains how to pass it;
//   2. /status#token=…: the page goes live, the token leaves the address bar, publishes/s and
//      deliveries/s rise, the sparklines fill; a screenshot is taken under load;
//   3. the load stops; once /metrics stands still, the page is given three more refreshes,
//      every number it shows (read from data-value attributes) must equal /metrics read
//      right after (presence members and windows included), both rates must be 0, and the
//      presence table lists both channels with their 6 members; a second screenshot is taken.
//      A silent peer was reaped for pong timeout meanwhile, so the heartbeat reaps show 1;
//   4. SIGTERM: the page shows the drain (close code 1012; a third screenshot), and tether
//      exits 0.
// Exact equality is possible because the comparison only counts when /metrics read before
// the refreshes and after them agree (else it is repeated). Every wait is bounded; the whole
// run is bounded by TOTAL_MS. The server is stopped by its PID. Prints the screenshots' paths.

import net from "node:net";
import { existsSync, mkdirSync } from "node:fs";
import path from "node:path";
import puppeteer from "puppeteer-core";
import WebSocket from "ws";

const TOTAL_MS = 150_000;
const STEP_MS = 15_000;
const ADMIN = "adm-status-7f3e9c21b54d";
const CHANNELS = ["demo.prices", "demo.news"];
const SUBSCRIBERS_PER_CHANNEL = 6;
const PUBLISH_EVERY_MS = 25;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

const [bin, shotArg] = process.argv.slice(2);
if (!bin) fatal("usage: node status_page.mjs TETHER_BINARY [SCREENSHOT.png]");
if (!existsSync(bin)) fatal(`tether binary not found: ${bin}`);
if (!existsSync(CHROMIUM)) {
  fatal(`chromium not found at ${CHROMIUM}: apt-get install chromium (or set CHROMIUM=/path/to/chrome)`);
}
const shot = path.resolve(shotArg || path.join(path.dirname(bin), "..", "status-page.png"));
const loadShot = shot.replace(/\.png$/, "") + "-load.png";
const drainShot = shot.replace(/\.png$/, "") + "-drain.png";

const cleanups = [];
/** The tether process (a TetherProcess of clients/js/test/helpers.js). */
let server = null;
const overall = setTimeout(() => fail(`the test took longer than ${TOTAL_MS} ms`), TOTAL_MS);

function fatal(msg) {
  console.error(`status_page: ${msg}`);
  process.exit(1);
}

async function cleanup() {
  while (cleanups.length) {
    try {
      await cleanups.pop()();
    } catch (e) {
      console.error(`status_page: cleanup: ${e.message}`);
    }
  }
}

async function fail(msg) {
  console.error(`status_page: FAILED: ${msg}`);
  const log = server ? server.log.join("").split("\n").slice(-40).join("\n") : "(not started)";
  console.error(`---- tether log tail (warnings and errors) ----\n${log}`);
  await cleanup();
  process.exit(1);
}

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/// Polls `f` until it returns a truthy value; throws `what` and the last value after `ms`.
async function until(what, ms, f) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    last = await f();
    if (last) return last;
    if (Date.now() > end) throw new Error(`${what}: not within ${ms} ms (last: ${JSON.stringify(last)})`);
    await sleep(50);
  }
}

/// Starts tether (2 cores, the admin token) with the JS client's test helper, which waits
/// for its `tether listening on ADDR` line and stops it by PID; resolves with its address.
async function startServer() {
  process.env.TETHER_BIN = bin;
  const { startTether } = await import("../../clients/js/test/helpers.js");
  // A fast heartbeat, so the silent peer is reaped for pong timeout within about 2 s, and a
  // short drain window, so the page can be watched draining at the end.
  server = await startTether({
    cores: 2,
    toml:
      `[admin]\ntoken = "${ADMIN}"\n\n[heartbeat]\nping_interval_ms = 1000\npong_timeout_ms = 500\n\n` +
      `[drain]\nwindow_ms = 2000\n\n[presence]\nwindow_ms = 200\n\n` +
      `[[channels]]\npattern = "demo.*"\npresence = true\njoin_leave = true\n`,
  });
  cleanups.push(() => server.kill());
  return server.addr;
}

/// One scrape of /metrics as `name{labels}` → value.
async function metrics(base) {
  const resp = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(STEP_MS) });
  check(resp.status === 200, `GET /metrics: ${resp.status}`);
  const samples = new Map();
  for (const line of (await resp.text()).split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    samples.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return samples;
}

/// Sum of the samples of `name` whose labels contain every `want` (e.g. `core="0"`).
function sum(m, name, ...want) {
  let total = 0;
  for (const [key, v] of m) {
    const brace = key.indexOf("{");
    const n = brace < 0 ? key : key.slice(0, brace);
    if (n === name && want.every((w) => key.includes(w))) total += v;
  }
  return total;
}

/// What the page must show, from one /metrics scrape: data-key → value.
function expected(m) {
  const e = {
    connections: sum(m, "tether_connections"),
    channels: sum(m, "tether_channels"),
    published_total: sum(m, "tether_messages_published_total"),
    delivered_total: sum(m, "tether_messages_delivered_total"),
    publish_duplicates_total: sum(m, "tether_publish_duplicates_total"),
    "drain.draining": sum(m, "tether_draining") === 1,
    "drain.remaining": sum(m, "tether_drain_remaining"),
    "broker.up": sum(m, "tether_broker_up", 'kind="memory"') === 1,
  };
  for (const p of ["disconnect", "drop-oldest", "conflate"]) {
    e[`overflow_total.${p}`] = sum(m, "tether_overflow_total", `policy="${p}"`);
  }
  for (const r of ["pong_timeout", "overflow", "close", "reset", "eof", "drain"]) {
    e[`reaped_total.${r}`] = sum(m, "tether_reaped_total", `reason="${r}"`);
  }
  for (const c of [0, 1]) e[`cores.${c}.connections`] = sum(m, "tether_connections", `core="${c}"`);
  e["presence.members"] = sum(m, "tether_presence_members");
  e["presence.untracked_total"] = sum(m, "tether_presence_untracked_total");
  for (const k of ["diff", "reset"]) e[`presence.windows_total.${k}`] = sum(m, "tether_presence_windows_total", `kind="${k}"`);
  return e;
}

/// Pings keep going out every second while the heartbeat runs: not part of the quiet
/// comparison, checked to lie between the scrapes before and after instead.
const pings = (m) => sum(m, "tether_pings_sent_total");

/// A peer that upgrades and then never reads nor answers a ping: reaped for pong timeout.
function silentPeer(addr) {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), Number(addr.slice(addr.lastIndexOf(":") + 1))];
  const sock = net.connect({ host, port });
  cleanups.push(() => sock.destroy());
  sock.on("error", () => {});
  sock.write(
    `GET /ws HTTP/1.1\r\nHost: ${addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
  );
  sock.pause();
}

/// What the page shows now: data-key → value (numbers and booleans parsed back).
async function shown(page) {
  return page.evaluate(() => {
    const parse = (v) => (v === "true" ? true : v === "false" ? false : v === "" ? null : Number(v));
    const out = {};
    for (const el of document.querySelectorAll("[data-key]")) out[el.dataset.key] = parse(el.dataset.value);
    for (const tr of document.querySelectorAll("#cores tbody tr")) {
      for (const td of tr.querySelectorAll("td[data-field]")) {
        out[`cores.${tr.dataset.core}.${td.dataset.field}`] = parse(td.dataset.value);
      }
    }
    out.publish_rate = parse(document.getElementById("publish-rate").dataset.value);
    out.deliver_rate = parse(document.getElementById("deliver-rate").dataset.value);
    out.samples = parse(document.getElementById("samples").dataset.value);
    out.top_rows = document.querySelectorAll("#top tbody tr").length;
    out.presence_rows = [...document.querySelectorAll("#presence tbody tr")].map(
      (tr) => `${tr.dataset.ch}=${tr.querySelector('td[data-field="members"]').dataset.value}`,
    );
    out.spark_points = parse(document.getElementById("publish-spark").dataset.points || "0");
    out["broker.kind"] = document.getElementById("broker-kind").dataset.value;
    return out;
  });
}

/// Subscribers: WebSocket connections, each subscribed (its `subscribed` received).
async function subscribe(wsUrl) {
  const sockets = [];
  cleanups.push(() => sockets.forEach((s) => s.terminate()));
  const received = { n: 0 };
  await Promise.all(
    CHANNELS.flatMap((ch) =>
      Array.from({ length: SUBSCRIBERS_PER_CHANNEL }, (_, k) => new Promise((resolve, reject) => {
        const ws = new WebSocket(wsUrl);
        sockets.push(ws);
        const timer = setTimeout(() => reject(new Error(`no subscribed for ${ch} within ${STEP_MS} ms`)), STEP_MS);
        ws.on("error", reject);
        ws.on("open", () => ws.send(JSON.stringify({ op: "sub", ch, join_leave: k === 0 })));
        ws.on("message", (data) => {
          const msg = JSON.parse(data.toString());
          if (msg.op === "subscribed") {
            clearTimeout(timer);
            resolve();
          } else if (msg.op === "msg") {
            received.n += 1;
          }
        });
      }))),
  );
  return { sockets, received };
}

/// The publisher: one POST /publish every PUBLISH_EVERY_MS, alternating channels, until told
/// to stop; resolves with the number of publishes acked.
function publisher(base) {
  let running = true;
  const done = (async () => {
    let acked = 0;
    for (let i = 0; running; i++) {
      const ch = CHANNELS[i % CHANNELS.length];
      const resp = await fetch(`${base}/publish/${ch}`, {
        method: "POST",
        body: JSON.stringify({ i, price: 100 + (i % 17) }),
        signal: AbortSignal.timeout(STEP_MS),
      });
      check(resp.status === 200, `publish ${i}: ${resp.status} ${await resp.text()}`);
      await resp.arrayBuffer().catch(() => {});
      acked += 1;
      await sleep(PUBLISH_EVERY_MS);
    }
    return acked;
  })();
  return { stop: () => { running = false; return done; }, done };
}

async function main() {
  const addr = await startServer();
  const base = `http://${addr}`;
  const subs = await subscribe(`ws://${addr}/ws`);
  silentPeer(addr);
  await until("the silent peer reaped for pong timeout, every subscriber counted", STEP_MS, async () => {
    const m = await metrics(base);
    return sum(m, "tether_reaped_total", 'reason="pong_timeout"') === 1 && sum(m, "tether_connections") === 12;
  });
  const pub = publisher(base);
  cleanups.push(() => pub.stop().catch(() => {}));

  const browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    // The new headless mode; no sandbox (root in CI); nothing that reaches out to the network
    // on its own (the same flags as clients/js/test/browser.test.js).
    headless: true,
    args: [
      "--no-sandbox",
      "--headless=new",
      "--disable-gpu",
      "--disable-dev-shm-usage",
      "--disable-quic",
      "--disable-background-networking",
      "--disable-component-update",
    ],
    timeout: STEP_MS,
  });
  cleanups.push(() => browser.close());
  console.error(`status_page: ${await browser.version()} at ${CHROMIUM}`);

  // 1. Without the token the page still loads (401) and says how to pass it.
  const anon = await browser.newPage();
  const refused = await anon.goto(`${base}/status`, { waitUntil: "domcontentloaded", timeout: STEP_MS });
  check(refused.status() === 401, `/status without a token: ${refused.status()}`);
  check(/default-src 'none'/.test(refused.headers()["content-security-policy"] || ""), "no CSP on /status");
  await anon.waitForSelector("#auth:not([hidden])", { timeout: STEP_MS });
  const reason = await anon.$eval("#auth-reason", (el) => el.textContent);
  check(/missing bearer token/.test(reason), `401 explanation: ${reason}`);
  await anon.close();

  // 2. With the token in the fragment: live numbers under load.
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  page.on("console", (m) => {
    // The navigation itself answers 401 (the page is sent refused, see docs/operations.md);
    // Chromium logs that as a failed resource. Any other error counts.
    const own = /\/status(#.*)?$/.test(m.location()?.url || "");
    if (m.type() === "error" && !own) errors.push(`${m.text()} (${m.location()?.url})`);
  });
  await page.goto(`${base}/status#token=${ADMIN}`, { waitUntil: "domcontentloaded", timeout: STEP_MS });
  const live = await until("the page shows publishes/s and deliveries/s", 20_000, async () => {
    const s = await shown(page);
    return s.samples >= 4 && s.publish_rate > 0 && s.deliver_rate > 0 && s.spark_points >= 10 && s;
  });
  check((await page.evaluate(() => location.hash)) === "", "the token stays in the address bar");
  check(live.top_rows === 10, `top connections table: ${live.top_rows} rows, want 10 (top=10 of 12)`);
  const ratio = live.deliver_rate / live.publish_rate;
  check(ratio > 3 && ratio < 9, `deliveries/s ÷ publishes/s = ${ratio}, want about ${SUBSCRIBERS_PER_CHANNEL}`);
  mkdirSync(path.dirname(shot), { recursive: true });
  await page.screenshot({ path: loadShot, fullPage: true });

  // 3. Stop the load, let /metrics stand still, then the page must show exactly /metrics.
  const acked = await pub.stop();
  let before = await until("/metrics standing still", STEP_MS, async () => {
    const a = await metrics(base);
    await sleep(300);
    const b = await metrics(base);
    const same = JSON.stringify(expected(a)) === JSON.stringify(expected(b));
    return same && b;
  });
  let compared = null;
  for (let attempt = 1; attempt <= 5 && !compared; attempt++) {
    const from = (await shown(page)).samples;
    // The refresh after next starts after `before` was read; one more gives a rate window
    // that lies wholly after it.
    await until("three more page refreshes", STEP_MS, async () => (await shown(page)).samples >= from + 3);
    const dom = await shown(page);
    const after = await metrics(base);
    const want = expected(after);
    if (JSON.stringify(expected(before)) !== JSON.stringify(want)) {
      before = after; // something moved meanwhile (a heartbeat ping): compare again
      continue;
    }
    for (const [key, v] of Object.entries(want)) {
      check(dom[key] === v, `page shows ${key} = ${dom[key]}, /metrics says ${v}`);
    }
    const p = dom.pings_sent_total;
    check(pings(before) <= p && p <= pings(after), `pings ${p} not within /metrics ${pings(before)}..${pings(after)}`);
    check(dom["reaped_total.pong_timeout"] === 1, `heartbeat reaps shown: ${dom["reaped_total.pong_timeout"]}`);
    check(dom.publish_rate === 0 && dom.deliver_rate === 0, `rates after the load: ${dom.publish_rate}, ${dom.deliver_rate}`);
    check(dom["broker.kind"] === "memory", `broker kind: ${dom["broker.kind"]}`);
    check(dom["presence.members"] === CHANNELS.length * SUBSCRIBERS_PER_CHANNEL, `presence members: ${dom["presence.members"]}`);
    check(dom["presence.windows_total.diff"] >= CHANNELS.length, `presence diffs: ${dom["presence.windows_total.diff"]}`);
    const rows = [...dom.presence_rows].sort();
    const listed = CHANNELS.map((ch) => `${ch}=${SUBSCRIBERS_PER_CHANNEL}`).sort();
    check(JSON.stringify(rows) === JSON.stringify(listed), `presence table: ${rows}, want ${listed}`);
    check(dom.published_total === acked, `published ${dom.published_total}, publisher acked ${acked}`);
    compared = { want, attempt };
  }
  check(compared, "/metrics kept moving: no quiet window in 5 attempts");
  check(errors.length === 0, `page errors: ${errors.join(" | ")}`);
  await page.screenshot({ path: shot, fullPage: true });
  const delivered = compared.want.delivered_total;
  await until(`subscribers receiving all ${delivered} deliveries`, STEP_MS, () => subs.received.n === delivered);

  // 4. SIGTERM: the page, polling over its keep-alive connection, shows the drain.
  const stopped = server.stop("SIGTERM", STEP_MS);
  const drained = await until("the page showing the drain", STEP_MS, async () => {
    const s = await shown(page);
    return s["drain.draining"] === true && s;
  });
  check(drained["drain.close_code"] === 1012, `drain close code shown: ${drained["drain.close_code"]}`);
  await page.screenshot({ path: drainShot, fullPage: true });
  const exit = await stopped;
  check(exit.code === 0, `tether exited with ${JSON.stringify(exit)} after SIGTERM`);

  console.log(`status page screenshot (under load): ${loadShot}`);
  console.log(`status page screenshot (compared with /metrics): ${shot}`);
  console.log(`status page screenshot (draining): ${drainShot}`);
  console.log(JSON.stringify({ result: "ok", publishes: acked, compared: compared.want, attempts: compared.attempt, chromium: await browser.version() }));
}

main().then(
  async () => {
    clearTimeout(overall);
    await cleanup();
    process.exit(0);
  },
  (e) => fail(e.stack || e.message),
);
