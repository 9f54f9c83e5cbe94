// figtank.js: a WebSocket client for figtank's HTTP listener (served at /figtank.js).
// No build step, no dependencies. It reconnects with backoff and resumes every
// subscription after the last offset it delivered, so a handler sees each message once
// and in order per partition, across server restarts. Closed with 4003 (access revoked
// by the server's policy), it stops: onstate("revoked", 4003, reason), and the publishes
// not acknowledged are rejected.
//
//   const fig = new Figtank("ws://127.0.0.1:8080/ws", {token: "..."});
//   fig.subscribe("orders", (m) => console.log(m.offset, m.value), {from: "earliest"});
//   const ack = await fig.publish("orders", "hello");   // {partition, offset}
(function (root) {
  "use strict";

  class Figtank {
    constructor(url, options = {}) {
      this.url = url;
      this.token = options.token || null;
      this.minDelay = options.minDelay || 250;
      this.maxDelay = options.maxDelay || 5000;
      this.onstate = options.onstate || (() => {});
      this.subs = new Map();      // "topic/partition" -> {topic, partition, last, from, handler}
      this.pending = new Map();   // publish id -> {resolve, reject, message}
      this.nextId = 1;
      this.attempt = 0;
      this.window = 1000;
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
      const id = this.nextId++;
      const message = {op: "publish", topic, id, value};
      if (options.partition !== undefined) message.partition = options.partition;
      if (options.key !== undefined) message.key = options.key;
      return new Promise((resolve, reject) => {
        this.pending.set(id, {resolve, reject, message});
        this._send(message);
      });
    }

    close() {
      this.closed = true;
      if (this.ws) this.ws.close(1000);
    }

    _connect() {
      if (this.closed) return;
      const url = this.token ? this.url + (this.url.includes("?") ? "&" : "?") +
        "access_token=" + encodeURIComponent(this.token) : this.url;
      const ws = this.ws = new WebSocket(url);
      ws.onopen = () => {
        this.attempt = 0;
        this.onstate("open");
        for (const sub of this.subs.values()) this._attach(sub);
        for (const p of this.pending.values()) this._send(p.message);  // not acked: again
      };
      ws.onmessage = (event) => this._receive(JSON.parse(event.data));
      ws.onclose = (event) => {
        if (event.code === 4003) {
          // The server's access policy no longer lets this client in (a reload): coming
          // back would only be refused again.
          this.closed = true;
          for (const p of this.pending.values()) p.reject(new Error(event.reason));
          this.pending.clear();
          this.onstate("revoked", event.code, event.reason);
          return;
        }
        this.onstate("closed", event.code, event.reason);
        if (this.closed) return;
        const delay = Math.min(this.maxDelay, this.minDelay * 2 ** this.attempt++);
        setTimeout(() => this._connect(), delay * (0.5 + Math.random() / 2));
      };
    }

    _attach(sub) {
      const message = {op: "attach", topic: sub.topic, partition: sub.partition};
      if (sub.last !== null) message.offset = sub.last;          // resume after it
      else if (sub.offset !== undefined) message.offset = sub.offset;
      else message.from = sub.from;
      this._send(message);
    }

    _send(message) {
      if (this.ws && this.ws.readyState === 1) this.ws.send(JSON.stringify(message));
    }

    _receive(message) {
      if (message.op === "data") {
        const sub = this.subs.get(message.topic + "/" + message.partition);
        if (!sub || (sub.last !== null && message.offset <= sub.last)) return;
        sub.last = message.offset;
        sub.handler(message);
      } else if (message.op === "ack") {
        const p = this.pending.get(message.id);
        if (p) {
          this.pending.delete(message.id);
          p.resolve({partition: message.partition, offset: message.offset});
        }
      } else if (message.op === "hello") {
        this.window = message.publish_window;
      }
    }
  }

  root.Figtank = Figtank;
})(typeof window !== "undefined" ? window : globalThis);
