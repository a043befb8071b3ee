"use strict";
// The viewer page's channel panel (/view/<identifier>): a toggle, colour, window and gamma per
// channel, with the channel's histogram (GET /histogram) drawn under its window sliders, a
// slider per other axis (z, t), each change posted as a render spec (POST /render)
// and shown by reopening the IIIF source as <array_id>;z=..;r=<id>, the viewport kept. The
// view is shareable: the URL's hash carries the spec id, the plane and the viewport. Where the
// source has label images, a label overlay row: which one, shown or not, and its opacity (the
// spec's "labels"). The t slider's "follow" box keeps the newest frame of a growing tensor shown.
(function () {
  var el = document.getElementById("panel-options");
  var panel = document.getElementById("panel");
  if (!el || !panel || !window.viewer) { return; }
  var opts = JSON.parse(el.textContent);
  var state = { channels: [], plane: Object.assign({}, opts.plane), spec: opts.spec, opened: 0, following: null,
    labels: { shown: false, name: (opts.labels || [])[0] || null, opacity: 0.5 } };
  window.viewerPanel = state;
  var timer = null;

  function hashParams() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) { out[decodeURIComponent(kv.slice(0, i))] = decodeURIComponent(kv.slice(i + 1)); }
    });
    return out;
  }

  function identifier() {
    var parts = [opts.array_path];
    Object.keys(state.plane).sort().forEach(function (k) { parts.push(k + "=" + state.plane[k]); });
    if (state.spec) { parts.push("r=" + state.spec); }
    return parts.join(";");
  }

  function share() {
    var vp = viewer.viewport, c = vp.getCenter(), parts = [];
    if (state.spec) { parts.push("r=" + state.spec); }
    Object.keys(state.plane).sort().forEach(function (k) { parts.push(k + "=" + state.plane[k]); });
    parts.push("view=" + [c.x, c.y, vp.getZoom()].map(function (v) { return v.toFixed(5); }).join(","));
    history.replaceState(null, "", "#" + parts.join("&"));
  }

  function reopen(view) {
    var vp = viewer.viewport;
    var keep = view || [vp.getCenter().x, vp.getCenter().y, vp.getZoom()];
    viewer.addOnceHandler("open", function () {
      viewer.viewport.zoomTo(keep[2], null, true);
      viewer.viewport.panTo(new OpenSeadragon.Point(keep[0], keep[1]), true);
      state.opened += 1;
      share();
    });
    viewer.open(opts.iiif + identifier() + "/info.json");
  }

  function specDoc() {
    var channels = state.channels.filter(function (c) { return c.visible; }).map(function (c) {
      return { index: c.index, color: c.color, window: { start: c.start, end: c.end }, gamma: c.gamma };
    });
    var doc = { channels: channels };
    if (state.labels.shown && state.labels.name) {
      doc.labels = { name: state.labels.name, opacity: state.labels.opacity };
    }
    return doc;
  }

  function post() {
    var doc = specDoc();
    if (!doc.channels.length) { panel.querySelector(".note").textContent = "no channel is shown"; return; }
    panel.querySelector(".note").textContent = "";
    fetch(opts.render, { method: "POST", body: JSON.stringify(doc), credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : r.text().then(function (t) { throw new Error(t); }); })
      .then(function (d) { state.spec = d.id; reopen(); })
      .catch(function (e) { panel.querySelector(".note").textContent = String(e.message || e); });
  }

  function later(fn) { clearTimeout(timer); timer = setTimeout(fn, 200); }

  function input(type, attrs, onchange) {
    var i = document.createElement("input");
    i.type = type;
    Object.keys(attrs).forEach(function (k) { i[k] = attrs[k]; });
    i.addEventListener(type === "checkbox" ? "change" : "input", function () { onchange(i); });
    return i;
  }

  // A channel's histogram on its canvas, over the window sliders' range: one column per canvas
  // pixel (the bins that fall in it summed), heights on a log scale (log(1 + count) of the
  // tallest column's: a channel's few bright pixels stay visible beside its background), in
  // the channel's colour inside its window and grey outside it, the window shaded behind.
  function drawHistogram(c) {
    var canvas = c.canvas, g = canvas.getContext("2d"), w = canvas.width, h = canvas.height;
    var n = c.counts.length, span = c.bin_width * n, cols = new Array(w).fill(0), peak = 0;
    c.counts.forEach(function (k, i) { cols[Math.min(w - 1, Math.floor(i * w / n))] += k; });
    cols.forEach(function (k) { peak = Math.max(peak, k); });
    var x0 = (c.start - c.min) / span * w, x1 = (c.end - c.min) / span * w;
    g.clearRect(0, 0, w, h);
    g.fillStyle = "rgba(0, 0, 0, 0.1)";
    g.fillRect(Math.floor(x0), 0, Math.ceil(x1) - Math.floor(x0), h);
    cols.forEach(function (k, x) {
      if (!k) { return; }
      var bar = Math.max(1, Math.round(h * Math.log(1 + k) / Math.log(1 + peak)));
      g.fillStyle = x + 1 > x0 && x < x1 ? c.color : "#999999";
      g.fillRect(x, h - bar, 1, bar);
    });
  }

  function channelRow(c) {
    var row = document.createElement("div"), top = c.min + c.bin_width * c.counts.length;
    var step = c.exact ? 1 : (top - c.min) / 1000;
    row.className = "channel";
    row.dataset.index = c.index;
    var name = document.createElement("span");
    name.textContent = c.label;
    row.appendChild(input("checkbox", { checked: c.visible, className: "visible" }, function (i) {
      c.visible = i.checked; later(post);
    }));
    row.appendChild(input("color", { value: c.color.toLowerCase(), className: "color" }, function (i) {
      c.color = i.value.toUpperCase(); drawHistogram(c); later(post);
    }));
    row.appendChild(name);
    row.appendChild(document.createElement("br"));
    ["start", "end"].forEach(function (key) {
      row.appendChild(input("range", { min: c.min, max: top, step: step, value: c[key], className: key },
        function (i) {
          var v = Number(i.value);
          if (key === "start" ? v < c.end : v > c.start) { c[key] = v; drawHistogram(c); later(post); }
        }));
    });
    row.appendChild(input("number", { min: 0.1, max: 10, step: 0.1, value: c.gamma, className: "gamma" },
      function (i) { var g = Number(i.value); if (g > 0 && g <= 10) { c.gamma = g; later(post); } }));
    c.canvas = document.createElement("canvas");
    c.canvas.className = "histogram";
    c.canvas.width = 150;
    c.canvas.height = 30;
    row.appendChild(c.canvas);
    drawHistogram(c);
    return row;
  }

  function axisRow(axis) {
    var row = document.createElement("div"), label = document.createElement("span");
    row.className = "axis";
    label.textContent = axis.name + " " + state.plane[axis.name];
    row.appendChild(label);
    var slider = input("range", { min: 0, max: axis.size - 1, step: 1, value: state.plane[axis.name],
      className: "axis-" + axis.name }, function (i) {
        state.plane[axis.name] = Number(i.value);
        label.textContent = axis.name + " " + i.value;
        later(function () { reopen(); });
      });
    row.appendChild(slider);
    if (axis.name === "t") { row.appendChild(followBox(axis, slider, label)); }
    return row;
  }

  // "follow": the t slider tracks the newest frame of a growing tensor, told by the Server-Sent
  // Events at /watch/<array id> (each record the whole shape); unticked, the stream is closed
  function followBox(axis, slider, label) {
    var box = input("checkbox", { checked: false, className: "follow-" + axis.name, title: "follow the newest frame" },
      function (i) {
        if (state.following) { state.following.close(); state.following = null; }
        if (!i.checked) { return; }
        state.following = new EventSource(opts.watch);
        state.following.addEventListener("extent", function (e) {
          var size = JSON.parse(e.data).shape[axis.axis];
          if (size - 1 === state.plane[axis.name] && Number(slider.max) === size - 1) { return; }
          slider.max = size - 1;
          slider.value = size - 1;
          state.plane[axis.name] = size - 1;
          label.textContent = axis.name + " " + (size - 1);
          later(function () { reopen(); });
        });
      });
    var wrap = document.createElement("label");
    wrap.appendChild(box);
    wrap.appendChild(document.createTextNode("follow"));
    return wrap;
  }

  function labelRow() {
    var row = document.createElement("div"), lab = state.labels, pick = document.createElement("select");
    row.className = "labels";
    row.appendChild(input("checkbox", { checked: lab.shown, className: "labels-shown" }, function (i) {
      lab.shown = i.checked; later(post);
    }));
    (opts.labels || []).forEach(function (name) {
      var o = document.createElement("option");
      o.value = o.textContent = name;
      o.selected = name === lab.name;
      pick.appendChild(o);
    });
    pick.className = "labels-name";
    pick.addEventListener("change", function () { lab.name = pick.value; if (lab.shown) { later(post); } });
    row.appendChild(pick);
    row.appendChild(input("range", { min: 0, max: 1, step: 0.05, value: lab.opacity, className: "labels-opacity",
      title: "label opacity" }, function (i) { lab.opacity = Number(i.value); if (lab.shown) { later(post); } }));
    return row;
  }

  function apply(spec) {
    var byIndex = {};
    spec.channels.forEach(function (c) { byIndex[c.index] = c; });
    state.channels.forEach(function (c) {
      var s = byIndex[c.index];
      c.visible = !!(s && s.visible !== false);
      if (s && s.color && s.color.charAt(0) === "#") { c.color = s.color; }
      if (s && s.window && s.window.start !== undefined) { c.start = s.window.start; c.end = s.window.end; }
      if (s && s.gamma) { c.gamma = s.gamma; }
    });
    if (spec.labels && (opts.labels || []).indexOf(spec.labels.name) >= 0) {
      state.labels = { shown: true, name: spec.labels.name, opacity: spec.labels.opacity };
    }
  }

  function build() {
    opts.axes.forEach(function (a) { panel.appendChild(axisRow(a)); });
    if ((opts.labels || []).length) { panel.appendChild(labelRow()); }
    state.channels.forEach(function (c) { panel.appendChild(channelRow(c)); });
    var note = document.createElement("div");
    note.className = "note";
    panel.appendChild(note);
  }

  var given = hashParams();
  opts.axes.forEach(function (a) { if (given[a.name] !== undefined) { state.plane[a.name] = Number(given[a.name]); } });
  var view = given.view ? given.view.split(",").map(Number) : null;
  if (given.r) { state.spec = given.r; }
  fetch(opts.histogram, { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (h) {
    state.channels = h.channels.map(function (c) {
      return { index: c.index, label: c.label, min: c.min, bin_width: c.bin_width, counts: c.counts, exact: c.exact,
        visible: c.active, color: c.color, start: c.window[0], end: c.window[1], gamma: 1 };
    });
    if (!state.spec) { build(); if (view || given.z !== undefined || given.t !== undefined) { reopen(view); } return; }
    return fetch(opts.render + "/" + state.spec, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) { state.spec = null; build(); return; }
      return r.json().then(function (spec) { apply(spec); build(); reopen(view); });
    });
  });
})();
