// trainsup web: keeps the live parts of the page current without reloading it.
// Each element with data-live="URL" is replaced by URL's fragment every data-refresh ms. A part
// holding the focus (someone typing in a form) is left alone until they are done. No framework.
(function () {
  "use strict";
  window.trainsupLoaded = window.trainsupLoaded || Date.now();
  var every = parseInt(document.body.getAttribute("data-refresh"), 10) || 1000;
  var busy = false;

  function refresh() {
    if (busy || document.hidden) { return; }
    var parts = document.querySelectorAll("[data-live]");
    if (!parts.length) { return; }
    busy = true;
    var pending = parts.length;
    parts.forEach(function (part) {
      fetch(part.getAttribute("data-live"), { credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.redirected || !response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          if (!part.contains(document.activeElement) && part.innerHTML !== html) {
            part.innerHTML = html;
          }
          part.removeAttribute("data-stale");
        })
        .catch(function () { part.setAttribute("data-stale", "the page could not be refreshed"); })
        .finally(function () {
          pending -= 1;
          if (pending === 0) { busy = false; }
        });
    });
  }
  setInterval(refresh, every);
})();
