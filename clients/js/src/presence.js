// Presence (docs/protocol.md, "Presence"): the `presence` / `presence_stats` queries waiting
// for their answers, and the per-connection record of unanswered requests that matches each
// answer to its request. The server answers the requests about one channel in the order they
// came, and its `error` answers name the channel but no request, so an answer about `ch`
// belongs to the oldest unanswered request about `ch` on that connection.

import { TetherError } from './wire.js';

/** Notes that `what` ('sub', 'unsub' or a query) about `ch` was sent on `conn`. */
export function asked(conn, ch, what) {
  let q = conn.asked.get(ch);
  if (!q) conn.asked.set(ch, (q = []));
  q.push(what);
}

/**
 * Takes the oldest unanswered request about `ch` on `conn` when `fits(it)`: the frame just read
 * answers it. A frame that answers nothing pending (a live `reset`) leaves the record alone.
 */
export function answered(conn, ch, fits) {
  const q = conn.asked.get(ch);
  if (!q || q.length === 0 || !fits(q[0])) return undefined;
  const first = q.shift();
  if (q.length === 0) conn.asked.delete(ch);
  return first;
}

const isQuery = (x) => typeof x === 'object';

/** The application's presence queries, in the order they were made; they outlive connections. */
export class Queries {
  constructor() {
    /** @type {Set<{ch: string, op: string, got: object[], resolve: Function, reject: Function}>} */
    this.pending = new Set();
  }

  /** A new query (`op` 'presence' or 'presence_stats'); sent at once when `conn` is open. */
  add(ch, op, conn, send) {
    return new Promise((resolve, reject) => {
      const q = { ch, op, got: [], resolve, reject };
      this.pending.add(q);
      if (conn) this.ask(conn, q, null, send);
    });
  }

  ask(conn, q, cursor, send) {
    const f = { op: q.op, ch: q.ch };
    if (cursor != null) f.cursor = cursor;
    send(conn, JSON.stringify(f));
    asked(conn, q.ch, q);
  }

  /** A new connection: every query starts again from its first page. */
  resend(conn, send) {
    for (const q of this.pending) {
      q.got = [];
      this.ask(conn, q, null, send);
    }
  }

  /** A `presence` page or a `presence_stats` answer; follows `next` pages. */
  answer(conn, f, send) {
    const q = answered(conn, f.ch, isQuery);
    if (!q) return;
    if (f.op === 'presence') {
      if (!Array.isArray(f.members)) throw new Error('`presence` frame without a valid `members`');
      q.got.push(...f.members);
      if (typeof f.next === 'string') {
        this.ask(conn, q, f.next, send);
        return;
      }
      this.pending.delete(q);
      q.resolve(q.got);
    } else {
      if (!Number.isSafeInteger(f.clients) || !Number.isSafeInteger(f.users)) {
        throw new Error('`presence_stats` frame without valid `clients` and `users`');
      }
      this.pending.delete(q);
      q.resolve({ ch: f.ch, clients: f.clients, users: f.users });
    }
  }

  /**
   * An `error` naming a channel and no publish answers the oldest request about that channel;
   * when that is a query it is rejected with kind 'refused' (true). Otherwise (false) it
   * answered a `sub` or `unsub`, or is a refusal of its own, for the client to handle.
   */
  refused(conn, f) {
    if (typeof f.ch !== 'string' || f.id != null) return false;
    const q = answered(conn, f.ch, () => true);
    if (!isQuery(q)) return false;
    this.pending.delete(q);
    const code = String(f.code ?? '');
    const reason = String(f.reason ?? '');
    const details = { code, reason, ch: f.ch };
    if (Number.isSafeInteger(f.retry_after_ms)) details.retryAfterMs = f.retry_after_ms;
    q.reject(new TetherError('refused', `${code}: ${reason}`, details));
    return true;
  }

  /** The client stopped: every query rejects with `err`. */
  failAll(err) {
    for (const q of this.pending) q.reject(err);
    this.pending.clear();
  }
}
