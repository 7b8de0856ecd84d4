// Headless Chromium over wss:// against tether's own TLS, trusting only a test CA (run by
// tests/browser_wss.rs, which makes the CA, the server's certificate, the two NSS databases
// and starts the server; see its header).
//
//   node tests/browser/wss_resume.mjs
//
// Environment: TETHER_ADDR (127.0.0.1:PORT, the server's TLS listener), TRUSTED_HOME (a HOME
// whose ~/.pki/nssdb trusts the test CA), BARE_HOME (a HOME whose NSS database is empty),
// JWT_SECRET (the server's `auth.jwt_hs256_secret`), API_KEY (one of its `auth.publish_keys`),
// CHROMIUM (the browser). NODE_EXTRA_CA_CERTS names the test CA, so that this script's own
// https:// requests verify the server too.
//
//   1. Chromium with TRUSTED_HOME loads the status page over https:// from tether (TLS 1.3,
//      the chain issued by the test CA), imports the JavaScript client (clients/js, unbundled:
//      its modules are answered by this script under the page's origin, /client/…), which
//      connects over wss:// with a JWT for `alice`, subscribes to `news` from seq 0, publishes
//      3 messages and receives them;
//   2. POST /api/disconnect closes alice's connection with 1012 (the reconnect class); while
//      the client waits out its backoff (1.98 s, a fixed jitter), 3 messages are published
//      over https:// and the page publishes one more (kept in its outbox);
//   3. the client reconnects, resumes from its last seq, and every seq 1–7 is received exactly
//      once, in order, in one epoch (`recovered: true`);
//   4. Chromium with BARE_HOME (no test CA) fails the navigation with
//      ERR_CERT_AUTHORITY_INVALID, a wss:// WebSocket from it never opens, and the server
//      counts the refused handshakes in tether_tls_handshake_failures_total.
// Every wait is bounded; the whole run is bounded by TOTAL_MS. Prints one `browser wss:` line.

import { createHmac } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import puppeteer from "puppeteer-core";

const TOTAL_MS = 90_000;
const STEP_MS = 15_000;
/** The client's reconnect delay: the first backoff window with the jitter at 0.99. */
const BACKOFF_MS = 2000;
const JITTER = 0.99;
const CLIENT_DIR = fileURLToPath(new URL("../../clients/js/", import.meta.url));

const env = (name) => process.env[name] || fatal(`${name} is not set (tests/browser_wss.rs sets it)`);
const addr = env("TETHER_ADDR");
const trustedHome = env("TRUSTED_HOME");
const bareHome = env("BARE_HOME");
const secret = env("JWT_SECRET");
const apiKey = env("API_KEY");
const chromium = env("CHROMIUM");
env("NODE_EXTRA_CA_CERTS");
if (!existsSync(chromium)) fatal(`chromium not found at ${chromium}`);
const base = `https://${addr}`;

const cleanups = [];
const overall = setTimeout(() => fail(`the test took longer than ${TOTAL_MS} ms`), TOTAL_MS);

function fatal(msg) {
  console.error(`wss_resume: ${msg}`);
  process.exit(1);
}

async function fail(msg) {
  console.error(`wss_resume: FAILED: ${msg}`);
  while (cleanups.length) await cleanups.pop()().catch((e) => console.error(`wss_resume: cleanup: ${e.message}`));
  process.exit(1);
}

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/// Polls `f` until it returns a truthy value; after `ms` throws `what` and what `seen()` says.
async function until(what, ms, f, seen = async () => "") {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) throw new Error(`${what}: not within ${ms} ms; saw ${await seen()}`);
    await sleep(20);
  }
}

/// An HS256 JWT (RFC 7519) for `alice`, valid 10 minutes, allowed every channel.
function mint() {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  const claims = { sub: "alice", exp: Math.floor(Date.now() / 1000) + 600, channels: { sub: ["*"], pub: ["*"] } };
  const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}`;
  return `${body}.${createHmac("sha256", secret).update(body).digest("base64url")}`;
}

/// A request to tether's server API over https:// (node verifies the chain against the test
/// CA through NODE_EXTRA_CA_CERTS); the parsed JSON answer, which must be a 200.
async function api(method, p, body) {
  const resp = await fetch(`${base}${p}`, {
    method,
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: body == null ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(STEP_MS),
  });
  const text = await resp.text();
  check(resp.status === 200, `${method} ${p}: ${resp.status} ${text}`);
  return JSON.parse(text);
}

/// The sum of the Prometheus samples of `name` on /metrics (over https://).
async function metric(name) {
  const resp = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(STEP_MS) });
  check(resp.status === 200, `GET /metrics: ${resp.status}`);
  let sum = 0;
  for (const line of (await resp.text()).split("\n")) {
    if (line.startsWith(`${name} `) || line.startsWith(`${name}{`)) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

/// A headless Chromium whose HOME (and so whose NSS database, ~/.pki/nssdb) is `home`, in a
/// profile of its own; closed at the end.
async function launch(home) {
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    env: { ...process.env, HOME: home },
    args: ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-quic", "--disable-background-networking", "--disable-component-update"],
  });
  cleanups.push(() => browser.close());
  return browser;
}

/// Answers the page's requests for /client/… on tether's origin with clients/js's files, so
/// the unbundled client loads as same-origin modules of a page tether served; every other
/// request (the page itself, /status.json, the WebSocket) goes to the network and its TLS.
async function serveClient(page) {
  await page.setRequestInterception(true);
  page.on("request", (req) => {
    const url = new URL(req.url());
    if (url.origin !== base || !url.pathname.startsWith("/client/")) return req.continue();
    const file = path.join(CLIENT_DIR, path.normalize(url.pathname.slice("/client/".length)));
    if (!file.startsWith(CLIENT_DIR) || !file.endsWith(".js") || !existsSync(file)) return req.respond({ status: 404, body: "" });
    req.respond({ status: 200, contentType: "text/javascript", body: readFileSync(file, "utf8") });
  });
}

async function trusted() {
  const browser = await launch(trustedHome);
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await serveClient(page);
  const resp = await page.goto(`${base}/status`, { timeout: STEP_MS });
  check(resp.status() === 200, `GET /status over https://: ${resp.status()}`);
  const sec = resp.securityDetails();
  check(sec, "no TLS details for the page");
  check(sec.protocol() === "TLS 1.3", `protocol ${sec.protocol()}`);
  check(sec.issuer() === "tether test CA", `issuer ${sec.issuer()}`);

  // The client as a page uses it, over wss:// on the page's own origin.
  await page.evaluate(
    async ({ url, token, baseMs, jitter }) => {
      const { Tether } = await import("/client/index.js");
      const s = (window.wssTest = { log: [], events: [], subscribed: [], errors: [], acks: [] });
      const t = new Tether(url, { token, backoff: { baseMs, capMs: baseMs }, random: () => jitter });
      window.wssClient = t;
      t.on("connected", (e) => s.events.push({ event: "connected", url: e.url, at: Date.now() }));
      t.on("disconnected", (d) => s.events.push({ event: "disconnected", code: d.code, willRetry: d.willRetry, retryInMs: d.retryInMs, at: Date.now() }));
      t.on("error", (e) => s.errors.push(e.message));
      t.subscribe("news", {
        from: 0,
        onMessage: (m) => s.log.push([m.epoch, m.seq, m.data]),
        onSubscribed: (x) => s.subscribed.push(x),
      });
    },
    { url: `wss://${addr}/ws`, token: mint(), baseMs: BACKOFF_MS, jitter: JITTER },
  );
  const state = () => page.evaluate(() => window.wssTest);
  const seen = async () => JSON.stringify({ ...(await state()), pageErrors: errors });
  await until("the page subscribed over wss://", STEP_MS, async () => (await state()).subscribed.length === 1, seen);
  const pagePublish = (data) => page.evaluate((d) => window.wssClient.publish("news", d).then((a) => window.wssTest.acks.push(a.seq)), data);
  for (let i = 0; i < 3; i++) await pagePublish({ page: i });
  await until("the page's 3 messages back", STEP_MS, async () => (await state()).log.length === 3, seen);

  // The cut: the server closes alice's connection (1012: reconnect); the missed messages are
  // published while the client waits out its backoff.
  const cut = await api("POST", "/api/disconnect", { user: "alice", code: 1012, reason: "wss test cut" });
  check(cut.closed === 1, `disconnect closed ${JSON.stringify(cut)}`);
  await until("the page's disconnect", STEP_MS, async () => (await state()).events.some((e) => e.event === "disconnected"), seen);
  const missed = [];
  for (let i = 0; i < 3; i++) missed.push((await api("POST", "/publish/news", { http: i })).seq);
  const published = Date.now();
  const outbox = page.evaluate((d) => window.wssClient.publish("news", d).then((a) => window.wssTest.acks.push(a.seq)), { page: "outbox" });
  await until("the resumed stream (7 messages)", STEP_MS, async () => (await state()).log.length >= 7, seen);
  await outbox;
  await sleep(200); // a duplicate would arrive right behind the last message
  const s = await state();
  const connects = s.events.filter((e) => e.event === "connected");
  const down = s.events.find((e) => e.event === "disconnected");
  check(down.code === 1012 && down.willRetry, `disconnect event ${JSON.stringify(down)}`);
  check(connects.length === 2, `connects ${JSON.stringify(s.events)}`);
  check(connects[1].at > published, `the client came back ${published - connects[1].at} ms before the missed publishes ended: they were not missed`);
  check(JSON.stringify(missed) === "[4,5,6]", `missed seqs ${missed}`);
  const seqs = s.log.map(([, seq]) => seq);
  check(JSON.stringify(seqs) === "[1,2,3,4,5,6,7]", `every seq once, in order: ${JSON.stringify(s.log)}`);
  check(new Set(s.log.map(([e]) => e)).size === 1, `one epoch: ${JSON.stringify(s.log)}`);
  check(s.subscribed.length === 2 && s.subscribed[1].recovered === true, `resume: ${JSON.stringify(s.subscribed)}`);
  check(JSON.stringify(s.acks) === "[1,2,3,7]", `the page's acks ${s.acks}`);
  check(s.errors.length === 0 && errors.length === 0, `errors ${JSON.stringify([s.errors, errors])}`);
  await page.evaluate(() => window.wssClient.close());
  return { down, back: connects[1].at - down.at };
}

async function untrusted() {
  const before = await metric("tether_tls_handshake_failures_total");
  const browser = await launch(bareHome);
  const page = await browser.newPage();
  let err = null;
  await page.goto(`${base}/status`, { timeout: STEP_MS }).catch((e) => (err = e));
  check(err && /ERR_CERT_AUTHORITY_INVALID/.test(err.message), `the navigation without the test CA: ${err?.message ?? "it loaded"}`);
  await page.goto("about:blank");
  const ws = await page.evaluate(
    (url) =>
      new Promise((resolve) => {
        const w = new WebSocket(url);
        const timer = setTimeout(() => resolve("no outcome within 10 s"), 10_000);
        w.onopen = () => (clearTimeout(timer), resolve("open"));
        w.onclose = (e) => (clearTimeout(timer), resolve(`closed ${e.code}`));
      }),
    `wss://${addr}/ws?token=${mint()}`,
  );
  check(ws === "closed 1006", `a wss:// WebSocket without the test CA: ${ws}`);
  const after = await until("the refused handshakes counted", STEP_MS, async () => {
    const n = await metric("tether_tls_handshake_failures_total");
    return n >= before + 2 && n;
  });
  return { failures: after - before };
}

try {
  const ok = await trusted();
  const no = await untrusted();
  console.log(
    `browser wss: TLS 1.3 from the test CA, 3 published from the page, cut with ${ok.down.code}, 3 + 1 missed resumed exactly once ` +
      `(back after ${ok.back} ms); without the CA: ERR_CERT_AUTHORITY_INVALID, WebSocket 1006, ${no.failures} refused handshakes counted`,
  );
  clearTimeout(overall);
  while (cleanups.length) await cleanups.pop()();
  process.exit(0);
} catch (e) {
  await fail(e.stack || e.message);
}
