// JWT auth (docs/security.md): the token goes as ?token=, a token function is asked again on
// `token_expired` and its newer token sent as `refresh` (the connection stays); a fixed token
// that expires gets the 4001 close, which is in the reconnect class; a subscription a backend
// ends for the token's user (POST /api/unsubscribe, docs/api.md) is reported, not taken again.

import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import test from 'node:test';

import { WebSocket } from 'ws';

import { Tether } from '../index.js';
import { startTether, waitFor } from './helpers.js';

const SECRET = 'js-client-test-secret-of-at-least-32-bytes';
const TOML = `[auth]\njwt_hs256_secret = "${SECRET}"\ntoken_refresh_grace_ms = 1000\n`;

/** An HS256 JWT for alice, valid `ms` from now, allowed every channel. */
function mint(ms) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub: 'alice', exp: (Date.now() + ms) / 1000, channels: { sub: ['*'], pub: ['*'] } })}`;
  return `${body}.${createHmac('sha256', SECRET).update(body).digest('base64url')}`;
}

test('a token function is refreshed on token_expired; the connection stays', async (t) => {
  const server = await startTether({ toml: TOML });
  let calls = 0;
  const client = new Tether(server.url, {
    WebSocket,
    token: async () => {
      calls += 1;
      return mint(700);
    },
  });
  t.after(async () => {
    client.close();
    await server.stop();
  });
  const events = [];
  const got = [];
  client.on('disconnected', (d) => events.push(d));
  client.subscribe('news', { from: 0, onMessage: (m) => got.push(m.seq) });
  await waitFor(() => calls >= 3, 5000, 'two refreshes after the first connection', () => `${calls} calls`);
  await server.publish('news', 1);
  await waitFor(() => got.length === 1, 5000, 'a message on the refreshed connection');
  assert.deepEqual(events, [], 'never disconnected');
  assert.equal(client.stats.connects, 1);
  assert.equal(await client.publish('news', 2).then((a) => a.seq), 2);
});

test('a fixed token that expires gets 4001, and the client reconnects', async (t) => {
  const server = await startTether({ toml: TOML });
  const client = new Tether(server.url, { WebSocket, token: mint(500), backoff: { baseMs: 200, capMs: 400 } });
  t.after(async () => {
    client.close();
    await server.stop();
  });
  const events = [];
  client.on('disconnected', (d) => events.push(d));
  await waitFor(() => events.length >= 1, 5000, 'the 4001 close');
  assert.equal(events[0].code, 4001);
  assert.equal(events[0].willRetry, true);
  assert.notEqual(client.state, 'stopped');
});

test('the token is the only token parameter of the URL', async () => {
  const { urlWithToken } = await import('../src/wire.js');
  assert.equal(urlWithToken('ws://h/ws', 'a b'), 'ws://h/ws?token=a%20b');
  assert.equal(urlWithToken('ws://h/ws?x=1#f', 't'), 'ws://h/ws?x=1&token=t#f');
  // A token already in the URL is replaced, not repeated (the server answers 400 to two).
  assert.equal(urlWithToken('ws://h/ws?token=old&x=1&tok%65n=o2', 't'), 'ws://h/ws?x=1&token=t');
});

test('a subscription a backend ends (POST /api/unsubscribe) is reported and not taken again', async (t) => {
  const server = await startTether({ toml: TOML });
  const client = new Tether(server.url, { WebSocket, token: mint(60000), backoff: { baseMs: 50, capMs: 100 } });
  t.after(async () => {
    client.close();
    await server.stop();
  });
  const ended = [];
  const got = [];
  let subscribed = 0;
  client.subscribe('room', {
    onSubscribed: () => (subscribed += 1),
    onUnsubscribed: (info) => ended.push(info),
    onMessage: (m) => got.push(m.seq),
  });
  await waitFor(() => subscribed === 1, 5000, 'subscribed');
  const r = await fetch(`${server.http}/api/unsubscribe`, { method: 'POST', body: JSON.stringify({ user: 'alice', ch: 'room' }) });
  assert.deepEqual(await r.json(), { unsubscribed: 1, other_nodes: 0 });
  await waitFor(() => ended.length === 1, 5000, 'onUnsubscribed');
  assert.deepEqual(ended, [{ ch: 'room', reason: 'server' }]);
  // After a reconnect the channel is not subscribed again.
  const d = await fetch(`${server.http}/api/disconnect`, { method: 'POST', body: JSON.stringify({ user: 'alice', code: 1012 }) });
  assert.equal((await d.json()).closed, 1);
  await waitFor(() => client.stats.connects === 2, 5000, 'the reconnect after 1012');
  await server.publish('room', 1);
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(got, []);
  assert.equal(subscribed, 1);
});
