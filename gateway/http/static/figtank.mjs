// figtank.js: a WebSocket client for figtank's HTTP listener. No build step, no
// dependencies. This file is the one source: the server serves it as the ES module
// /figtank.mjs and derives the classic script /figtank.js (window.Figtank) from it
// (gateway/http/clientjs.py); its types are /figtank.d.ts.
//
// It reconnects with backoff and resumes every subscription after the last offset it
// delivered, so a handler sees each message once and in order per partition, across
// server restarts and outages. A refusal stops it instead (onstate "revoked", "refused",
// "unauthorized"); a token that expired is replaced through options.getToken.
// It keeps at most the server's publish window of publishes unacknowledged and queues
// the rest locally (at most options.maxQueued; beyond that publish() rejects).
//
//   const fig = new Figtank("ws://127.0.0.1:8080/ws", {token: "...", getToken});
//   fig.subscribe("orders", (m) => console.log(m.offset, m.value), {from: "earliest"});
//   const ack = await fig.publish("orders", "hello");   // {partition, offset}

export class Figtank {
  constructor(url, options = {}) {
    this.url = url;
    this.token = options.token || null;
    this.getToken = options.getToken || null;
    this.minDelay = options.minDelay || 250;
    this.maxDelay = options.maxDelay || 5000;
    this.maxQueued = options.maxQueued === undefined ? 10000 : options.maxQueued;
    this.onstate = options.onstate || (() => {});
    this.subs = new Map();      // "topic/partition" -> {topic, partition, last, from, handler}
    this.publishes = [];        // not acknowledged, in order: {id, message, resolve, reject, sent, ...}
    this.inFlight = 0;          // of them sent on this socket (at most this.window)
    this.nextId = 1;
    this.attempt = 0;
    this.window = 0;            // the server's publish_window, once its hello came
    this.closed = false;
    this.ws = null;
    this._connect();
  }

  subscribe(topic, handler, options = {}) {
    const partition = options.partition || 0;
    const sub = {topic, partition, handler, last: null,
                 from: options.from || "latest", offset: options.offset};
    this.subs.set(topic + "/" + partition, sub);
    this._attach(sub);
    return () => this.unsubscribe(topic, partition);
  }

  unsubscribe(topic, partition = 0) {
    this.subs.delete(topic + "/" + partition);
    this._send({op: "detach", topic, partition});
  }

  publish(topic, value, options = {}) {
    if (this.closed) return Promise.reject(new Error("figtank: closed"));
    if (this.publishes.length - this.inFlight >= this.maxQueued) {
      return Promise.reject(new Error(
        "figtank: " + this.maxQueued + " publishes already queued (maxQueued)"));
    }
    const id = this.nextId++;
    const message = {op: "publish", topic, id, value};
    if (options.partition !== undefined) message.partition = options.partition;
    if (options.key !== undefined) message.key = options.key;
    return new Promise((resolve, reject) => {
      this.publishes.push({id, message, resolve, reject, sent: false, notBefore: 0});
      this._pump();
    });
  }

  close() {
    this._stop("closed", 1000, "closed by the page");
  }

  _connect() {
    if (this.closed) return;
    const ws = this.ws = new WebSocket(this._withToken(this.url));
    let opened = false;
    this.window = 0;
    this.inFlight = 0;
    for (const p of this.publishes) { p.sent = false; p.notBefore = 0; }  // sent again
    ws.onopen = () => {
      opened = true;
      this.onstate("open");
      for (const sub of this.subs.values()) this._attach(sub);
    };
    ws.onmessage = (event) => this._receive(JSON.parse(event.data));
    ws.onclose = (event) => {
      if (this.ws !== ws || this.closed) return;
      this.ws = null;
      if (event.code === 4003) this._stop("revoked", event.code, event.reason);
      else if (event.code === 1008) this._stop("refused", event.code, event.reason);
      else if (event.code === 4001) this._refresh(event.code, event.reason);
      else if (!opened) this._probe();
      else this._retry(event.code, event.reason);
    };
  }

  // A socket that failed before it opened tells nothing (a browser hides the answer to
  // the upgrade): ask the same URL without the upgrade. 403 is a refusal, 401 wants a
  // token, anything else (a 400 for the missing upgrade, 503, no answer) an outage.
  // From a page of another origin the Authorization header needs a preflight, which an
  // origin the server refuses does not pass: then it asks again without the header (the
  // origin is checked first, so the answer is the same 403).
  _probe(authorize = true) {
    const url = new URL(this.url, typeof location !== "undefined" ? location.href : undefined);
    url.protocol = url.protocol === "wss:" ? "https:" : "http:";
    url.searchParams.delete("access_token");
    const headers = authorize && this.token ? {Authorization: "Bearer " + this.token} : {};
    fetch(url.href, {headers, cache: "no-store"}).then(async (answer) => {
      let reason = "";
      try { reason = (await answer.json()).message || ""; } catch (e) { /* not JSON */ }
      if (answer.status === 403) this._stop("refused", 403, reason);
      else if (answer.status === 401) this._refresh(401, reason);
      else this._retry(1006, "WebSocket failed to open (probe: " + answer.status + ")");
    }, () => {
      if (authorize && this.token) this._probe(false);
      else this._retry(1006, "WebSocket failed to open");
    });
  }

  // The token expired (4001) or is not accepted (401): a fresh one from the page's hook.
  _refresh(code, reason) {
    if (this.closed) return;
    if (!this.getToken) {
      this._stop("unauthorized", code, reason);
      return;
    }
    this.onstate("expired", code, reason);
    Promise.resolve().then(() => this.getToken()).then((token) => {
      if (!token) throw new Error("getToken gave no token");
      this.token = token;
      // At once the first time; a token refused again backs off as an outage does.
      if (this.attempt === 0) { this.attempt = 1; this._connect(); }
      else this._retry(code, reason);
    }).catch((error) => this._stop("unauthorized", code, String(error)));
  }

  _retry(code, reason) {
    if (this.closed) return;
    this.onstate("closed", code, reason);
    setTimeout(() => this._connect(), this._backoff());
  }

  _backoff() {
    const delay = Math.min(this.maxDelay, this.minDelay * 2 ** this.attempt++);
    return delay * (0.5 + Math.random() / 2);
  }

  // Stop for good: the publishes not acknowledged are rejected.
  _stop(state, code, reason) {
    if (this.closed) return;
    this.closed = true;
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close(1000);
    for (const p of this.publishes) p.reject(new Error("figtank: " + state + ": " + reason));
    this.publishes = [];
    this.onstate(state, code, reason);
  }

  _withToken(url) {
    if (!this.token) return url;
    return url + (url.includes("?") ? "&" : "?") + "access_token=" +
      encodeURIComponent(this.token);
  }

  _attach(sub) {
    const message = {op: "attach", topic: sub.topic, partition: sub.partition};
    if (sub.last !== null) message.offset = sub.last;          // resume after it
    else if (sub.offset !== undefined) message.offset = sub.offset;
    else message.from = sub.from;
    this._send(message);
  }

  // Send the publishes not sent yet, in order, while the window has room.
  _pump() {
    if (!this.ws || this.ws.readyState !== 1) return;
    const now = Date.now();
    for (const p of this.publishes) {
      if (this.inFlight >= this.window) return;
      if (p.sent) continue;
      if (p.notBefore > now) return;   // failed in an outage: it goes first, after a while
      p.sent = true;
      this.inFlight++;
      this._send(p.message);
    }
  }

  _send(message) {
    if (this.ws && this.ws.readyState === 1) this.ws.send(JSON.stringify(message));
  }

  _receive(message) {
    const op = message.op;
    if (op === "data") {
      const sub = this.subs.get(message.topic + "/" + message.partition);
      if (!sub || (sub.last !== null && message.offset <= sub.last)) return;
      sub.last = message.offset;
      sub.handler(message);
    } else if (op === "ack") {
      const at = this.publishes.findIndex((p) => p.id === message.id && p.sent);
      if (at < 0) return;
      const [p] = this.publishes.splice(at, 1);
      this.inFlight--;
      p.resolve({partition: message.partition, offset: message.offset});
      this._pump();
    } else if (op === "hello") {
      this.window = message.publish_window;
      this.attempt = 0;   // the server is serving: the next outage starts from minDelay
      this._pump();
    } else if (op === "attached") {
      this._attached(message);
    } else if (op === "error") {
      this._failed(message);
    } else if (op === "unavailable" || op === "available") {
      this.onstate(op, undefined, message.topic + "/" + message.partition + " at offset " +
                   message.offset + (message.message ? ": " + message.message : ""));
    }
  }

  // The server starts a subscription after `offset`. Before where it stood (the topic
  // was re-created, the server's log is shorter): deliver the log as it is now, from
  // there, and say so, rather than drop its messages as seen already.
  _attached(message) {
    const sub = this.subs.get(message.topic + "/" + message.partition);
    if (!sub || sub.last === null || message.offset >= sub.last) return;
    const was = sub.last;
    sub.last = message.offset;
    this.onstate("rewound", undefined, message.topic + "/" + message.partition +
                 " starts after offset " + message.offset + ", " + was + " was delivered");
  }

  // One operation failed in an outage; the socket goes on: try it again after a while.
  _failed(message) {
    const later = message.retry_after_ms || this.minDelay;
    if (message.request === "publish") {
      const p = this.publishes.find((q) => q.id === message.id && q.sent);
      if (!p) return;
      p.sent = false;
      p.notBefore = Date.now() + later;
      this.inFlight--;
      const ws = this.ws;
      setTimeout(() => { if (this.ws === ws) this._pump(); }, later);
    } else if (message.request === "attach") {
      const key = message.topic + "/" + message.partition;
      const sub = this.subs.get(key);
      const ws = this.ws;
      // Only if it is still the page's subscription then (not unsubscribed, not replaced
      // by a new subscribe, whose own attach is under way).
      if (sub) setTimeout(() => {
        if (this.ws === ws && this.subs.get(key) === sub) this._attach(sub);
      }, later);
    }
  }
}
