// The figtank web console: polls /api/overview each second, draws the rates, and tails a
// topic through the SSE endpoint. Plain browser JavaScript: no build step, no library.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
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

  function render(data, now) {
    const rows = [];
    for (const topic of data.topics) {
      const before = lastIn.get(topic.name);
      lastIn.set(topic.name, [now, topic.messages_in]);
      const rate = before && now > before[0] ?
        ((topic.messages_in - before[1]) / ((now - before[0]) / 1000)).toFixed(1) : "–";
      topic.partitions.forEach((p, i) => {
        let action = "";
        if (i === 0) {
          action = document.createElement("button");
          action.textContent = "tail";
          action.dataset.topic = topic.name;
          action.onclick = () => follow(topic.name);
        }
        rows.push([i === 0 ? topic.name : "", p.partition, p.first_offset, p.last_offset,
                   i === 0 ? rate : "", action]);
      });
    }
    fill("topics", rows);
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
      const answer = await fetch("/api/overview", {headers: headers()});
      if (!answer.ok) throw new Error(`${answer.status} ${(await answer.json()).message}`);
      const data = await answer.json();
      const now = Date.now();
      history.push({t: now, published: data.published, delivered: data.delivered});
      while (history.length && history[0].t < now - WINDOW * 1000) history.shift();
      render(data, now);
      drawRates();
      $("status").textContent = "live";
    } catch (error) {
      $("status").textContent = "unreachable: " + error.message;
    }
  }

  function follow(topic) {
    if (tail) tail.source.close();
    const list = $("tail");
    list.replaceChildren();
    $("tail-topic").textContent = topic;
    const query = tokenInput.value ? "&access_token=" + encodeURIComponent(tokenInput.value) : "";
    const source = new EventSource(`/topics/${encodeURIComponent(topic)}/events?from=latest${query}`);
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

  // For people at the browser's console (and the browser tests).
  window.figtankConsole = {follow, tailState: () => tail ? tail.source.readyState : -1};
  poll();
  setInterval(poll, 1000);
})();
