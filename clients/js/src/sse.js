// Server-Sent Events as the client's transport where WebSockets do not pass
// (docs/protocol.md, "Server-Sent Events"): an EventSource on GET /sse with every channel and
// its position in the URL, shown to the Tether class as a socket that delivers the same JSON
// objects a WebSocket does. Receive only: a new channel or an unsub means a new stream.

/**
 * The `/sse` URL of a `ws://…/ws` URL (its query, e.g. `token=`, kept): `ch=` for each
 * subscription and `from=<ch>:<epoch>:<seq>` for each one with a position (an empty epoch when
 * the position has none).
 * @param {string} wsUrl
 * @param {{ch: string, position: {seq: number, epoch?: string} | null}[]} subs
 */
export function sseUrl(wsUrl, subs) {
  const u = new URL(wsUrl);
  u.protocol = u.protocol === 'wss:' ? 'https:' : 'http:';
  u.pathname = u.pathname.endsWith('/ws') ? `${u.pathname.slice(0, -3)}/sse` : '/sse';
  for (const s of subs) u.searchParams.append('ch', s.ch);
  for (const s of subs) {
    if (s.position) u.searchParams.append('from', `${s.ch}:${s.position.epoch ?? ''}:${s.position.seq}`);
  }
  return u.href;
}

/**
 * An EventSource dressed as the part of a WebSocket the client uses: `onopen`, `onmessage`
 * ({data}: the event's JSON, as a frame's text), `onclose` ({code, reason}), `send`, `close`.
 *
 * EventSource reconnects by itself with its fixed URL, which holds stale positions for all but
 * the channel of `Last-Event-ID`; so this socket ends at the first sign of trouble (a
 * connection error, the server's `close` event) and the client reconnects with a new URL, its
 * own backoff and every channel's position.
 */
export class SseSocket {
  /**
   * @param {typeof EventSource} EventSourceClass
   * @param {string} wsUrl the client's URL (with `token=` when it uses one)
   * @param {() => {ch: string, position: object | null}[]} subs the subscriptions, read when
   *   the stream starts: after the current task, so the channels an application subscribes
   *   right after creating the client go in the first stream
   */
  constructor(EventSourceClass, wsUrl, subs) {
    this.channels = new Set();
    this.ended = false;
    this.es = null;
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    setTimeout(() => this.ended || this.start(EventSourceClass, wsUrl, subs()), 0);
  }

  start(EventSourceClass, wsUrl, subs) {
    this.channels = new Set(subs.map((s) => s.ch));
    if (subs.length === 0) {
      // GET /sse needs a channel: nothing to stream until one is subscribed (send() then ends
      // this socket, and the next one carries it).
      this.onopen?.();
      return;
    }
    const es = (this.es = new EventSourceClass(sseUrl(wsUrl, subs)));
    es.onopen = () => this.onopen?.();
    const deliver = (ev) => this.onmessage?.({ data: ev.data });
    for (const name of ['msg', 'subscribed', 'reset']) es.addEventListener(name, deliver);
    es.addEventListener('error', (ev) => {
      // The server's `event: error` (a refused request) is a MessageEvent with data; a plain
      // Event is a connection failure or the end of the stream.
      if (typeof ev.data === 'string') deliver(ev);
      else this.end(1006, '');
    });
    es.addEventListener('close', (ev) => {
      let f = {};
      try {
        f = JSON.parse(ev.data);
      } catch {
        // keep the defaults
      }
      this.end(Number.isInteger(f.code) ? f.code : 1006, typeof f.reason === 'string' ? f.reason : '');
    });
  }

  /**
   * A request the client would send on a WebSocket: a `sub` of a channel already in the URL is
   * answered by the stream itself; a new `sub` or an `unsub` ends this stream so the next one
   * carries the new channel list. Nothing else is sent over SSE (the client does not ask).
   */
  send(text) {
    let f;
    try {
      f = JSON.parse(text);
    } catch {
      return;
    }
    if (f.op === 'sub' && this.channels.has(f.ch)) return;
    if (f.op === 'sub' || f.op === 'unsub') this.end(1006, 'the SSE stream is reopened with the new channel list');
  }

  /** Closes the stream (no event follows, as after WebSocket.close from the client). */
  close() {
    this.ended = true;
    this.es?.close();
  }

  end(code, reason) {
    if (this.ended) return;
    this.ended = true;
    this.es?.close();
    queueMicrotask(() => this.onclose?.({ code, reason }));
  }
}
