// Delivery rules against a real tether: exactly once and in order across two forced cuts
// (RST through a proxy), a `reset` on an epoch change (server restart, memory broker), resume
// after a page reload from `storage`, and an outbox resend that the server deduplicates.

import assert from 'node:assert/strict';
import test from 'node:test';

import { WebSocket } from 'ws';

import { Tether } from '../index.js';
import { MemoryStorage, proxiedClient, startTether, startTetherOn, waitFor } from './helpers.js';

const FAST = { baseMs: 50, capMs: 200 };

test('order and exactly-once across two forced cuts', async (t) => {
  const { server, proxy, client } = await proxiedClient(t, Tether, '', { WebSocket, backoff: FAST });
  const processed = [];
  // Around each cut, processing is held (`gate`) with a message received but not processed
  // (not committed), so the resume asks from before it and the replay repeats what the client
  // holds: the copies must be dropped, whatever the timing of the reconnect.
  let gate = null;
  let holdAfter = Infinity;
  let held = 0;
  client.subscribe('news', {
    from: 0,
    async onMessage(msg) {
      if (msg.seq > holdAfter) {
        held += 1;
        await gate;
      }
      await new Promise((r) => setTimeout(r, 2));
      processed.push(msg.seq);
    },
  });
  await waitFor(() => client.stats.connects === 1 && client.subs.get('news').position, 5000, 'the first subscription');
  const N = 300;
  for (let i = 0; i < N; i += 25) {
    const cutHere = i + 25 === 100 || i + 25 === 200;
    let open;
    if (cutHere) {
      // Messages past the burst's fifth are held until the reconnect.
      gate = new Promise((r) => (open = r));
      holdAfter = i + 5;
      held = 0;
    }
    await Promise.all(Array.from({ length: 25 }, (_, k) => server.publish('news', { i: i + k })));
    if (cutHere) {
      await waitFor(() => processed.length >= i + 5 && held > 0, 5000, 'part of the burst processed, the next held');
      const before = client.stats.connects;
      proxy.cut();
      await waitFor(() => client.stats.connects > before, 5000, `the reconnect after the cut at ${i + 25}`);
      holdAfter = Infinity;
      open();
    }
  }
  await waitFor(() => processed.length >= N, 10000, `${N} messages processed`, () => `${processed.length}`);
  assert.deepEqual(processed, Array.from({ length: N }, (_, i) => i + 1), 'every seq once, in order');
  assert.equal(client.stats.connects, 3);
  assert.equal(proxy.accepted, 3);
  assert.equal(client.subs.get('news').position.seq, N, 'committed after processing');
  assert.ok(client.stats.duplicatesDropped > 0, 'a cut landed before processing: the replay repeated what was received');
  console.log(`two cuts: ${N} processed once in order; replayed copies dropped: ${client.stats.duplicatesDropped}`);
});

test('an epoch change (server restart) surfaces reset; storage resumes after a page reload', async (t) => {
  const toml = '[drain]\nwindow_ms = 100\n';
  let server = await startTether({ toml });
  const storage = new MemoryStorage();
  const seen = [];
  const resets = [];
  const handlers = {
    onMessage: (m) => seen.push(`${m.epoch}:${m.seq}`),
    onReset: (r) => resets.push(r),
  };
  let client = new Tether(server.url, { WebSocket, backoff: FAST, storage });
  t.after(async () => {
    client.close();
    await server.stop();
  });
  const subscribed = [];
  client.subscribe('news', { from: 0, ...handlers, onSubscribed: (s) => subscribed.push(s) });
  await waitFor(() => subscribed.length === 1, 5000, 'subscribed');
  const e1 = subscribed[0].epoch;
  for (let i = 0; i < 3; i++) await server.publish('news', { i });
  await waitFor(() => seen.length === 3, 5000, '3 messages', () => seen.join(','));

  await server.stop('SIGTERM');
  server = await startTetherOn(server.port, toml);
  await waitFor(() => resets.length === 1, 10000, 'a reset after the restart');
  const r = resets[0];
  assert.equal(r.reason, 'epoch');
  assert.notEqual(r.epoch, e1);
  assert.equal(r.seq, 0);
  for (let i = 0; i < 2; i++) await server.publish('news', { i });
  await waitFor(() => seen.length === 5, 5000, '2 messages after the reset', () => seen.join(','));
  const e2 = r.epoch;
  assert.deepEqual(seen, [`${e1}:1`, `${e1}:2`, `${e1}:3`, `${e2}:1`, `${e2}:2`]);
  assert.deepEqual(JSON.parse(storage.getItem('tether.positions')), { news: { seq: 2, epoch: e2 } });

  // A page reload: the client goes, messages are published meanwhile, a new client with the
  // same storage resumes after the committed seq (recovered), not from the head.
  client.close();
  for (let i = 0; i < 3; i++) await server.publish('news', { i });
  seen.length = 0;
  const again = [];
  client = new Tether(server.url, { WebSocket, backoff: FAST, storage });
  client.subscribe('news', { ...handlers, onSubscribed: (s) => again.push(s) });
  await waitFor(() => seen.length === 3, 5000, 'the 3 messages published while away', () => seen.join(','));
  assert.deepEqual(seen, [`${e2}:3`, `${e2}:4`, `${e2}:5`]);
  assert.equal(again[0].recovered, true);
  assert.equal(resets.length, 1);
});

test('an unacked publish is resent with its id after a cut and deduplicated by the server', async (t) => {
  const { server, proxy, client: publisher } = await proxiedClient(t, Tether, '', { WebSocket, backoff: FAST });
  const reader = new Tether(server.url, { WebSocket, backoff: FAST });
  t.after(() => reader.close());
  const got = [];
  reader.subscribe('orders', { from: 0, onMessage: (m) => got.push(m) });
  await waitFor(() => publisher.stats.connects === 1 && reader.stats.connects === 1, 5000, 'both connected');
  // The server's answers stop reaching the publisher: its pub is stored, its ack is lost.
  proxy.hold();
  const ack = publisher.publish('orders', { order: 7 });
  await waitFor(async () => (await server.metric('tether_messages_published_total')) === 1, 5000, 'the publish stored');
  const id = [...publisher.outbox.keys()][0];
  proxy.cut();
  const a = await ack;
  assert.equal(a.id, id, 'acked under the id it was first sent with');
  assert.equal(a.seq, 1, 'the original seq');
  assert.equal(publisher.stats.connects, 2);
  assert.equal(await server.metric('tether_publish_duplicates_total'), 1, 'the resend was a duplicate');
  assert.equal(await server.metric('tether_messages_published_total'), 1);
  await server.publish('orders', { order: 8 });
  await waitFor(() => got.length === 2, 5000, 'two messages at the reader');
  assert.deepEqual(got.map((m) => [m.seq, m.data.order]), [[1, 7], [2, 8]], 'the resend was not published twice');
  // A caller-chosen id: a second publish with it gets the original ack.
  const b1 = await publisher.publish('orders', { order: 9 }, { id: 'order-9' });
  const b2 = await publisher.publish('orders', { order: 9 }, { id: 'order-9' });
  assert.equal(b1.seq, b2.seq);
});

test('a backlog past maxBacklog stops reading until it is worked off, then resumes exactly once', async (t) => {
  const server = await startTether();
  const client = new Tether(server.url, { WebSocket, backoff: FAST, maxBacklog: 50 });
  t.after(async () => {
    client.close();
    await server.stop();
  });
  const events = [];
  const processed = [];
  let longest = 0;
  client.on('disconnected', (d) => events.push(d));
  client.subscribe('firehose', {
    from: 0,
    async onMessage(m, sub) {
      longest = Math.max(longest, sub.queue.length);
      await new Promise((r) => setTimeout(r, 1));
      processed.push(m.seq);
    },
  });
  await waitFor(() => client.subs.get('firehose').position, 5000, 'subscribed');
  const N = 400;
  for (let i = 0; i < N; i += 100) await Promise.all(Array.from({ length: 100 }, () => server.publish('firehose', {})));
  await waitFor(() => processed.length >= N, 20000, `${N} processed`, () => `${processed.length}`);
  assert.deepEqual(processed, Array.from({ length: N }, (_, i) => i + 1));
  assert.ok(events.length >= 1 && events.every((d) => d.code === 4000 && d.willRetry), JSON.stringify(events));
  assert.ok(longest <= 51, `the backlog reached ${longest}`);
  console.log(`backlog: ${N} processed once in order with maxBacklog 50 (longest backlog ${longest}); ${events.length} pauses, ${client.stats.connects} connections`);
});
