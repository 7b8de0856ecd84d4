// The connection: connect (to the next URL on every reconnect), resubscribe from committed
// positions, resend the outbox and the presence queries, read frames, watch for silence,
// reconnect with full jitter by close-code class. The rules are those of the Rust client
// (docs/protocol.md).

import { Backoff, Rotation, classifyClose, retryHint } from './backoff.js';
import { Queries, answered, asked } from './presence.js';
import { SseSocket } from './sse.js';
import { Subscription } from './subscription.js';
import { PROBE_CHANNEL, TetherError, checkChannel, checkUrls, newId, subFrame, urlWithToken } from './wire.js';

const HANDLERS = ['onMessage', 'onReset', 'onSubscribed', 'onUnsubscribed', 'onError', 'onPresenceDiff', 'onPresenceReset'];

/**
 * A reconnecting, resuming tether client for browsers and Node ≥ 20. See README.md.
 * Lifecycle (`state`): 'connecting' → 'open' → 'waiting' (backoff before the next attempt) →
 * 'connecting' …; 'backlogged' (not reading until the application has worked off its backlog);
 * 'stopped' after a stop close code or a protocol error; 'closed' after close().
 */
export class Tether {
  /**
   * @param {string | string[]} urls one `ws://…/ws` URL, a comma-separated list, or an array
   * @param {object} [opts] see index.d.ts (TetherOptions)
   * @throws {TypeError} naming the option or URL entry that is wrong
   */
  constructor(urls, opts = {}) {
    this.urls = checkUrls(urls);
    this.transport = opts.transport ?? 'websocket';
    if (!['websocket', 'sse', 'auto'].includes(this.transport)) {
      throw new TypeError(`transport must be 'websocket', 'sse' or 'auto', got ${JSON.stringify(opts.transport)}`);
    }
    this.WebSocket = opts.WebSocket ?? globalThis.WebSocket;
    if (this.transport !== 'sse' && typeof this.WebSocket !== 'function') {
      throw new TypeError('WebSocket: no global WebSocket here: pass one, e.g. `import { WebSocket } from "ws"`');
    }
    this.EventSource = opts.EventSource ?? globalThis.EventSource;
    if (this.transport !== 'websocket' && typeof this.EventSource !== 'function') {
      throw new TypeError(`EventSource: transport '${this.transport}' needs one, and there is no global EventSource here: pass one`);
    }
    // Server-Sent Events from the start ('sse'), or after WebSockets failed to open twice in a
    // row ('auto'); then until the client is closed.
    this.useSse = this.transport === 'sse';
    this.failedOpens = 0;
    const token = opts.token;
    if (token != null && !(typeof token === 'function' || (typeof token === 'string' && token !== ''))) {
      throw new TypeError('token: expected a non-empty string or a function returning one (or a promise of one)');
    }
    this.token = token;
    this.rotation = new Rotation(this.urls, new Backoff(opts.backoff ?? {}, opts.random ?? Math.random));
    this.heartbeat = opts.heartbeat === false ? null : { idleMs: 25000, timeoutMs: 10000, ...opts.heartbeat };
    this.connectTimeoutMs = opts.connectTimeoutMs ?? 10000;
    for (const [k, v] of [['heartbeat.idleMs', this.heartbeat?.idleMs ?? 1], ['heartbeat.timeoutMs', this.heartbeat?.timeoutMs ?? 1], ['connectTimeoutMs', this.connectTimeoutMs]]) {
      if (typeof v !== 'number' || !(v > 0)) throw new TypeError(`${k} must be a number of milliseconds > 0, got ${v}`);
    }
    this.storage = opts.storage ?? null;
    if (this.storage && (typeof this.storage.getItem !== 'function' || typeof this.storage.setItem !== 'function')) {
      throw new TypeError('storage: expected an object with getItem and setItem (localStorage, sessionStorage)');
    }
    this.storageKey = opts.storageKey ?? 'tether.positions';
    this.maxBacklog = opts.maxBacklog ?? 10000;
    if (!Number.isSafeInteger(this.maxBacklog) || this.maxBacklog < 1) {
      throw new TypeError(`maxBacklog must be a positive integer number of messages, got ${opts.maxBacklog}`);
    }
    /** Counters since the client started. */
    this.stats = { connects: 0, duplicatesDropped: 0, gaps: 0 };
    /** @type {Map<string, Subscription>} in subscription order */
    this.subs = new Map();
    /** Publishes not yet acked, in publish order: id → {frame, resolve, reject, promise}. */
    this.outbox = new Map();
    /** Presence queries waiting for their answers. */
    this.queries = new Queries();
    this.listeners = new Map();
    this.stored = this.load();
    this.conn = null;
    this.timer = null;
    this.floorUntil = 0;
    this.terminal = null;
    this.heldToken = null;
    this.watchPage(opts.lifecycle !== false);
    this.state = 'connecting';
    this.connect();
  }

  /**
   * Adds a listener for 'connected' ({url}), 'disconnected' ({code, reason, willRetry,
   * retryInMs, url}) or 'error' (a TetherError). Returns a function that removes it.
   */
  on(event, fn) {
    if (!this.listeners.has(event)) this.listeners.set(event, new Set());
    this.listeners.get(event).add(fn);
    return () => this.listeners.get(event)?.delete(fn);
  }

  /**
   * Subscribes to `ch` on this and every later connection and returns the Subscription. The
   * resume point is, in order: the position kept in `storage`, then `from` (the last seq
   * already processed, with its `epoch`), else none (live from the head). With `joinLeave`
   * the subscription also receives the channel's joins and leaves (onPresenceDiff), and after
   * every reconnect onPresenceReset({reconnected: true}).
   * @throws {TypeError} naming the bad argument; {Error} when `ch` is already subscribed
   */
  subscribe(ch, opts = {}) {
    checkChannel(ch, 'subscribe: ch');
    if (this.subs.has(ch)) throw new Error(`subscribe: already subscribed to ${ch}`);
    if (opts.from != null && !(Number.isSafeInteger(opts.from) && opts.from >= 0)) {
      throw new TypeError(`subscribe: from must be a non-negative integer seq, got ${opts.from}`);
    }
    if (opts.epoch != null && (typeof opts.epoch !== 'string' || opts.from == null)) {
      throw new TypeError('subscribe: epoch must be a string and comes with from');
    }
    for (const h of HANDLERS) {
      if (opts[h] != null && typeof opts[h] !== 'function') throw new TypeError(`subscribe: ${h} must be a function`);
    }
    if (opts.joinLeave != null && typeof opts.joinLeave !== 'boolean') {
      throw new TypeError(`subscribe: joinLeave must be a boolean, got ${JSON.stringify(opts.joinLeave)}`);
    }
    const position = this.stored[ch] ?? (opts.from != null ? { seq: opts.from, epoch: opts.epoch } : null);
    const sub = new Subscription(this, ch, position, opts);
    this.subs.set(ch, sub);
    if (this.state === 'open') this.sendSub(this.conn, sub);
    return sub;
  }

  /**
   * Publishes `data` (any JSON value) on `ch` at least once: the publish stays in the outbox,
   * and is sent again with the same id after every reconnect, until the server acks it (the
   * server's dedup by id makes resends harmless). Resolves to the ack {id, ch, seq}.
   * Rejects with a TypeError naming a bad argument, a TetherError 'refused' when the server
   * answers `error` for this id, or the client's terminal TetherError.
   * @param {string} ch @param {unknown} data @param {{id?: string}} [opts] id: 1–128 bytes
   */
  publish(ch, data, opts = {}) {
    try {
      checkChannel(ch, 'publish: ch');
      const id = opts.id ?? newId();
      if (typeof id !== 'string' || id === '' || new TextEncoder().encode(id).length > 128) {
        throw new TypeError(`publish: id must be a string of 1-128 bytes, got ${JSON.stringify(id)}`);
      }
      if (this.terminal) return Promise.reject(this.terminal);
      if (this.useSse) return Promise.reject(overSse('publish'));
      const pending = this.outbox.get(id);
      if (pending) return pending.promise;
      let json;
      try {
        json = JSON.stringify(data);
      } catch (e) {
        throw new TypeError(`publish: data is not a JSON value: ${e.message}`);
      }
      if (json === undefined) throw new TypeError('publish: data is not a JSON value');
      const entry = { id, frame: `{"op":"pub","ch":${JSON.stringify(ch)},"id":${JSON.stringify(id)},"data":${json}}` };
      entry.promise = new Promise((resolve, reject) => Object.assign(entry, { resolve, reject }));
      this.outbox.set(id, entry);
      if (this.state === 'open') this.send(this.conn, entry.frame);
      return entry.promise;
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Every member of presence channel `ch` ({client, user?, info?} each), all `next` pages
   * followed. Needs the channel's `sub` right, not a subscription; asked again from the first
   * page after a reconnect. Rejects with a TypeError for a bad channel name, a TetherError
   * 'refused' (`code` 'presence_off', 'forbidden', or 'limit' with `retryAfterMs`), or the
   * client's terminal error.
   * @param {string} ch
   */
  presence(ch) {
    return this.query(ch, 'presence');
  }

  /**
   * How many are in presence channel `ch`: {ch, clients, users} (connections, and distinct
   * JWT `sub`s among them). Rejects as presence().
   * @param {string} ch
   */
  presenceStats(ch) {
    return this.query(ch, 'presence_stats');
  }

  query(ch, op) {
    try {
      checkChannel(ch, `${op === 'presence' ? 'presence' : 'presenceStats'}: ch`);
    } catch (e) {
      return Promise.reject(e);
    }
    if (this.terminal) return Promise.reject(this.terminal);
    if (this.useSse) return Promise.reject(overSse(op));
    return this.queries.add(ch, op, this.state === 'open' ? this.conn : null, (c, t) => this.send(c, t));
  }

  /** Closes the connection with 1000 and stops; unacked publishes reject with 'shutdown'. */
  close() {
    if (this.terminal) return;
    this.finish(new TetherError('shutdown', 'the client was closed'));
    this.state = 'closed';
  }

  // ---- connections ----

  async connect() {
    this.timer = null;
    this.state = 'connecting';
    const url = this.rotation.url();
    let target = url;
    if (this.token != null) {
      try {
        const t = typeof this.token === 'function' ? await this.token() : this.token;
        if (typeof t !== 'string' || t === '') throw new Error('the token function returned no token');
        target = urlWithToken(url, t);
        this.heldToken = t;
        this.refreshing = null;
      } catch (e) {
        if (this.state === 'connecting') this.retry(null, url, null, 1006, `no token for the connection: ${e?.message ?? e}`);
        return;
      }
      if (this.state !== 'connecting') return;
    }
    let ws;
    try {
      ws = this.useSse ? new SseSocket(this.EventSource, target, () => [...this.subs.values()]) : new this.WebSocket(target);
    } catch (e) {
      this.retry(null, url, null, 1006, String(e?.message ?? e));
      return;
    }
    // asked: per channel, the requests sent on this connection and not yet answered (presence.js).
    const conn = { ws, url, sse: this.useSse, openedAt: null, lastSeen: Date.now(), probeAt: null, epochs: new Map(), sent: new Set(), asked: new Map(), timers: new Set() };
    this.conn = conn;
    this.later(conn, this.connectTimeoutMs, () => this.lost(conn, 'connect timed out'));
    ws.onopen = () => this.opened(conn);
    ws.onmessage = (ev) => this.frame(conn, ev.data);
    ws.onclose = (ev) => this.ended(conn, ev.code || 1006, ev.reason || '');
    ws.onerror = () => {}; // the close event that follows tells why
  }

  opened(conn) {
    if (this.conn !== conn) return;
    this.clearTimers(conn);
    conn.openedAt = conn.lastSeen = Date.now();
    this.state = 'open';
    this.stats.connects += 1;
    if (!conn.sse) this.failedOpens = 0;
    for (const sub of this.subs.values()) this.sendSub(conn, sub);
    for (const p of this.outbox.values()) this.send(conn, p.frame);
    this.queries.resend(conn, (c, t) => this.send(c, t));
    this.emit('connected', { url: conn.url, transport: conn.sse ? 'sse' : 'websocket' });
    // A page cannot see SSE comments either, but EventSource reports a dead stream itself.
    if (!conn.sse) this.beat(conn);
  }

  /** The connection ended with `code` (1006: no close frame). */
  ended(conn, code, reason) {
    if (this.conn !== conn) return;
    this.clearTimers(conn);
    this.conn = null;
    const up = conn.openedAt == null ? null : Date.now() - conn.openedAt;
    if (up == null && !conn.sse && this.transport === 'auto' && ++this.failedOpens >= 2) this.fallBack();
    if (classifyClose(code) === 'stop') {
      const why = `the server closed the connection with ${code}${reason ? `: ${reason}` : ''}`;
      this.emit('disconnected', { code, reason, willRetry: false, retryInMs: null, url: conn.url });
      this.finish(new TetherError('closed', why, { closeCode: code, reason }));
      return;
    }
    this.retry(conn, conn.url, up, code, reason);
  }

  /**
   * WebSockets failed to open twice in a row ('auto'): stream over Server-Sent Events from now
   * on. What needs a WebSocket (publishes, presence queries) is refused from then on.
   */
  fallBack() {
    this.useSse = true;
    const err = overSse('publish');
    for (const p of this.outbox.values()) p.reject(err);
    this.outbox.clear();
    this.queries.failAll(overSse('presence'));
  }

  /** Waits the backoff (the close reason's `retry_after_ms` as its floor), then reconnects. */
  retry(conn, url, up, code, reason) {
    if (this.terminal) return;
    const floor = retryHint(reason);
    const delay = this.rotation.ended(up, floor);
    this.floorUntil = Date.now() + floor;
    this.state = 'waiting';
    this.timer = setTimeout(() => this.connect(), delay);
    this.emit('disconnected', { code, reason, willRetry: true, retryInMs: Math.round(delay), url });
  }

  /**
   * A subscription holds more than `maxBacklog` messages not yet processed. A page cannot stop
   * reading a WebSocket, so the client closes it (4000) instead of letting memory grow, works
   * the backlog off, and then connects again, resuming from the committed seq.
   */
  backlogged() {
    if (this.state !== 'open') return;
    const conn = this.conn;
    this.clearTimers(conn);
    this.abandon(conn, 4000, 'client backlog');
    this.conn = null;
    this.state = 'backlogged';
    const reason = `a subscription has more than ${this.maxBacklog} messages to process: reading resumes once they are done`;
    this.emit('disconnected', { code: 4000, reason, willRetry: true, retryInMs: null, url: conn.url });
  }

  /** After each delivered item: reconnects once a backlog is worked off. */
  drained() {
    if (this.state === 'backlogged' && [...this.subs.values()].every((s) => s.queue.length === 0)) this.connect();
  }

  /** Gives up on a socket that cannot be trusted (silent, or never opened) and reconnects. */
  lost(conn, reason) {
    this.abandon(conn);
    this.ended(conn, 1006, reason);
  }

  abandon(conn, code, reason) {
    const ws = conn.ws;
    ws.onopen = ws.onmessage = ws.onclose = null;
    ws.onerror = () => {};
    try {
      ws.close(code, reason);
    } catch {
      // already closing
    }
  }

  /** Stops for good: fails the outbox with `err`, reports it, lets go of the page. */
  finish(err) {
    this.terminal = err;
    this.state = 'stopped';
    clearTimeout(this.timer);
    if (this.conn) {
      this.clearTimers(this.conn);
      this.abandon(this.conn, 1000, err.kind === 'shutdown' ? 'client shutdown' : err.kind);
      this.conn = null;
    }
    this.unwatchPage?.();
    for (const p of this.outbox.values()) p.reject(err);
    this.outbox.clear();
    this.queries.failAll(err);
    if (err.kind !== 'shutdown') this.report(err);
  }

  send(conn, text) {
    try {
      conn.ws.send(text);
    } catch {
      // The socket is ending; its close event tells why, and the reconnect resends.
    }
  }

  sendSub(conn, sub) {
    conn.sent.add(sub.ch);
    this.send(conn, subFrame(sub.ch, sub.position, sub.joinLeave));
    asked(conn, sub.ch, 'sub');
  }

  later(conn, ms, fn) {
    const t = setTimeout(() => {
      conn.timers.delete(t);
      fn();
    }, ms);
    conn.timers.add(t);
  }

  clearTimers(conn) {
    clearTimeout(conn.hb);
    for (const t of conn.timers) clearTimeout(t);
    conn.timers.clear();
  }

  // ---- heartbeat: a browser cannot see WebSocket pings, so silence is probed ----

  /**
   * After `heartbeat.idleMs` without a frame, sends a probe (an `unsub` of a channel not held,
   * answered by `error` `not_subscribed`); no frame within `heartbeat.timeoutMs` after it means
   * the socket is dead: it is dropped and the client reconnects (as after a 1006).
   */
  beat(conn) {
    clearTimeout(conn.hb);
    if (!this.heartbeat || this.conn !== conn || this.state !== 'open') return;
    const { idleMs, timeoutMs } = this.heartbeat;
    const now = Date.now();
    let wait;
    if (conn.probeAt != null && conn.lastSeen < conn.probeAt) {
      if (now >= conn.probeAt + timeoutMs) {
        this.lost(conn, `no frame from the server for ${now - conn.lastSeen} ms (heartbeat probe unanswered)`);
        return;
      }
      wait = conn.probeAt + timeoutMs - now;
    } else if (now - conn.lastSeen >= idleMs) {
      this.probe(conn);
      wait = timeoutMs;
    } else {
      conn.probeAt = null;
      wait = idleMs - (now - conn.lastSeen);
    }
    conn.hb = setTimeout(() => this.beat(conn), wait);
  }

  probe(conn) {
    let ch = PROBE_CHANNEL;
    while (this.subs.has(ch)) ch += '_';
    conn.probeAt = Date.now();
    this.send(conn, JSON.stringify({ op: 'unsub', ch }));
    asked(conn, ch, 'unsub');
  }

  // ---- inbound frames ----

  frame(conn, data) {
    if (this.conn !== conn) return;
    conn.lastSeen = Date.now();
    let f;
    try {
      if (typeof data !== 'string') throw new Error('a binary frame (protocol v1 uses text frames)');
      f = JSON.parse(data);
      if (typeof f !== 'object' || f === null || typeof f.op !== 'string') throw new Error('not a JSON object with an op');
      this.dispatch(conn, f);
    } catch (e) {
      this.finish(new TetherError('protocol', `server frame is not protocol v1: ${e.message}`, { cause: e }));
    }
  }

  dispatch(conn, f) {
    const sub = typeof f.ch === 'string' ? this.subs.get(f.ch) : undefined;
    switch (f.op) {
      case 'msg':
        need(f, 'seq', 'number');
        if (sub && conn.sent.has(f.ch)) sub.push({ op: 'msg', seq: f.seq, epoch: conn.epochs.get(f.ch), data: f.data });
        break;
      case 'subscribed':
      case 'reset': {
        need(f, 'seq', 'number');
        f.epoch = String(need(f, 'epoch'));
        conn.epochs.set(f.ch, f.epoch);
        // The answer to a `sub` (a `reset` may also come on a live subscription, with Redis).
        const answer = answered(conn, f.ch, (x) => x === 'sub') !== undefined;
        if (!sub) break;
        if (f.op === 'subscribed') sub.subscribed(f);
        else sub.push({ op: 'reset', seq: f.seq, epoch: f.epoch, reason: f.reason, oldest: f.oldest });
        if (answer) sub.confirmed();
        break;
      }
      // Presence events are handed over as they arrive (not queued behind messages, not
      // awaited): a handler that awaits presence() then sees the answer before any later diff.
      case 'presence_diff':
        if (!Array.isArray(f.joins) || !Array.isArray(f.leaves)) throw new Error('`presence_diff` frame without `joins` and `leaves` arrays');
        if (sub && conn.sent.has(f.ch)) sub.call('onPresenceDiff', { ch: f.ch, joins: f.joins, leaves: f.leaves });
        break;
      case 'presence_reset':
        if (sub && conn.sent.has(f.ch)) sub.call('onPresenceReset', { ch: f.ch, reconnected: false });
        break;
      case 'presence':
      case 'presence_stats':
        need(f, 'ch', 'string');
        this.queries.answer(conn, f, (c, t) => this.send(c, t));
        break;
      case 'ack': {
        need(f, 'seq', 'number');
        const p = this.outbox.get(need(f, 'id', 'string'));
        // A resend after a reconnect can be acked twice; only the first counts.
        if (p) {
          this.outbox.delete(f.id);
          p.resolve({ id: f.id, ch: f.ch, seq: f.seq });
        }
        break;
      }
      case 'unsubscribed':
        // With reason 'server', a backend ended it (POST /api/unsubscribe, docs/api.md): not
        // subscribed again. Otherwise the answer to an unsub (the subscription was dropped
        // when it was sent), matched to its request.
        if (sub && f.reason === 'server') {
          this.subs.delete(sub.ch);
          conn.sent.delete(sub.ch);
          sub.active = false;
          sub.call('onUnsubscribed', { ch: sub.ch, reason: 'server' });
        } else if (typeof f.ch === 'string') {
          answered(conn, f.ch, (x) => x === 'unsub');
        }
        break;
      case 'refreshed':
        if (this.refreshing) this.heldToken = this.refreshing;
        this.refreshing = null;
        break;
      case 'error':
        this.refused(conn, f, sub);
        break;
      default: // unknown ops are ignored so a newer server can add frames
    }
  }

  refused(conn, f, sub) {
    if (this.queries.refused(conn, f)) return; // a presence query's answer
    const code = String(f.code ?? '');
    const reason = String(f.reason ?? '');
    const p = typeof f.id === 'string' ? this.outbox.get(f.id) : undefined;
    if (code === 'not_subscribed') return; // the heartbeat probe's answer
    if (code === 'token_expired') {
      this.refresh(conn);
      return;
    }
    if ((code === 'unavailable' || code === 'unknown_outcome') && (p || sub)) {
      // The broker cannot reach Redis (unavailable: not stored), or got no answer in time
      // (unknown_outcome: perhaps stored): the same request (same id) is safe to repeat.
      const wait = Number.isSafeInteger(f.retry_after_ms) ? f.retry_after_ms : 1000;
      if (sub) conn.sent.delete(sub.ch);
      this.later(conn, wait, () => (p ? this.outbox.has(p.id) && this.send(conn, p.frame) : this.subs.get(sub.ch) === sub && this.sendSub(conn, sub)));
      return;
    }
    const details = { code, reason, ch: f.ch, id: f.id };
    if (Number.isSafeInteger(f.retry_after_ms)) details.retryAfterMs = f.retry_after_ms;
    const err = new TetherError('refused', `${code}: ${reason}`, details);
    if (p) {
      this.outbox.delete(p.id);
      p.reject(err);
      return;
    }
    if (sub && (code === 'forbidden' || code === 'presence_off')) {
      // The token does not (or no longer) allow it, or the channel's rule has no join_leave:
      // do not resubscribe.
      this.subs.delete(sub.ch);
      sub.active = false;
    }
    sub?.call('onError', err);
    this.report(err);
  }

  /** The server says the token expired: send `refresh` with a newer one from the function. */
  async refresh(conn) {
    if (typeof this.token !== 'function') return; // a fixed token: the 4001 close and a reconnect follow
    try {
      const t = await this.token();
      if (typeof t === 'string' && t !== '' && t !== this.heldToken && this.conn === conn) {
        this.refreshing = t;
        this.send(conn, JSON.stringify({ op: 'refresh', token: t }));
      }
    } catch (e) {
      this.report(new TetherError('refused', `token function failed on token_expired: ${e?.message ?? e}`, { code: 'token_expired', cause: e }));
    }
  }

  // ---- subscriptions and storage ----

  unsubscribed(sub) {
    if (this.subs.get(sub.ch) !== sub) return;
    this.subs.delete(sub.ch);
    if (this.state === 'open' && this.conn.sent.delete(sub.ch)) {
      this.send(this.conn, JSON.stringify({ op: 'unsub', ch: sub.ch }));
      asked(this.conn, sub.ch, 'unsub');
    }
  }

  /** A subscription's position changed: keep it in `storage`. */
  saved(sub) {
    this.stored[sub.ch] = sub.position;
    if (!this.storage) return;
    try {
      this.storage.setItem(this.storageKey, JSON.stringify(this.stored));
    } catch (e) {
      this.report(new TetherError('refused', `storage.setItem(${this.storageKey}) failed: ${e?.message ?? e}`, { cause: e }));
    }
  }

  load() {
    if (!this.storage) return {};
    try {
      const all = JSON.parse(this.storage.getItem(this.storageKey) ?? '{}');
      const ok = {};
      for (const [ch, p] of Object.entries(all ?? {})) {
        if (p && Number.isSafeInteger(p.seq) && p.seq >= 0) ok[ch] = { seq: p.seq, epoch: typeof p.epoch === 'string' ? p.epoch : undefined };
      }
      return ok;
    } catch {
      return {}; // unreadable positions: start live, as without storage
    }
  }

  // ---- events and the page lifecycle ----

  emit(event, arg) {
    for (const fn of this.listeners.get(event) ?? []) {
      try {
        fn(arg);
      } catch (e) {
        if (event !== 'error') this.report(new TetherError('handler', `a '${event}' listener threw: ${e?.message ?? e}`, { cause: e }));
      }
    }
  }

  report(err) {
    this.emit('error', err);
  }

  /**
   * In a page: coming back to the tab (`visibilitychange` to visible) or `online` reconnects at
   * once when the client is waiting out a backoff (never before a server's retry_after_ms
   * floor), and probes an open socket so a dead one is found within heartbeat.timeoutMs.
   */
  watchPage(on) {
    const w = globalThis;
    if (!on || typeof w.addEventListener !== 'function' || !w.document) return;
    const wake = () => {
      if (w.document.visibilityState === 'hidden') return;
      if (this.state === 'waiting') {
        clearTimeout(this.timer);
        this.timer = setTimeout(() => this.connect(), Math.max(0, this.floorUntil - Date.now()));
      } else if (this.state === 'open' && this.heartbeat && this.conn.probeAt == null) {
        // Probing now means a socket that died while the page slept is found within timeoutMs.
        this.conn.lastSeen = 0;
        this.beat(this.conn);
      }
    };
    w.addEventListener('online', wake);
    w.document.addEventListener('visibilitychange', wake);
    this.unwatchPage = () => {
      w.removeEventListener('online', wake);
      w.document.removeEventListener('visibilitychange', wake);
    };
  }
}

/** The refusal of `what` on a client that streams over Server-Sent Events (receive only). */
function overSse(what) {
  return new TetherError('refused', `${what}: this client streams over Server-Sent Events, which carry nothing to the server (use a WebSocket)`, { code: 'transport' });
}

/** `f[name]`, or a protocol error naming the `op` and the field missing or of another type. */
function need(f, name, type) {
  const v = f[name];
  if (v == null || (type && typeof v !== type) || (name === 'seq' && !Number.isSafeInteger(v))) {
    throw new Error(`\`${f.op}\` frame without a valid \`${name}\``);
  }
  return v;
}
