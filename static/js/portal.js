/* Small progressive enhancements. Every page works without this file. */
(function () {
  "use strict";

  // Forms with data-confirm ask first. Capture phase, so a "no" also stops htmx's submit handler.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form && form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);

  // Copy buttons: <button data-copy="#selector">.
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.value !== undefined ? source.value : source.textContent;
    var done = function () {
      var label = button.textContent;
      button.textContent = "Copied";
      button.setAttribute("data-copied", "true");
      setTimeout(function () { button.textContent = label; }, 2000);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallback(source); done(); });
    } else {
      fallback(source);
      done();
    }
  });

  function fallback(source) {
    if (source.select) {
      source.focus();
      source.select();
    }
    try { document.execCommand("copy"); } catch (e) { /* the text stays selected for Ctrl+C */ }
  }

  // One-time form tokens (portal/forms.py): keep the form's token in the address (?form=...), so that
  // Back, which often loads the page afresh, shows the same form and sending it again is a replay.
  function keepFormToken() {
    if (!window.history || !window.history.replaceState || !window.URL) return;
    document.querySelectorAll("input[data-once]").forEach(function (input) {
      var param = input.getAttribute("data-once");
      if (!param || !input.value) return;
      var url = new URL(window.location.href);
      if (url.searchParams.get(param) === input.value) return;
      url.searchParams.set(param, input.value);
      window.history.replaceState(window.history.state, "", url.toString());
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", keepFormToken);
  else keepFormToken();

  // Close the user menu when clicking elsewhere.
  document.addEventListener("click", function (event) {
    document.querySelectorAll("details.usermenu[open]").forEach(function (menu) {
      if (!menu.contains(event.target)) menu.removeAttribute("open");
    });
  });
})();
