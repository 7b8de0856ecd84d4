// Wire protocol v1 as the client sees it (docs/protocol.md), URL checks, and the error type.

/**
 * The error a Tether rejects or reports with. `kind` tells the caller what to do:
 * - 'closed': the server closed with a stop code (`closeCode`: 1002, 1003, 1007, 1008, 1009,
 *   1010, 4003, 1000 or unknown); the client stopped, do not retry blindly;
 * - 'refused': the server answered a request with `error` (`code`, e.g. 'forbidden', 'limit');
 * - 'protocol': the server sent something that is not protocol v1; the client stopped;
 * - 'shutdown': the application called close();
 * - 'handler': an onMessage/onReset handler threw (the message was not committed).
 */
export class TetherError extends Error {
  /**
   * @param {'closed'|'refused'|'protocol'|'shutdown'|'handler'} kind
   * @param {string} message
   * @param {{closeCode?: number, code?: string, reason?: string, ch?: string, id?: string, cause?: unknown}} [details]
   */
  constructor(kind, message, details = {}) {
    super(message);
    this.name = 'TetherError';
    this.kind = kind;
    Object.assign(this, details);
  }
}

const CHANNEL = /^[A-Za-z0-9._:-]{1,128}$/;

/** Whether `ch` is a valid channel name: 1–128 bytes of [A-Za-z0-9._:-]. */
export function validChannel(ch) {
  return typeof ch === 'string' && CHANNEL.test(ch);
}

/** Throws a TypeError naming `field` unless `ch` is a valid channel name. */
export function checkChannel(ch, field) {
  if (!validChannel(ch)) {
    throw new TypeError(`${field}: ${JSON.stringify(ch)} is not a channel name (1-128 bytes of [A-Za-z0-9._:-])`);
  }
}

/**
 * A fresh publish id: 128 random bits as 32 lowercase hex digits, random rather than a counter
 * so ids stay unique across page reloads within the server's dedup window.
 */
export function newId() {
  const b = new Uint8Array(16);
  globalThis.crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

/**
 * Checks and normalizes the URL argument: one URL, a comma-separated list, or an array; each
 * `ws://` or `wss://` (a path starting with `/` is resolved against the page's location).
 * @param {string | string[]} arg
 * @returns {string[]}
 */
export function checkUrls(arg) {
  const list = Array.isArray(arg) ? arg : typeof arg === 'string' ? arg.split(',') : null;
  if (!list || list.length === 0) {
    throw new TypeError('urls: expected "ws://HOST:PORT/ws", a comma-separated list, or an array of them');
  }
  return list.map((raw, i) => {
    const at = list.length > 1 ? `urls entry ${i + 1} of ${list.length}` : 'urls';
    const u = typeof raw === 'string' ? raw.trim() : '';
    let url;
    try {
      const base = globalThis.location?.href?.replace(/^http/, 'ws');
      url = new URL(u, u.startsWith('/') ? base : undefined);
    } catch {
      throw new TypeError(`${at}: ${JSON.stringify(raw)} is not a URL (expected ws://HOST:PORT/ws)`);
    }
    if (url.protocol !== 'ws:' && url.protocol !== 'wss:') {
      throw new TypeError(`${at}: ${JSON.stringify(raw)}: expected a ws:// or wss:// URL`);
    }
    return url.href;
  });
}

/**
 * `url` with `token=<token, percent-encoded>` as its only `token` query parameter: one already
 * in the URL is dropped, since the server refuses a repeated one with 400 (docs/security.md).
 */
export function urlWithToken(url, token) {
  const [base, fragment] = url.split('#', 2);
  const [path, query = ''] = base.split(/\?(.*)/s, 2);
  const isToken = (pair) => {
    try {
      return decodeURIComponent(pair.split('=', 1)[0].replace(/\+/g, ' ')) === 'token';
    } catch {
      return false;
    }
  };
  const kept = query.split('&').filter((p) => p !== '' && !isToken(p));
  kept.push(`token=${encodeURIComponent(token)}`);
  const t = `${path}?${kept.join('&')}`;
  return fragment == null ? t : `${t}#${fragment}`;
}

/** `{"op":"sub",…}` with `from`/`epoch` when known, and `"join_leave":true` when asked. */
export function subFrame(ch, pos, joinLeave = false) {
  const f = { op: 'sub', ch };
  if (pos) {
    f.from = pos.seq;
    if (pos.epoch != null) f.epoch = pos.epoch;
  }
  if (joinLeave) f.join_leave = true;
  return JSON.stringify(f);
}

/**
 * The channel the heartbeat probe unsubscribes from. tether answers an `unsub` of a channel the
 * connection does not hold with `error` `not_subscribed`, creating nothing: the cheapest
 * request with an answer a page can see (a browser cannot see WebSocket pings).
 */
export const PROBE_CHANNEL = 'tether.heartbeat-probe';
