// The console's live socket: one per page, reconnecting with capped, jittered backoff;
// the badge says "live", "stale" (no message for STALE_MS) or "reconnecting".
(function () {
  "use strict";
  const STALE_MS = 5000;
  const listeners = { history: [], snapshot: [], event: [], drill: [] };
  const badge = document.getElementById("live-status");
  let delay = 500;
  let last = 0;

  function status(text) {
    if (!badge) return;
    badge.textContent = text;
    badge.className = "live-status live-" + text;
    document.body.classList.toggle("stale", text !== "live");
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(scheme + location.host + "/ws/live");
    ws.onopen = function () { delay = 500; status(last ? "live" : "waiting"); };
    ws.onmessage = function (message) {
      const data = JSON.parse(message.data);
      last = Date.now();
      status("live");
      (listeners[data.kind] || []).forEach(function (fn) { fn(data); });
    };
    ws.onclose = function () {
      status("reconnecting");
      const wait = delay * (0.8 + Math.random() * 0.4);
      delay = Math.min(delay * 2, 15000);
      setTimeout(connect, wait);
    };
  }

  setInterval(function () {
    if (last && Date.now() - last > STALE_MS && badge && badge.textContent === "live") status("stale");
  }, 1000);

  window.meridian = {
    on: function (kind, fn) { listeners[kind].push(fn); },
    fmt: {
      pct: function (v) { return v == null ? "—" : (100 * v).toFixed(1) + " %"; },
      num: function (v, d) { return v == null ? "—" : Number(v).toFixed(d || 0); },
      ms: function (v) { return v == null ? "—" : (1000 * v).toFixed(0) + " ms"; },
      // A component that went quiet says since when, never a bare blank.
      since: function (ts) {
        return ts == null ? "no data yet" : "no data since " + new Date(ts * 1000).toLocaleTimeString([], { hour12: false });
      },
    },
  };
  connect();
})();
