// Bad input is refused with an error naming the argument or option; no server needed (a
// WebSocket class that never opens stands in).

import assert from 'node:assert/strict';
import test from 'node:test';

import { Tether, validChannel } from '../index.js';

/** A WebSocket that records what it is asked and never opens. */
class Idle {
  static urls = [];
  constructor(url) {
    Idle.urls.push(url);
  }

  send() {}

  close() {}
}

const WebSocket = Idle;

test('URLs and options are checked, naming what is wrong', () => {
  assert.throws(() => new Tether('http://h/ws', { WebSocket }), /urls: "http:\/\/h\/ws": expected a ws:\/\/ or wss:\/\/ URL/);
  assert.throws(() => new Tether(['ws://a/ws', 'nope'], { WebSocket }), /urls entry 2 of 2: "nope" is not a URL/);
  assert.throws(() => new Tether([], { WebSocket }), /urls: expected/);
  assert.throws(() => new Tether('ws://a/ws', { WebSocket, token: '' }), /token: expected a non-empty string/);
  assert.throws(() => new Tether('ws://a/ws', { WebSocket, backoff: { capMs: -1 } }), /backoff\.capMs/);
  assert.throws(() => new Tether('ws://a/ws', { WebSocket, heartbeat: { idleMs: 0 } }), /heartbeat\.idleMs/);
  assert.throws(() => new Tether('ws://a/ws', { WebSocket, storage: {} }), /storage: expected an object with getItem and setItem/);
  assert.throws(() => new Tether('ws://a/ws', { WebSocket, maxBacklog: 0 }), /maxBacklog/);
  assert.throws(() => new Tether('ws://a/ws', { WebSocket: 'x' }), /WebSocket: no global WebSocket/);
});

test('subscribe and publish refuse bad arguments, naming them', async () => {
  const t = new Tether('ws://127.0.0.1:9/ws,ws://127.0.0.1:10/ws', { WebSocket, token: 'a b&c' });
  try {
    assert.equal(Idle.urls.at(-1), 'ws://127.0.0.1:9/ws?token=a%20b%26c', 'the first URL, the token in the query');
    assert.throws(() => t.subscribe('a b'), /subscribe: ch: "a b" is not a channel name/);
    assert.throws(() => t.subscribe('news', { from: -1 }), /subscribe: from must be a non-negative integer/);
    assert.throws(() => t.subscribe('news', { epoch: 'e' }), /epoch must be a string and comes with from/);
    assert.throws(() => t.subscribe('news', { onMessage: 1 }), /subscribe: onMessage must be a function/);
    const sub = t.subscribe('news', {});
    assert.throws(() => t.subscribe('news'), /already subscribed to news/);
    assert.throws(() => sub.commit(1.5), /commit: seq must be a non-negative integer/);
    await assert.rejects(t.publish('', 1), /publish: ch: "" is not a channel name/);
    await assert.rejects(t.publish('news', 1, { id: 'x'.repeat(129) }), /publish: id must be a string of 1-128 bytes/);
    await assert.rejects(t.publish('news', undefined), /publish: data is not a JSON value/);
    await assert.rejects(t.publish('news', 1n), /publish: data is not a JSON value/);
    assert.ok(validChannel('prices.EUR:usd_1-2') && !validChannel('x'.repeat(129)));
    // Queued while not connected; close() fails it with a typed error.
    const pending = t.publish('news', { a: 1 }, { id: 'p1' });
    assert.equal(t.publish('news', { a: 1 }, { id: 'p1' }), pending, 'the same id is the same publish');
    t.close();
    await assert.rejects(pending, (e) => e.name === 'TetherError' && e.kind === 'shutdown');
    assert.equal(t.state, 'closed');
  } finally {
    t.close();
  }
});
