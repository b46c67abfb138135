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

  // One-time form tokens (portal/forms.py): keep each form's token in the history entry's state, never in the
  // address (a ?form=... suffix ended up in bookmarks), so that Back or a reload, which often load the page
  // afresh with a new token, put the form's first token back and sending it again is a replay. A ?form= left in
  // an old address (the server reads it once) is taken out of the address.
  function keepFormToken() {
    if (!window.history || !window.history.replaceState || !window.URL) return;
    var inputs = document.querySelectorAll("input[data-once]");
    if (!inputs.length) return;
    var current = window.history.state;
    var state = {};
    if (current && typeof current === "object") Object.keys(current).forEach(function (k) { state[k] = current[k]; });
    var saved = {};
    if (state.onceTokens && typeof state.onceTokens === "object") {
      Object.keys(state.onceTokens).forEach(function (k) { saved[k] = state.onceTokens[k]; });
    }
    var url = new URL(window.location.href);
    var changed = false;
    inputs.forEach(function (input) {
      var param = input.getAttribute("data-once");
      if (saved[input.name]) {
        input.value = saved[input.name];  // this entry's form, as it was: sending it again is a replay
      } else if (input.value) {
        saved[input.name] = input.value;
        changed = true;
      }
      if (param && url.searchParams.has(param)) {
        url.searchParams.delete(param);
        changed = true;
      }
    });
    if (!changed) return;
    state.onceTokens = saved;
    window.history.replaceState(state, "", url.toString());
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", keepFormToken);
  else keepFormToken();

  // HAMi share fields (workloads/forms.py): shown for a HAMi flavor only (the flavor select lists those in
  // data-hami-flavors), the size fields for "a size of my own" only. Hidden ones are disabled, so neither the
  // submission nor the cost estimate (htmx) sends them. Without this script every field shows, and the service says
  // what does not fit. Capture phase: the fields are set before htmx reads the form for the estimate.
  function showShareFields() {
    document.querySelectorAll("select[data-hami-flavors]").forEach(function (select) {
      var form = select.form;
      if (!form) return;
      var hami = select.getAttribute("data-hami-flavors").split(" ").indexOf(select.value) >= 0;
      var own = form.querySelector("input[type=radio][data-hami-only][value=false]");
      var ownSize = own ? own.checked : true;
      form.querySelectorAll("[data-hami-only]").forEach(function (input) {
        var show = hami && (input.getAttribute("data-hami-only") !== "own" || ownSize);
        var box = input.closest(".field") || input;
        box.style.display = show ? "" : "none";
        input.disabled = !show;
      });
    });
  }
  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.matches && target.matches("select[data-hami-flavors], [data-hami-only]")) showShareFields();
  }, true);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", showShareFields);
  else showShareFields();

  // Close the user menu when clicking elsewhere.
  document.addEventListener("click", function (event) {
    document.querySelectorAll("details.usermenu[open]").forEach(function (menu) {
      if (!menu.contains(event.target)) menu.removeAttribute("open");
    });
  });
})();
