// brooq dashboard: live refresh by polling the page itself, pausable (no other requests).
(function () {
  "use strict";
  var PERIOD_MS = 5000;
  var KEY = "brooq-refresh-paused";
  var button, label, timer = null;
  var edited = false; // a filter changed but not applied: a refresh would undo it

  function paused() { return window.localStorage.getItem(KEY) === "1"; }

  function show() {
    var live = document.querySelector("main[data-live]");
    button.setAttribute("aria-pressed", paused() ? "true" : "false");
    button.textContent = paused() ? "Resume refresh" : "Pause refresh";
    button.hidden = !live;
    label.textContent = !live ? "" : paused() ? "refresh paused" : "refreshing every 5 s";
  }

  function refresh() {
    var main = document.querySelector("main[data-live]");
    if (!main || paused() || document.hidden || edited) { return; }
    if (document.activeElement && main.contains(document.activeElement) &&
        /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName)) { return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null || paused()) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-live]");
        if (fresh) { main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes)); }
        label.textContent = "refreshed " + new Date().toLocaleTimeString();
      })
      .catch(function () { label.textContent = "refresh failed; retrying"; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    button = document.getElementById("live-toggle");
    label = document.getElementById("live-state");
    if (!button) { return; }
    button.addEventListener("click", function () {
      window.localStorage.setItem(KEY, paused() ? "0" : "1");
      show();
    });
    var main = document.querySelector("main[data-live]");
    if (main) {
      main.addEventListener("input", function () { edited = true; });
      main.addEventListener("change", function () { edited = true; });
    }
    show();
    timer = window.setInterval(refresh, PERIOD_MS);
  });
}());
