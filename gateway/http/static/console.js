// The figtank web console: polls /api/overview each second, draws the rates, tails a topic
// through the SSE endpoint, pages through a partition (the fetch endpoint) and produces
// (POST /topics/{topic}). Every call carries the token pasted in the page. Plain browser
// JavaScript: no build step, no library.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const tokenInput = $("token");
  tokenInput.value = localStorage.getItem("figtank-token") || "";
  tokenInput.addEventListener("change", () => {
    localStorage.setItem("figtank-token", tokenInput.value);
    if (tail) follow(tail.topic);
  });
  const headers = () => tokenInput.value ? {Authorization: "Bearer " + tokenInput.value} : {};
  const history = [];          // {t, published, delivered}: one sample a second
  const WINDOW = 300;          // seconds shown
  const lastIn = new Map();    // topic -> [time, messages_in]
  let tail = null;

  // A same-origin call with the token; its JSON, or an Error saying what the server said
  // (status, error code and message) or that it could not be reached.
  async function call(url, options = {}) {
    let answer;
    try {
      answer = await fetch(url, {...options, headers: {...headers(), ...options.headers}});
    } catch (error) {
      throw new Error("unreachable: " + error.message);
    }
    let body = null;
    try { body = await answer.json(); } catch (_) { /* not JSON: the status says it */ }
    if (!answer.ok) {
      const what = body && body.message ? `${body.error}: ${body.message}` : answer.statusText;
      throw new Error(`${answer.status} ${what}`);
    }
    return body;
  }

  function cell(row, text, numeric) {
    const td = row.insertCell();
    td.textContent = text;
    if (numeric) td.className = "num";
    return td;
  }

  function fill(tableId, rows) {
    const body = $(tableId).tBodies[0];
    body.replaceChildren();
    for (const values of rows) {
      const row = body.insertRow();
      for (const v of values) {
        if (v instanceof Node) row.insertCell().appendChild(v);
        else cell(row, String(v), typeof v === "number");
      }
    }
  }

  function button(text, onclick, data) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.onclick = onclick;
    Object.assign(b.dataset, data);
    return b;
  }

  function render(data, now) {
    const rows = [];
    const names = [];
    for (const topic of data.topics) {
      names.push(topic.name);
      const before = lastIn.get(topic.name);
      lastIn.set(topic.name, [now, topic.messages_in]);
      const rate = before && now > before[0] ?
        ((topic.messages_in - before[1]) / ((now - before[0]) / 1000)).toFixed(1) : "–";
      topic.partitions.forEach((p, i) => {
        const actions = document.createElement("span");
        if (i === 0) actions.append(button("tail", () => follow(topic.name), {topic: topic.name}), " ");
        actions.append(button("browse", () => browseFrom(topic.name, p.partition, p.first_offset),
                              {browse: `${topic.name}/${p.partition}`}));
        rows.push([i === 0 ? topic.name : "", p.partition, p.first_offset, p.last_offset,
                   i === 0 ? rate : "", actions]);
      });
    }
    fill("topics", rows);
    $("topic-names").replaceChildren(...names.map((n) => new Option(n)));
    $("more-topics").textContent = data.more_topics ? `and ${data.more_topics} more topics` : "";
    const connections = Object.entries(data.connections).map(([p, n]) => [p, n]);
    for (const [kind, n] of Object.entries(data.streams)) connections.push([`http ${kind}`, n]);
    fill("connections", connections);
    fill("groups", data.groups.map((g) => [g.group, g.topic, g.partition, g.lag]));
  }

  function drawRates() {
    const canvas = $("rates");
    const ctx = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height, pad = 36;
    ctx.clearRect(0, 0, w, h);
    const rates = [];
    for (let i = 1; i < history.length; i++) {
      const a = history[i - 1], b = history[i], dt = (b.t - a.t) / 1000 || 1;
      rates.push({t: b.t, publish: Math.max(0, (b.published - a.published) / dt),
                  deliver: Math.max(0, (b.delivered - a.delivered) / dt)});
    }
    const peak = Math.max(0, ...rates.map((r) => Math.max(r.publish, r.deliver)));
    const step = 10 ** Math.floor(Math.log10(Math.max(peak, 1)));
    const top = Math.max(4, Math.ceil(peak * 1.1 / step) * step);  // a round number over it
    ctx.strokeStyle = "#e3e6eb"; ctx.fillStyle = "#7a8190"; ctx.font = "11px sans-serif";
    for (let k = 0; k <= 4; k++) {
      const y = pad / 2 + (h - pad) * k / 4;
      ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w, y); ctx.stroke();
      const label = top * (4 - k) / 4;
      ctx.fillText(label >= 1000 ? (label / 1000).toFixed(1) + "k" : String(+label.toFixed(1)),
                   2, y + 4);
    }
    const now = Date.now();
    // The last WINDOW seconds, or as far back as the page has samples.
    const span = Math.max(10000, Math.min(WINDOW * 1000, now - (history[0] || {t: now}).t));
    const x = (t) => pad + (w - pad) * (1 - (now - t) / span);
    const y = (v) => pad / 2 + (h - pad) * (1 - v / top);
    for (const [key, colour] of [["publish", "#2f6fdf"], ["deliver", "#e0861a"]]) {
      ctx.strokeStyle = colour; ctx.lineWidth = 2; ctx.beginPath();
      rates.forEach((r, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(r.t), y(r[key])));
      ctx.stroke();
    }
    const last = rates[rates.length - 1];
    $("rate-now").textContent = last ?
      `now: ${last.publish.toFixed(1)} published/s, ${last.deliver.toFixed(1)} delivered/s` : "";
  }

  async function poll() {
    try {
      const data = await call("/api/overview");
      const now = Date.now();
      history.push({t: now, published: data.published, delivered: data.delivered});
      while (history.length && history[0].t < now - WINDOW * 1000) history.shift();
      render(data, now);
      drawRates();
      $("status").textContent = "live";
    } catch (error) {
      $("status").textContent = error.message;
    }
  }

  function follow(topic) {
    if (tail) tail.source.close();
    const list = $("tail");
    list.replaceChildren();
    $("tail-topic").textContent = topic;
    const query = tokenInput.value ? "&access_token=" + enc(tokenInput.value) : "";
    const source = new EventSource(`/topics/${enc(topic)}/events?from=latest${query}`);
    source.onmessage = (event) => {
      const m = JSON.parse(event.data);
      const item = document.createElement("li");
      const value = m.value !== undefined ? m.value : `base64:${m.value_base64}`;
      const key = m.key !== undefined ? ` key=${m.key}` : "";
      item.textContent = `${m.partition}:${m.offset}${key} ${value}`;
      list.prepend(item);
      while (list.children.length > 200) list.lastChild.remove();
    };
    tail = {topic, source};
  }

  // ---- The message browser ----
  const SHOWN = 4096;            // payload bytes shown per message
  let page = null;               // {topic, partition, start, next, first, last, messages}

  const bytesOf = (m) => m.value !== undefined ? new TextEncoder().encode(m.value)
    : Uint8Array.from(atob(m.value_base64 || ""), (c) => c.charCodeAt(0));

  function hexDump(bytes) {
    const lines = [];
    for (let i = 0; i < Math.min(bytes.length, SHOWN); i += 16) {
      const row = bytes.subarray(i, i + 16);
      const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
      const text = Array.from(row, (b) => b >= 32 && b < 127 ? String.fromCharCode(b) : ".")
        .join("");
      lines.push(`${i.toString(16).padStart(4, "0")}  ${hex.padEnd(47)}  ${text}`);
    }
    if (bytes.length > SHOWN) lines.push(`… ${bytes.length} bytes in all`);
    return lines.join("\n") || "(empty)";
  }

  function payload(m, view) {
    if (view === "hex") return hexDump(bytesOf(m));
    if (m.value === undefined) return `(not UTF-8 text: ${bytesOf(m).length} bytes; see hex)`;
    const text = m.value.length > SHOWN ? m.value.slice(0, SHOWN) + " …" : m.value;
    if (view !== "json") return text === "" ? "(empty)" : text;
    try {
      return JSON.stringify(JSON.parse(m.value), null, 2);
    } catch (error) {
      return `(not JSON: ${error.message})\n${text}`;
    }
  }

  function showPage() {
    const view = document.querySelector('input[name="view"]:checked').value;
    const rows = (page ? page.messages : []).map((m) => {
      const key = m.key !== undefined ? m.key : m.key_base64 !== undefined ?
        `base64:${m.key_base64}` : "—";
      const pre = document.createElement("pre");
      pre.textContent = payload(m, view);
      pre.className = view;
      const when = m.timestamp >= 0 ? new Date(m.timestamp).toISOString() : "—";
      return [m.offset, when, key, m.headers ? JSON.stringify(m.headers) : "none", pre];
    });
    fill("messages", rows);
  }

  function isoTime(text) {
    text = text.trim();
    if (/T.*(Z|[+-]\d\d(:?\d\d)?)$/i.test(text)) return text;  // it has its zone
    // No zone (a datetime-local value, or a date): local time.
    const when = new Date(/T/.test(text) ? text : text + "T00:00");
    return isNaN(when) ? text : when.toISOString();  // unparsable: the server says why
  }

  async function browse(where) {
    const topic = $("b-topic").value.trim(), partition = $("b-partition").value;
    const size = Math.max(1, Math.min(1000, parseInt($("b-size").value, 10) || 10));
    const query = new URLSearchParams({max_count: size, ...where});
    const path = `/topics/${enc(topic)}`;
    $("b-error").textContent = "";
    try {
      // One after the other: a refusal shown is the fetch's own.
      const data = await call(`${path}/partitions/${enc(partition)}/messages?${query}`);
      const described = await call(path);
      const info = described.partitions[data.partition];
      const start = data.messages.length ? data.messages[0].offset : data.next_offset;
      page = {topic, partition: data.partition, start, next: data.next_offset,
              first: Math.max(info.first_offset, 1), last: data.last_offset,
              messages: data.messages};
      $("b-offset").value = start;
      $("b-time").value = "";
      $("b-range").textContent = data.messages.length ?
        `offsets ${start}-${data.next_offset - 1} of ${page.first}-${page.last}` :
        `no messages from offset ${start} (last offset ${page.last})`;
    } catch (error) {
      page = null;
      $("b-error").textContent = error.message;
      $("b-range").textContent = "";
    }
    $("b-back").disabled = !page || page.start <= page.first;
    $("b-forward").disabled = !page || page.next > page.last;
    showPage();
  }

  function browseFrom(topic, partition, offset) {
    $("b-topic").value = topic;
    $("b-partition").value = partition;
    $("b-time").value = "";
    return browse({offset: offset || 1});
  }

  $("browse").addEventListener("submit", (event) => {
    event.preventDefault();
    const time = $("b-time").value.trim();
    browse(time ? {time: isoTime(time)} : {offset: $("b-offset").value || 1});
  });
  $("b-pick").addEventListener("change", () => { $("b-time").value = $("b-pick").value; });
  $("b-forward").onclick = () => browse({offset: page.next});
  $("b-back").onclick = () => {
    const size = Math.max(1, parseInt($("b-size").value, 10) || 10);
    browse({offset: Math.max(page.start - size, page.first)});
  };
  $("b-view").addEventListener("change", showPage);

  // ---- The produce form ----
  $("produce").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = $("p-result");
    const topic = $("p-topic").value.trim(), partition = $("p-partition").value.trim();
    const key = $("p-key").value;
    // The key as base64 of its UTF-8 bytes: any text fits a header that way.
    const extra = key ? {"Figtank-Key-Base64":
      btoa(String.fromCharCode(...new TextEncoder().encode(key)))} : {};
    out.className = "";
    out.textContent = "producing…";
    try {
      const data = await call(`/topics/${enc(topic)}${partition ? "?partition=" + enc(partition) : ""}`,
                              {method: "POST", body: $("p-value").value, headers: extra});
      const [at] = data.offsets;
      out.textContent = `appended to ${data.topic} partition ${at.partition} at offset ` +
        (at.offset === null ? "(not told by the upstream)" : at.offset);
    } catch (error) {
      out.className = "error";
      out.textContent = error.message;
    }
  });

  // For people at the browser's console (and the browser tests).
  window.figtankConsole = {follow, browseFrom, page: () => page,
                           tailState: () => tail ? tail.source.readyState : -1};
  poll();
  setInterval(poll, 1000);
})();
