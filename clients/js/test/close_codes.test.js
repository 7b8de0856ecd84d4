// Close-code classes against a real tether: a 1008 (abuse limit) stops the client for good
// with a typed error; a silent socket is found by the heartbeat probe and replaced.

import assert from 'node:assert/strict';
import test from 'node:test';

import { WebSocket } from 'ws';

import { Tether, TetherError } from '../index.js';
import { proxiedClient, startTether, waitFor } from './helpers.js';

test('no reconnect after 1008: a typed error, publishes rejected', async (t) => {
  const { proxy, client } = await proxiedClient(t, Tether, '[limits.per_connection]\npublish_rate = 1\n', { WebSocket, backoff: { baseMs: 20, capMs: 50 } });
  const events = [];
  const errors = [];
  client.on('disconnected', (d) => events.push(d));
  client.on('error', (e) => errors.push(e));
  await waitFor(() => client.state === 'open', 5000, 'connected');
  // Far past 10 x the rate within one second: the server closes with 1008.
  const results = await Promise.allSettled(Array.from({ length: 40 }, (_, i) => client.publish('flood', { i })));
  await waitFor(() => client.state === 'stopped', 5000, 'the stop', () => JSON.stringify(events));
  // Each publish was acked, refused with `limit`, or failed with the 1008 stop: the refusals
  // are answered at once, the ack of an accepted publish comes back from the channel's home
  // core, so the 1008 close can come first and that publish fails with the stop error.
  const outcome = (r) => (r.status === 'fulfilled' ? 'acked' : r.reason.kind === 'refused' ? r.reason.code : `${r.reason.kind} ${r.reason.closeCode}`);
  const seen = new Set(results.map(outcome));
  assert.ok([...seen].every((o) => ['acked', 'limit', 'closed 1008'].includes(o)), `outcomes: ${[...seen]}`);
  assert.ok(seen.has('closed 1008'), 'publishes still pending at the close fail with the 1008 error');
  assert.deepEqual(events.map((d) => [d.code, d.willRetry]), [[1008, false]]);
  const closed = errors.find((e) => e.kind === 'closed');
  assert.equal(closed?.closeCode, 1008, `errors: ${errors.map((e) => e.message)}`);
  // With 20-50 ms backoff windows, a reconnecting client would have come back many times.
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(proxy.accepted, 1, 'no second connection');
  await assert.rejects(client.publish('flood', {}), (e) => e.kind === 'closed' && e.closeCode === 1008);
});

test('a silent socket is probed, dropped and replaced', async (t) => {
  const opts = { WebSocket, backoff: { baseMs: 20, capMs: 50 }, heartbeat: { idleMs: 200, timeoutMs: 300 } };
  const { server, proxy, client } = await proxiedClient(t, Tether, '', opts);
  const events = [];
  const got = [];
  client.on('disconnected', (d) => events.push(d));
  client.subscribe('quiet', { onMessage: (m) => got.push(m.seq) });
  await waitFor(() => client.subs.get('quiet').position, 5000, 'subscribed');
  // Idle but healthy: every probe is answered, the connection stays (several probe rounds).
  await new Promise((r) => setTimeout(r, 1200));
  assert.deepEqual(events, [], 'no false alarm on a quiet, healthy connection');
  const t0 = Date.now();
  proxy.blackhole();
  await waitFor(() => events.length === 1, 3000, 'the dead socket found');
  const found = Date.now() - t0;
  assert.equal(events[0].code, 1006);
  assert.match(events[0].reason, /heartbeat/);
  assert.ok(found <= 200 + 300 + 300, `found after ${found} ms (idle 200 + timeout 300 + a timer tick)`);
  await waitFor(() => client.stats.connects === 2, 3000, 'the new connection');
  await server.publish('quiet', 1);
  await waitFor(() => got.length === 1, 5000, 'a message on the new connection');
  console.log(`heartbeat: a blackholed socket was declared dead after ${found} ms (idleMs 200 + timeoutMs 300)`);
});

test('several URLs: when a node dies the client moves to the next one', async (t) => {
  const a = await startTether();
  const b = await startTether();
  const client = new Tether([a.url, b.url], { WebSocket, backoff: { baseMs: 100, capMs: 1000 } });
  t.after(async () => {
    client.close();
    await a.stop();
    await b.stop();
  });
  const connected = [];
  const resets = [];
  client.on('connected', (e) => connected.push(e.url));
  client.subscribe('news', { onReset: (r) => resets.push(r) });
  await waitFor(() => client.subs.get('news').position, 5000, 'subscribed on the first node');
  await a.stop('SIGKILL');
  await waitFor(() => connected.length === 2, 3000, 'the move to the second node');
  assert.deepEqual(connected, [a.url, b.url]);
  // The memory broker: each node numbers its channels under its own epoch.
  await waitFor(() => resets.length === 1, 3000, 'the reset on the other node');
  assert.equal(resets[0].reason, 'epoch');
});
