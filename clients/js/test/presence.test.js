// Presence against a real tether (docs/protocol.md, "Presence"): presence() gathers every page
// and presenceStats() counts; a joinLeave subscription gets onPresenceDiff; refusals reject
// with kind 'refused' and the server's code (retryAfterMs for `limit`); after a cut the
// subscription is made again with join_leave and onPresenceReset({reconnected: true}) comes
// before the new connection's diffs.

import assert from 'node:assert/strict';
import test from 'node:test';

import { WebSocket } from 'ws';

import { Tether, TetherError } from '../index.js';
import { proxiedClient, startTether, waitFor } from './helpers.js';

const FAST = { baseMs: 50, capMs: 200 };
const TOML = `[presence]
window_ms = 200
page_size = 2
[limits.per_connection]
presence_rate = 20
[[channels]]
pattern = "room.*"
presence = true
join_leave = true
[[channels]]
pattern = "quiet.*"
presence = true
`;

/** A plain subscriber of `ch` (a `ws` socket), resolved once `subscribed`. */
async function member(server, ch) {
  const ws = new WebSocket(server.url);
  await new Promise((resolve, reject) => {
    ws.once('open', () => ws.send(JSON.stringify({ op: 'sub', ch })));
    ws.once('message', (d) => (JSON.parse(String(d)).op === 'subscribed' ? resolve() : reject(new Error(String(d)))));
    ws.once('error', reject);
  });
  return ws;
}

test('presence lists every page, presenceStats counts, joinLeave gets the diffs', async (t) => {
  const server = await startTether({ toml: TOML });
  const others = await Promise.all([0, 1, 2, 3].map(() => member(server, 'room.a')));
  const client = new Tether(server.url, { WebSocket, backoff: FAST });
  t.after(async () => {
    client.close();
    for (const ws of others) ws.terminate();
    await server.stop();
  });
  const diffs = [];
  client.subscribe('room.a', { joinLeave: true, onPresenceDiff: (d) => diffs.push(d) });
  // Its own join comes in the first window (with whoever joined in the same window).
  await waitFor(() => diffs.length > 0, 5000, 'the first diff');
  assert.equal(diffs[0].ch, 'room.a');
  assert.ok(diffs[0].joins.length >= 1 && diffs[0].leaves.length === 0, JSON.stringify(diffs[0]));

  const members = await client.presence('room.a');
  assert.equal(members.length, 5, `five members in pages of two: ${JSON.stringify(members)}`);
  assert.equal(new Set(members.map((m) => m.client)).size, 5);
  assert.ok(members.every((m) => typeof m.client === 'string' && m.user === undefined));
  assert.deepEqual(await client.presenceStats('room.a'), { ch: 'room.a', clients: 5, users: 0 });
  assert.deepEqual(await client.presence('quiet.nobody'), []);

  others.pop().terminate();
  await waitFor(() => diffs.some((d) => d.leaves.length === 1), 5000, 'the leave', () => JSON.stringify(diffs));
  const left = diffs.find((d) => d.leaves.length === 1).leaves[0].client;
  assert.ok(members.some((m) => m.client === left));
  const now = (await client.presence('room.a')).map((m) => m.client);
  assert.equal(now.length, 4);
  assert.ok(!now.includes(left));
});

test('refusals reject with the server code; join_leave without the rule is not made again', async (t) => {
  const server = await startTether({ toml: TOML });
  const client = new Tether(server.url, { WebSocket, backoff: FAST });
  t.after(async () => {
    client.close();
    await server.stop();
  });
  await assert.rejects(client.presence('plain.x'), (e) => e instanceof TetherError && e.kind === 'refused' && e.code === 'presence_off' && e.ch === 'plain.x');
  await assert.rejects(client.presenceStats('plain.x'), (e) => e.code === 'presence_off');
  await assert.rejects(client.presence('bad name'), TypeError);
  const errors = [];
  client.subscribe('quiet.a', { joinLeave: true, onError: (e) => errors.push(e) });
  await waitFor(() => errors.length === 1, 5000, 'the refused subscription');
  assert.equal(errors[0].code, 'presence_off');
  assert.ok(!client.subs.has('quiet.a'), 'not subscribed again after a reconnect');
  // A sub and queries of one channel at once: each answer goes to its request.
  client.subscribe('room.b');
  const [list, stats] = await Promise.all([client.presence('room.b'), client.presenceStats('room.b')]);
  assert.equal(stats.clients, list.length);
  // Past presence_rate (20 per second): 'limit', with the server's wait.
  const answers = await Promise.allSettled(Array.from({ length: 60 }, () => client.presence('room.b')));
  const limited = answers.filter((a) => a.status === 'rejected').map((a) => a.reason);
  assert.ok(limited.length > 0, '60 at once, 20 per second allowed');
  for (const e of limited) {
    assert.equal(e.code, 'limit');
    assert.ok(Number.isSafeInteger(e.retryAfterMs) && e.retryAfterMs > 0, `${e.retryAfterMs}`);
  }
  assert.throws(() => client.subscribe('room.c', { joinLeave: 'yes' }), /joinLeave must be a boolean/);
});

test('after a cut join_leave is made again and onPresenceReset comes before the new diffs', async (t) => {
  const { server, proxy, client } = await proxiedClient(t, Tether, TOML, { WebSocket, backoff: FAST });
  const seen = [];
  client.subscribe('room.r', {
    joinLeave: true,
    onSubscribed: () => seen.push({ op: 'subscribed' }),
    onPresenceDiff: (d) => seen.push({ op: 'diff', joins: d.joins.map((m) => m.client), leaves: d.leaves.map((m) => m.client) }),
    onPresenceReset: (r) => seen.push({ op: 'presence_reset', reconnected: r.reconnected }),
  });
  await waitFor(() => seen.some((e) => e.op === 'diff'), 5000, 'its own join', () => JSON.stringify(seen));
  const first = seen.find((e) => e.op === 'diff').joins[0];
  const before = client.stats.connects;
  proxy.cut();
  await waitFor(() => client.stats.connects > before, 5000, 'the reconnect');
  await waitFor(() => seen.some((e) => e.op === 'presence_reset'), 5000, 'the reset', () => JSON.stringify(seen));
  const at = seen.findIndex((e) => e.op === 'presence_reset');
  assert.deepEqual(seen[at], { op: 'presence_reset', reconnected: true });
  assert.equal(seen[at - 1].op, 'subscribed', JSON.stringify(seen));
  // The new connection is a new member: its join, and the old one's leave, come as diffs after it.
  await waitFor(
    () => seen.slice(at).some((e) => e.op === 'diff' && e.joins.length > 0 && !e.joins.includes(first)),
    5000,
    'the new connection announced',
    () => JSON.stringify(seen),
  );
  // The old connection's leave reaches the server when the proxy closes its side: poll.
  let members = [];
  await waitFor(
    async () => (members = (await client.presence('room.r')).map((m) => m.client)).length === 1,
    5000,
    'only the new connection listed',
    () => JSON.stringify(members),
  );
  assert.notEqual(members[0], first);
  assert.ok(server.pid > 0);
});
