// Live updates for the overview, replicas, events and drills pages.
(function () {
  "use strict";
  const m = window.meridian;
  const f = m.fmt;

  function set(root, field, text) {
    const el = root.querySelector('[data-field="' + field + '"]');
    if (el && el.textContent !== text) el.textContent = text;
    return el;
  }

  function regionCard(r) {
    const card = document.querySelector('.card[data-region="' + r.name + '"]');
    if (!card) return;
    const kinds = Object.keys(r.by_kind).sort().map(function (k) {
      return k + " " + r.by_kind[k][0] + "/" + r.by_kind[k][1];
    }).join("  ");
    set(card, "ready", r.ready + "/" + r.total + "  " + kinds);
    // No record from the region's balancers lately: say since when, not "—".
    const quiet = r.rps == null;
    set(card, "rps", quiet ? f.since(r.last_ts) : f.num(r.rps, 2));
    set(card, "hit_rate", quiet ? f.since(r.last_ts) : (r.hit_rate == null ? "no prompts" : f.pct(r.hit_rate)));
    set(card, "inflight", r.inflight + (r.forwarded_inflight ? " (+" + r.forwarded_inflight + " forwarded)" : ""));
    set(card, "queue", r.queue + (r.queue ? " (oldest " + r.oldest_wait_s.toFixed(1) + " s)" : ""));
    set(card, "waiting", String(r.waiting));
    set(card, "processes", quiet ? "—" : r.processes + (r.degraded ? " (" + r.degraded + " on local view: Redis slow or down)" : ""));
    set(card, "ttft", f.ms(r.ttft_p50_s) + " / " + f.ms(r.ttft_p90_s));
    set(card, "flow", f.pct(r.local_share) + " · " + r.forwarded_in + " / " + r.forwarded_out);
    set(card, "cost", "$" + r.hourly_cost.toFixed(2) + "/h");
    r.balancers.forEach(function (b) {
      const el = card.querySelector('[data-balancer-state="' + b.name + '"]');
      if (el) {
        el.textContent = b.up ? "up" : "down";
        el.className = "state state-" + (b.up ? "up" : "down");
        el.title = b.up ? "" : f.since(b.last_ts);
      }
    });
  }

  function replicaRow(r) {
    document.querySelectorAll('tr[data-replica="' + r.name + '"]').forEach(function (row) {
      const state = set(row, "state", r.state);
      if (state) state.className = "state state-" + r.state;
      // A replica no balancer reports any more: its row says since when.
      row.title = r.reported_at != null && Date.now() / 1000 - r.reported_at > 5 ? f.since(r.reported_at) : "";
      set(row, "running", f.num(r.running));
      set(row, "waiting", f.num(r.waiting));
      set(row, "kv_usage", f.pct(r.kv_usage));
      set(row, "hit_rate", f.pct(r.hit_rate));
      set(row, "anticipated_peak", f.num(r.anticipated_peak));
      sparkline(row.querySelector("[data-sparkline]"), r.lookahead || []);
      set(row, "outstanding", f.num(r.outstanding));
      replicaWarnings(row, r.warnings || []);
    });
  }

  // The look-ahead map's curve: KV tokens over the next iterations, scaled to its own peak.
  function sparkline(svg, values) {
    if (!svg) return;
    const peak = Math.max.apply(null, values.concat([1]));
    const w = 60, h = 14, n = Math.max(values.length - 1, 1);
    const points = values.map(function (v, i) {
      return (i * w / n).toFixed(1) + "," + (h - v / peak * (h - 1)).toFixed(1);
    }).join(" ");
    const line = svg.querySelector("polyline");
    if (line.getAttribute("points") !== points) line.setAttribute("points", points);
  }

  // The balancer's warnings about its view of the replica's cache, in plain words.
  function replicaWarnings(row, warnings) {
    const box = row.querySelector("[data-warnings]");
    const text = warnings.map(function (w) { return w.kind + w.message; }).join("|");
    if (!box || box.dataset.shown === text) return;
    box.dataset.shown = text;
    box.replaceChildren.apply(box, warnings.map(function (w) {
      const p = document.createElement("p");
      p.className = "warning";
      p.dataset.warning = w.kind;
      p.textContent = "⚠ " + w.message;
      return p;
    }));
  }

  m.on("snapshot", function (s) {
    s.regions.forEach(regionCard);
    s.replicas.forEach(replicaRow);
  });

  // Events: prepend rows that match the page's filter (the Events page's form).
  const feed = document.querySelector("#events-feed tbody");
  const filters = new URLSearchParams(location.search);
  function matches(e) {
    const subject = (filters.get("subject") || "").toLowerCase();
    return (!filters.get("kind") || filters.get("kind") === e.kind) &&
      (!filters.get("severity") || filters.get("severity") === e.severity) &&
      (!subject || e.subject.toLowerCase().indexOf(subject) >= 0);
  }
  m.on("event", function (message) {
    const e = message.event;
    if (!feed || !matches(e) || feed.querySelector('[data-event="' + e.id + '"]')) return;
    const empty = feed.querySelector("tr.empty");
    if (empty) empty.remove();
    const row = document.createElement("tr");
    row.className = "sev-" + e.severity + " fresh";
    row.dataset.event = e.id;
    row.dataset.kind = e.kind;
    [new Date(e.created_at).toLocaleTimeString([], { hour12: false }), e.kind, e.severity, e.subject, e.message]
      .forEach(function (text) { const td = document.createElement("td"); td.textContent = text; row.appendChild(td); });
    feed.insertBefore(row, feed.firstChild);
  });

  // Drills: the live timeline.
  const timeline = document.getElementById("drill-timeline");
  const shownDrillLines = new Set();  // a socket replays recent lines on connect: each shows once
  m.on("drill", function (d) {
    const key = d.run + ":" + d.seq;
    if (!timeline || shownDrillLines.has(key)) return;
    shownDrillLines.add(key);
    const empty = timeline.querySelector(".empty");
    if (empty) empty.remove();
    const li = document.createElement("li");
    li.textContent = new Date().toLocaleTimeString([], { hour12: false }) + "  " + d.drill + ": " + d.text;
    if (d.done) li.className = "done outcome-" + d.outcome;
    li.dataset.seq = d.seq;
    // Replayed lines arrive after live ones published meanwhile: keep publishing order.
    const later = Array.from(timeline.children).find(function (x) { return Number(x.dataset.seq) > d.seq; });
    timeline.insertBefore(li, later || null);
  });

  // Sortable, filterable tables.
  document.querySelectorAll("table.sortable th").forEach(function (th, index) {
    th.addEventListener("click", function () {
      const body = th.closest("table").tBodies[0];
      const num = th.dataset.type === "num";
      const dir = th.dataset.dir === "asc" ? -1 : 1;
      th.dataset.dir = dir === 1 ? "asc" : "desc";
      const key = function (row) {
        const t = row.cells[index].textContent.trim();
        return num ? (parseFloat(t) || 0) : t;
      };
      Array.from(body.rows).sort(function (a, b) { return key(a) > key(b) ? dir : key(a) < key(b) ? -dir : 0; })
        .forEach(function (row) { body.appendChild(row); });
    });
  });
  document.querySelectorAll("input[data-table]").forEach(function (input) {
    input.addEventListener("input", function () {
      const q = input.value.toLowerCase();
      document.querySelectorAll("#" + input.dataset.table + " tbody tr").forEach(function (row) {
        row.hidden = q && row.textContent.toLowerCase().indexOf(q) < 0;
      });
    });
  });
})();
