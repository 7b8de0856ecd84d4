// JWT auth (docs/security.md): the token goes as ?token=, a token function is asked again on
// `token_expired` and its newer token sent as `refresh` (the connection stays); a fixed token
// that expires gets the 4001 close, which is in the reconnect class.

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
