// A drained server's 1012 closes bring 500 clients back spread over the window and the
// retry_after_ms hints, not at once. Prints p50/p99 of the reconnect times.

import assert from 'node:assert/strict';
import test from 'node:test';

import { WebSocket } from 'ws';

import { Tether } from '../index.js';
import { percentile, startTether, startTetherOn, waitFor } from './helpers.js';

const CLIENTS = 500;
const WINDOW_MS = 2000;

test(`${CLIENTS} clients come back spread after a SIGTERM drain (1012)`, async (t) => {
  const toml = `[drain]\nwindow_ms = ${WINDOW_MS}\n`;
  let server = await startTether({ toml });
  const clients = [];
  t.after(async () => {
    for (const c of clients) c.close();
    await server.stop();
  });
  const rec = [];
  for (let i = 0; i < CLIENTS; i++) {
    const c = new Tether(server.url, { WebSocket });
    const r = { down: null, code: null, hint: null, back: null };
    c.on('disconnected', (d) => {
      if (r.down == null) Object.assign(r, { down: performance.now(), code: d.code, hint: d.reason });
    });
    c.on('connected', () => {
      if (r.down != null && r.back == null) r.back = performance.now();
    });
    c.subscribe('news', {});
    clients.push(c);
    rec.push(r);
  }
  await waitFor(() => clients.every((c) => c.state === 'open' && c.subs.get('news').position), 20000, `${CLIENTS} connected and subscribed`, () => `${clients.filter((c) => c.state === 'open').length} open`);

  const t0 = performance.now();
  process.kill(server.pid, 'SIGTERM');
  const old = server;
  server = await startTetherOn(old.port, toml);
  const restarted = performance.now() - t0;
  await old.exit;
  await waitFor(() => rec.every((r) => r.back != null), 20000, `${CLIENTS} back`, () => `${rec.filter((r) => r.back != null).length} back`);

  assert.ok(rec.every((r) => r.code === 1012), `close codes: ${[...new Set(rec.map((r) => r.code))]}`);
  const downs = rec.map((r) => r.down - t0).sort((a, b) => a - b);
  const backs = rec.map((r) => r.back - t0).sort((a, b) => a - b);
  const outage = rec.map((r) => r.back - r.down).sort((a, b) => a - b);
  const perSlot = new Map();
  for (const b of backs) perSlot.set(Math.floor(b / 100), (perSlot.get(Math.floor(b / 100)) ?? 0) + 1);
  const peak = Math.max(...perSlot.values());
  const figures = {
    clients: CLIENTS,
    window_ms: WINDOW_MS,
    new_server_listening_after_ms: Math.round(restarted),
    closes_first_last_ms: [Math.round(downs[0]), Math.round(downs[CLIENTS - 1])],
    reconnect_after_sigterm_ms: { p50: Math.round(percentile(backs, 50)), p99: Math.round(percentile(backs, 99)), first: Math.round(backs[0]), last: Math.round(backs[CLIENTS - 1]) },
    reconnect_after_own_close_ms: { p50: Math.round(percentile(outage, 50)), p99: Math.round(percentile(outage, 99)) },
    peak_reconnects_per_100ms: peak,
  };
  console.log(`drain herd: ${JSON.stringify(figures)}`);
  // The closes are spread over the window, and the returns over window + hints: no instant
  // takes more than a fifth of the fleet (all at once would be 500 in one 100 ms slot).
  assert.ok(downs[CLIENTS - 1] - downs[0] >= 0.8 * WINDOW_MS, `closes spread over ${downs[CLIENTS - 1] - downs[0]} ms`);
  assert.ok(percentile(backs, 90) - percentile(backs, 10) >= WINDOW_MS / 2, 'returns spread over at least half the window');
  assert.ok(peak <= CLIENTS / 5, `peak ${peak} reconnects in one 100 ms slot`);
});
