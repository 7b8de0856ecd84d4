// In headless Chromium: a page using the client from clients/js/ (unbundled ES modules) keeps
// processing a stream while the tether server is restarted (SIGTERM drain): every message is
// processed exactly once in order within each epoch, the epoch change is surfaced as a reset,
// and a page reload resumes from the position kept in sessionStorage; a page lists presence
// members and follows joins and leaves; Chromium negotiates permessage-deflate (RFC 7692) and
// receives a compressed message.

import assert from 'node:assert/strict';
import test from 'node:test';

import { WebSocket } from 'ws';

import { launch } from './browser_env.js';
import { startTetherOn, waitFor } from './helpers.js';

test('a page processes a stream exactly once in order through a server restart', async (t) => {
  const toml = '[drain]\nwindow_ms = 300\n';
  const ctx = await launch(t, toml);
  const { page, errors: consoleErrors } = ctx;
  let server = ctx.server;
  const pageUrl = `${ctx.base}/page.html?ws=${encodeURIComponent(server.url)}`;
  await page.goto(pageUrl);
  const state = () => page.evaluate(() => window.tetherTest);
  await waitFor(async () => (await state())?.subscribed.length === 1, 10000, 'the page subscribed', () => consoleErrors.join('\n'));
  const e1 = (await state()).subscribed[0].epoch;

  // The stream: published every 10 ms; the server is drained and restarted in the middle.
  const published = { [e1]: [] };
  for (let i = 0; i < 30; i++) {
    published[e1].push(await server.publish('news', { i }));
    await new Promise((r) => setTimeout(r, 10));
  }
  await server.stop('SIGTERM');
  server = ctx.server = await startTetherOn(server.port, toml);
  await waitFor(async () => (await state()).resets.length === 1, 10000, 'the reset after the restart', async () => JSON.stringify((await state()).events));
  const reset = (await state()).resets[0];
  assert.equal(reset.reason, 'epoch');
  const e2 = reset.epoch;
  published[e2] = [];
  for (let i = 0; i < 30; i++) {
    published[e2].push(await server.publish('news', { i }));
    await new Promise((r) => setTimeout(r, 10));
  }
  await waitFor(async () => (await state()).log.filter(([e]) => e === e2).length === 30, 10000, 'the 30 messages after the reset');

  const s = await state();
  const inEpoch = (e) => s.log.filter(([x]) => x === e).map(([, seq]) => seq);
  assert.deepEqual(inEpoch(e1), published[e1], 'before the restart: every message once, in order');
  assert.deepEqual(inEpoch(e2), published[e2], 'after the reset: every message once, in order');
  assert.deepEqual(s.log.map(([e]) => e), [...published[e1].map(() => e1), ...published[e2].map(() => e2)], 'no message of the old epoch after the reset');
  assert.ok(s.events.some((d) => d.event === 'disconnected' && d.code === 1012 && d.willRetry), JSON.stringify(s.events));
  assert.deepEqual(s.errors, []);

  // A reload: messages published meanwhile arrive after the committed seq kept in sessionStorage.
  const last = published[e2].at(-1);
  await page.goto('about:blank');
  const away = [];
  for (let i = 0; i < 3; i++) away.push(await server.publish('news', { away: i }));
  await page.goto(pageUrl);
  await waitFor(async () => (await state())?.log.length === 3, 10000, 'the messages published during the reload');
  const after = await state();
  assert.deepEqual(after.log, away.map((seq) => [e2, seq]));
  assert.deepEqual(away, [last + 1, last + 2, last + 3]);
  assert.equal(after.subscribed[0].recovered, true);
  assert.deepEqual(consoleErrors, []);
  console.log(`browser: ${published[e1].length} + ${published[e2].length} messages once in order across a restart, reset ${JSON.stringify(reset)}, 3 resumed after a reload`);
});

test('the README example (example.html) shows what is published', async (t) => {
  const { server, page, errors, base } = await launch(t);
  await page.goto(`${base}/example.html`);
  // Subscribed (live from the head) once the position is stored; then publish as the README does.
  await waitFor(async () => (await page.evaluate(() => sessionStorage.getItem('tether.positions'))) != null, 10000, 'the subscription', () => errors.join('\n'));
  await server.publish('news', { hello: 1 });
  const text = () => page.evaluate(() => document.getElementById('log').textContent);
  await waitFor(async () => (await text()).includes('1 {"hello":1}'), 5000, 'the message on the page', () => errors.join('\n'));
  assert.deepEqual(errors, []);
});

test('coming back online reconnects at once instead of waiting out the backoff', async (t) => {
  const ctx = await launch(t);
  const { page, errors } = ctx;
  // Backoff windows of 60 s and a jitter at their far end: without the lifecycle hook the page
  // would wait 59.4 s.
  await page.goto(`${ctx.base}/page.html?base=60000&jitter=0.99&ws=${encodeURIComponent(ctx.server.url)}`);
  const state = () => page.evaluate(() => window.tetherTest);
  await waitFor(async () => (await state())?.subscribed.length === 1, 10000, 'the page subscribed', () => errors.join('\n'));
  const port = ctx.server.port;
  await ctx.server.stop('SIGKILL');
  await waitFor(async () => (await state()).events.some((e) => e.event === 'disconnected'), 10000, 'the disconnect');
  ctx.server = await startTetherOn(port, '');
  const [down] = (await state()).events.filter((e) => e.event === 'disconnected');
  await page.setOfflineMode(true);
  await page.setOfflineMode(false);
  const online = Date.now();
  await waitFor(async () => (await state()).events.filter((e) => e.event === 'connected').length === 2, 5000, 'the reconnect after online', async () => JSON.stringify((await state()).events));
  const back = (await state()).events.filter((e) => e.event === 'connected')[1];
  await waitFor(async () => (await state()).resets.length === 1, 5000, 'the reset (a new server, a new epoch)');
  console.log(`browser: online reconnected after ${back.at - online} ms (the backoff had said ${down.retryInMs} ms)`);
  assert.ok(down.retryInMs >= 59000, `the backoff said ${down.retryInMs} ms`);
  assert.ok(back.at - online < 2000, `reconnected ${back.at - online} ms after online`);
});

test('a page lists who is in a presence channel and follows joins and leaves', async (t) => {
  const toml = '[presence]\nwindow_ms = 100\n[[channels]]\npattern = "room.*"\npresence = true\njoin_leave = true\n';
  const { server, page, errors, base } = await launch(t, toml);
  await page.goto(`${base}/example.html`);
  // The client imported unbundled, as a page does; members kept by client id, as the README says.
  await page.evaluate(async (wsUrl) => {
    const { Tether } = await import('/index.js');
    const p = (window.presenceTest = { here: {}, diffs: 0 });
    const t = new Tether(wsUrl);
    t.subscribe('room.w', {
      joinLeave: true,
      onPresenceDiff({ joins, leaves }) {
        p.diffs += 1;
        for (const m of leaves) delete p.here[m.client];
        for (const m of joins) p.here[m.client] = m;
      },
    });
    p.listed = (await t.presence('room.w')).length;
    p.stats = await t.presenceStats('room.w');
  }, server.url);
  const state = () => page.evaluate(() => window.presenceTest);
  await waitFor(async () => Object.keys((await state()).here).length === 1, 5000, 'its own join', () => errors.join('\n'));
  const other = new WebSocket(server.url);
  t.after(() => other.close());
  await new Promise((r) => other.addEventListener('open', r, { once: true }));
  other.send(JSON.stringify({ op: 'sub', ch: 'room.w' }));
  await waitFor(async () => Object.keys((await state()).here).length === 2, 5000, 'the other join');
  other.close();
  await waitFor(async () => Object.keys((await state()).here).length === 1, 5000, 'the other leave');
  const s = await state();
  // Asked right after the sub: answered after it (one channel's answers in order), so the page is in.
  assert.ok(s.listed === 1 && s.stats.clients === 1, JSON.stringify(s));
  assert.deepEqual(errors, []);
});

test('Chromium negotiates permessage-deflate and receives a compressed snapshot', async (t) => {
  const { server, page, errors, base } = await launch(t);
  // A page of the test's static server (its 404), so the socket has an ordinary origin.
  await page.goto(`${base}/blank`);
  // The browser offers permessage-deflate by itself; the page sees what the server answered.
  const extensions = await page.evaluate((url) => new Promise((resolve, reject) => {
    const ws = new WebSocket(url);
    window.deflateTest = { got: null };
    ws.onerror = () => reject(new Error('WebSocket error'));
    ws.onopen = () => ws.send(JSON.stringify({ op: 'sub', ch: 'md.book' }));
    ws.onmessage = (e) => {
      const m = JSON.parse(e.data);
      if (m.op === 'subscribed') resolve(ws.extensions);
      if (m.op === 'msg') window.deflateTest.got = e.data;
    };
  }), server.url);
  assert.equal(extensions, 'permessage-deflate; server_no_context_takeover; client_no_context_takeover');
  // A ~1 KiB order book (over compression.min_bytes): it goes out compressed.
  const level = (i, side) => [(97321.5 + side * (0.5 + i * 0.5)).toFixed(2), ((i * 7919) % 100000 / 1e4).toFixed(5)];
  const book = { type: 'snapshot', symbol: 'BTC-USD', bids: [], asks: [] };
  for (let i = 0; i < 20; i++) {
    book.bids.push(level(i, -1));
    book.asks.push(level(i, 1));
  }
  assert.ok(JSON.stringify(book).length > 700);
  const seq = await server.publish('md.book', book);
  const text = await waitFor(() => page.evaluate(() => window.deflateTest.got), 5000, 'the snapshot in the page', () => errors.join('\n'));
  const m = JSON.parse(text);
  assert.equal(m.seq, seq);
  assert.deepEqual(m.data, book);
  assert.equal(await server.metric('tether_deflate_messages_total', 'result="compressed"'), 1);
  assert.equal(await server.metric('tether_deflate_connections'), 1);
  assert.deepEqual(errors, []);
});
