"use strict";
// The viewer page's scale bar (/view/<identifier>): OpenSeadragon has none. The page gives the
// image's pixel size along x ("scale-options": size and unit); on every redraw the bar takes the
// length, among 1, 2 and 5 times a power of ten, that is at most TARGET screen pixels at the
// current zoom, in the length unit that keeps the number from 1 to 999.
(function () {
  var el = document.getElementById("scale-options");
  if (!el || !window.viewer) { return; }
  var opts = JSON.parse(el.textContent);
  var TARGET = 120;
  // metres per unit, for the units a descriptor spells (core.units); other units are shown as given
  var METRES = { "pm": 1e-12, "Å": 1e-10, "nm": 1e-9, "µm": 1e-6, "mm": 1e-3, "cm": 1e-2, "m": 1, "km": 1e3 };
  var SHOWN = ["pm", "nm", "µm", "mm", "m", "km"];
  var box = document.createElement("div"), bar = document.createElement("div"), label = document.createElement("span");
  box.id = "scale-bar";
  box.appendChild(bar);
  box.appendChild(label);
  document.body.appendChild(box);
  window.viewerScale = { label: "", width: 0 };

  function nice(x) {
    var p = Math.pow(10, Math.floor(Math.log10(x)));
    return [5, 2, 1].map(function (m) { return m * p; }).filter(function (v) { return v <= x * (1 + 1e-9); })[0];
  }

  function text(length) {
    var metres = METRES[opts.unit], unit = opts.unit, value = length;
    if (metres !== undefined) {
      for (var i = SHOWN.length - 1; i >= 0; i--) {
        value = length * metres / METRES[SHOWN[i]];
        unit = SHOWN[i];
        if (value >= 1 - 1e-9) { break; }
      }
    }
    return Number(value.toPrecision(6)) + " " + unit;
  }

  function update() {
    var item = viewer.world.getItemAt(0);
    if (!item) { return; }
    var perImagePx = item.viewportToImageZoom(viewer.viewport.getZoom(true));  // screen px per image px
    var length = nice(TARGET * opts.size / perImagePx), width = length / opts.size * perImagePx;
    bar.style.width = Math.round(width) + "px";
    label.textContent = text(length);
    window.viewerScale = { label: label.textContent, width: Math.round(width) };
  }

  viewer.addHandler("open", update);
  viewer.addHandler("animation", update);
  viewer.addHandler("resize", update);
  update();
})();
