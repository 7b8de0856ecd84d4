// The reconnect delays: full jitter within the formula's bounds, the floor, the stable reset,
// the URL ring, and the close-code classes. No server needed.

import assert from 'node:assert/strict';
import test from 'node:test';

import { Backoff, Rotation, classifyClose, retryHint } from '../index.js';

test('1,000 delays per attempt are uniform in [0, min(cap, base*2^n)]', () => {
  const report = [];
  for (let n = 0; n <= 7; n++) {
    const ceiling = Math.min(30000, 500 * 2 ** n);
    const delays = [];
    for (let i = 0; i < 1000; i++) {
      const b = new Backoff({ baseMs: 500, capMs: 30000 });
      b.attempt = n;
      assert.equal(b.ceiling(), ceiling);
      delays.push(b.next());
    }
    const mean = delays.reduce((a, b) => a + b, 0) / delays.length;
    const sd = Math.sqrt(delays.reduce((a, d) => a + (d - mean) ** 2, 0) / (delays.length - 1));
    assert.ok(delays.every((d) => d >= 0 && d <= ceiling), `attempt ${n}: a delay outside [0, ${ceiling}]`);
    // Uniform on [0, c]: mean c/2 with a standard error of c/sqrt(12*1000) = 0.0091c, sd c/sqrt(12).
    assert.ok(Math.abs(mean - ceiling / 2) < 0.05 * ceiling, `attempt ${n}: mean ${mean} vs ${ceiling / 2}`);
    assert.ok(Math.abs(sd - ceiling / Math.sqrt(12)) < 0.1 * ceiling / Math.sqrt(12), `attempt ${n}: sd ${sd}`);
    // Spread: each tenth of the window holds 5-15 % of the delays, so no instant gets the herd.
    const slots = new Array(10).fill(0);
    for (const d of delays) slots[Math.min(9, Math.floor((d / ceiling) * 10))] += 1;
    assert.ok(slots.every((s) => s >= 50 && s <= 150), `attempt ${n}: tenths ${slots}`);
    report.push({ attempt: n, ceiling_ms: ceiling, mean_ms: Math.round(mean), sd_ms: Math.round(sd), min_ms: Math.round(Math.min(...delays)), max_ms: Math.round(Math.max(...delays)) });
  }
  console.log(`backoff distribution (1,000 delays each): ${JSON.stringify(report)}`);
});

test('the ceiling doubles then caps; the hint is the floor, even above the cap', () => {
  const b = new Backoff({ baseMs: 500, capMs: 30000 });
  const seen = [];
  for (let i = 0; i < 9; i++) {
    seen.push(b.ceiling());
    b.next();
  }
  assert.deepEqual(seen, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
  for (let i = 0; i < 200; i++) b.next();
  assert.equal(b.ceiling(), 30000, 'no overflow');
  assert.equal(b.next(45000), 45000);
  for (let i = 0; i < 100; i++) assert.ok(b.next(400) >= 400);
});

test('a connection up stableMs resets the attempt count; a shorter one does not', () => {
  const b = new Backoff({ stableMs: 10000 });
  for (let i = 0; i < 4; i++) b.next();
  assert.equal(b.connectedFor(9999), false);
  assert.equal(b.attempt, 4);
  assert.equal(b.connectedFor(10000), true);
  assert.equal(b.attempt, 0);
  assert.equal(b.ceiling(), 500);
});

test('bad backoff options are refused naming the field', () => {
  assert.throws(() => new Backoff({ baseMs: -1 }), /backoff\.baseMs/);
  assert.throws(() => new Backoff({ capMs: 'x' }), /backoff\.capMs/);
});

test('several URLs: next URL promptly, full jitter once per failed round', () => {
  const urls = ['ws://a/ws', 'ws://b/ws', 'ws://c/ws'];
  const r = new Rotation(urls, new Backoff({ baseMs: 500, capMs: 30000 }));
  assert.equal(r.url(), urls[0]);
  for (let round = 0; round < 6; round++) {
    for (let i = 1; i <= 3; i++) {
      const ceiling = r.backoff.ceiling();
      const d = r.ended(null);
      assert.equal(r.url(), urls[i % 3]);
      if (i < 3) {
        assert.ok(d <= 500, `a switch waits at most base, not ${d}`);
        assert.equal(r.backoff.attempt, round);
      } else {
        assert.ok(d <= ceiling);
        assert.equal(r.backoff.attempt, round + 1);
      }
    }
  }
  // Up a minute, then it dies: the next URL at once, and a new row.
  assert.ok(r.ended(60000) <= 500);
  assert.equal(r.backoff.attempt, 0);
  assert.ok(r.ended(null, 2500) >= 2500, 'the hint is the floor of a switch too');
});

test('close codes: reconnect class and stop class', () => {
  for (const c of [1001, 1006, 1011, 1012, 1013, 4001]) assert.equal(classifyClose(c), 'reconnect', `code ${c}`);
  for (const c of [1000, 1002, 1003, 1005, 1007, 1008, 1009, 1010, 4000, 4003]) assert.equal(classifyClose(c), 'stop', `code ${c}`);
  assert.equal(retryHint('{"reason":"restart","retry_after_ms":850}'), 850);
  for (const r of ['', 'slow', '{"retry_after_ms":-5}', '{"retry_after_ms":"250"}', '{"retry_after_ms":1.5}', '[1]']) {
    assert.equal(retryHint(r), 0, r);
  }
});
