// `unknown_outcome` (the server's broker sent the publish to Redis and got no answer in time:
// perhaps stored) is retried like `unavailable`: the same frame, the same id, after the
// server's `retry_after_ms`; the publish resolves with the ack that follows. A WebSocket
// class standing in for the server records what the client sends.

import assert from 'node:assert/strict';
import test from 'node:test';

import { Tether } from '../index.js';

/** A WebSocket that opens at once, records sent frames, and lets the test push frames. */
class Fake {
  static last = null;
  constructor(url) {
    this.url = url;
    this.sent = [];
    Fake.last = this;
    setTimeout(() => this.onopen?.(), 0);
  }

  send(text) {
    this.sent.push({ at: Date.now(), v: JSON.parse(text) });
  }

  close() {
    setTimeout(() => this.onclose?.({ code: 1000, reason: '' }), 0);
  }

  push(v) {
    this.onmessage?.({ data: JSON.stringify(v) });
  }

  /** The `n`-th `pub` frame sent (from 1), waited for up to 2 s. */
  async pub(n) {
    const end = Date.now() + 2000;
    for (;;) {
      const pubs = this.sent.filter((s) => s.v.op === 'pub');
      if (pubs.length >= n) return pubs[n - 1];
      assert.ok(Date.now() < end, `pub #${n} not sent within 2 s; sent: ${JSON.stringify(this.sent)}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }
}

test('unknown_outcome and unavailable are retried with the same id after retry_after_ms', async () => {
  const t = new Tether('ws://127.0.0.1:9/ws', { WebSocket: Fake });
  try {
    const acked = t.publish('c', { k: 1 }, { id: 'p1' });
    const first = await Fake.last.pub(1);
    assert.deepEqual(first.v, { op: 'pub', ch: 'c', id: 'p1', data: { k: 1 } });
    const answered = Date.now();
    Fake.last.push({ op: 'error', code: 'unknown_outcome', reason: 'no answer in time', id: 'p1', ch: 'c', retry_after_ms: 40 });
    const second = await Fake.last.pub(2);
    assert.deepEqual(second.v, first.v, 'resent as it was: same id');
    assert.ok(second.at - answered >= 35, `resent ${second.at - answered} ms after the answer, before retry_after_ms`);
    Fake.last.push({ op: 'error', code: 'unavailable', reason: 'down', id: 'p1', ch: 'c', retry_after_ms: 20 });
    assert.deepEqual((await Fake.last.pub(3)).v, first.v, 'resent again, same id');
    Fake.last.push({ op: 'ack', id: 'p1', ch: 'c', seq: 7 });
    assert.deepEqual(await acked, { id: 'p1', ch: 'c', seq: 7 });
  } finally {
    t.close();
  }
});
