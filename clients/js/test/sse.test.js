// Server-Sent Events in headless Chromium (docs/protocol.md, "Server-Sent Events"), with the
// Redis broker so history and epochs outlive a server restart:
// - a page's own EventSource follows a channel through a SIGTERM drain and a restart on the
//   same port and resumes by Last-Event-ID exactly once: every seq once, in order, none missed,
//   no reset;
// - the client with transport 'sse' does the same for two channels, whose positions it sends
//   as from= on each new stream;
// - with transport 'auto' behind a proxy that refuses WebSocket upgrades, the client falls back
//   to SSE after two failed attempts and receives (memory broker).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import test from 'node:test';

import { launch } from './browser_env.js';
import { startTetherOn, waitFor } from './helpers.js';

/** A redis-server on a free port of 127.0.0.1, stopped by its PID when `t` ends. */
async function startRedis(t) {
  const port = await new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  t.after(() => child.exitCode == null && process.kill(child.pid, 'SIGKILL'));
  await waitFor(
    () => new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1', () => c.end(() => resolve(true)));
      c.on('error', () => resolve(false));
    }),
    5000,
    'redis-server listening',
  );
  return port;
}

async function redisTether(t) {
  const redis = await startRedis(t);
  const toml = `[drain]\nwindow_ms = 300\n[broker]\nkind = "redis"\nurl = "redis://127.0.0.1:${redis}"\nkey_prefix = "sse${process.pid}:"\n`;
  return { ctx: await launch(t, toml), toml };
}

/** Publishes `n` messages on each of `chs`, 5 ms apart; returns the seqs per channel. */
async function publish(server, chs, n, tag) {
  const seqs = Object.fromEntries(chs.map((c) => [c, []]));
  for (let i = 0; i < n; i++) {
    for (const ch of chs) seqs[ch].push(await server.publish(ch, { tag, i }));
    await new Promise((r) => setTimeout(r, 5));
  }
  return seqs;
}

/** Drains the server (SIGTERM) and starts a new one on its port (the same Redis). */
async function restart(ctx, toml) {
  const port = ctx.server.port;
  await ctx.server.stop('SIGTERM');
  ctx.server = await startTetherOn(port, toml);
  // Publishes need the new server's Redis link up.
  await waitFor(async () => (await fetch(`${ctx.server.http}/readyz`)).status === 200, 10000, 'the new server ready');
}

test("a page's EventSource resumes by Last-Event-ID exactly once across a drain and a restart", async (t) => {
  const { ctx, toml } = await redisTether(t);
  const { page, errors } = ctx;
  await page.goto(`${ctx.base}/blank.html`);
  await page.evaluate((url) => {
    const s = (window.sseTest = { seqs: [], ids: [], subscribed: [], resets: [], closes: [], opens: 0 });
    const es = new EventSource(url);
    es.onopen = () => (s.opens += 1);
    es.addEventListener('subscribed', (e) => s.subscribed.push(JSON.parse(e.data)));
    es.addEventListener('msg', (e) => {
      s.seqs.push(JSON.parse(e.data).seq);
      s.ids.push(e.lastEventId);
    });
    es.addEventListener('reset', (e) => s.resets.push(JSON.parse(e.data)));
    es.addEventListener('close', (e) => s.closes.push(JSON.parse(e.data)));
  }, `${ctx.server.http}/sse?ch=news`);
  const state = () => page.evaluate(() => window.sseTest);
  await waitFor(async () => (await state()).subscribed.length === 1, 10000, 'the stream subscribed', () => errors.join('\n'));

  const before = (await publish(ctx.server, ['news'], 20, 'before')).news;
  await waitFor(async () => (await state()).seqs.length === before.length, 10000, 'the messages before the drain');
  await restart(ctx, toml);
  // Published before the browser comes back (its retry: is at least 1 s): replayed from Redis.
  const away = (await publish(ctx.server, ['news'], 10, 'away')).news;
  await waitFor(async () => (await state()).subscribed.length === 2, 15000, 'the second stream', async () => JSON.stringify(await state()));
  const after = (await publish(ctx.server, ['news'], 10, 'after')).news;
  const all = [...before, ...away, ...after];
  await waitFor(async () => (await state()).seqs.length >= all.length, 10000, 'every message', async () => JSON.stringify((await state()).seqs));

  const s = await state();
  assert.deepEqual(s.seqs, all, 'each seq once, in order, none missed');
  assert.deepEqual(s.resets, []);
  assert.equal(s.closes.length, 1);
  assert.equal(s.closes[0].code, 1012);
  assert.equal(s.subscribed[1].recovered, true, 'the reconnect was a resume');
  assert.equal(s.ids.at(-1), `news:${s.subscribed[0].epoch}:${all.at(-1)}`);
  assert.equal(s.opens, 2);
  assert.deepEqual(errors, []);
  console.log(`browser EventSource: ${before.length} + ${away.length} (published while away) + ${after.length} messages once in order across a drain and restart`);
});

test("the client's SSE transport resumes two channels exactly once across a drain and a restart", async (t) => {
  const { ctx, toml } = await redisTether(t);
  const { page, errors } = ctx;
  await page.goto(`${ctx.base}/blank.html`);
  await page.evaluate(async (wsUrl) => {
    const { Tether } = await import('/index.js');
    const s = (window.sseTest = { log: { a: [], b: [] }, subscribed: [], resets: [], connected: [], refused: null });
    const c = new Tether(wsUrl, { transport: 'sse', backoff: { baseMs: 100, capMs: 1000 } });
    c.on('connected', (e) => s.connected.push(e.transport));
    for (const ch of ['a', 'b']) {
      c.subscribe(ch, {
        onMessage: (m) => s.log[ch].push(m.seq),
        onSubscribed: (x) => s.subscribed.push(x),
        onReset: (r) => s.resets.push(r),
      });
    }
    c.publish('a', 1).catch((e) => (s.refused = e.code));
  }, ctx.server.url);
  const state = () => page.evaluate(() => window.sseTest);
  await waitFor(async () => (await state()).subscribed.length === 2, 10000, 'both channels subscribed', () => errors.join('\n'));
  const before = await publish(ctx.server, ['a', 'b'], 15, 'before');
  await waitFor(async () => (await state()).log.b.length === 15, 10000, 'the messages before the drain');
  await restart(ctx, toml);
  const away = await publish(ctx.server, ['a', 'b'], 5, 'away');
  await waitFor(async () => (await state()).subscribed.length === 4, 15000, 'the second stream', async () => JSON.stringify(await state()));
  const after = await publish(ctx.server, ['a', 'b'], 5, 'after');
  await waitFor(async () => (await state()).log.b.length === 25 && (await state()).log.a.length === 25, 10000, 'every message', async () => JSON.stringify((await state()).log));
  const s = await state();
  for (const ch of ['a', 'b']) assert.deepEqual(s.log[ch], [...before[ch], ...away[ch], ...after[ch]], `${ch}: each seq once, in order`);
  assert.deepEqual(s.resets, []);
  assert.deepEqual(s.connected, ['sse', 'sse']);
  assert.equal(s.refused, 'transport', 'publish is refused over SSE');
  assert.deepEqual(errors, []);
});

test("transport 'auto' falls back to Server-Sent Events when WebSockets cannot open", async (t) => {
  const ctx = await launch(t, '');
  const { page, errors } = ctx;
  // A proxy that passes plain HTTP to the server and refuses every WebSocket upgrade, as an
  // old corporate proxy does.
  const proxy = http.createServer((req, res) => {
    const up = http.request({ host: '127.0.0.1', port: ctx.server.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on('error', () => res.destroy());
    req.pipe(up);
  });
  proxy.on('upgrade', (_req, socket) => socket.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n'));
  await new Promise((r) => proxy.listen(0, '127.0.0.1', r));
  t.after(() => proxy.close());
  proxy.unref();
  await page.goto(`${ctx.base}/blank.html`);
  await page.evaluate(async (wsUrl) => {
    const { Tether } = await import('/index.js');
    const s = (window.sseTest = { seqs: [], connected: [], disconnected: 0 });
    const c = new Tether(wsUrl, { transport: 'auto', backoff: { baseMs: 50, capMs: 200 } });
    c.on('connected', (e) => s.connected.push(e.transport));
    c.on('disconnected', () => (s.disconnected += 1));
    c.subscribe('news', { onMessage: (m) => s.seqs.push(m.seq), onSubscribed: () => (s.subscribed = true) });
  }, `ws://127.0.0.1:${proxy.address().port}/ws`);
  const state = () => page.evaluate(() => window.sseTest);
  await waitFor(async () => (await state()).subscribed, 10000, 'the subscription over SSE', async () => JSON.stringify(await state()) + errors.join('\n'));
  const seqs = (await publish(ctx.server, ['news'], 5, 'auto')).news;
  await waitFor(async () => (await state()).seqs.length === 5, 5000, 'the messages over SSE');
  const s = await state();
  assert.deepEqual(s.seqs, seqs);
  assert.deepEqual(s.connected, ['sse'], 'two WebSocket attempts failed, then SSE');
  assert.equal(s.disconnected, 2);
  assert.deepEqual(errors, []);
});
