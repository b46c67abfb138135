/* The new-request form's "GPU models it accepts" (docs/federation.md): as the minimum GPU memory and compute
 * capability are typed, the accepted-model lists offer only the models one of whose cards runs those needs, the
 * same rule as the server's (workloads/routing.py: incompatibility; it still checks on submit). The models and their
 * cards' facts are in each list's data-models; nothing is fetched. Without this file the server filters on submit. */
(function () {
  "use strict";

  function memoryNeed(input) {
    var text = input ? input.value.trim() : "";
    if (!/^\d{1,4}$/.test(text)) return 0;  // empty or not a whole number yet: no filter (the server says why)
    var gib = parseInt(text, 10);
    return gib >= 1 && gib <= 4096 ? gib : 0;
  }

  function capabilityNeed(input) {
    var text = input ? input.value.trim() : "";
    var m = /^(\d{1,2})\.(\d)$/.exec(text);
    return m ? [parseInt(m[1], 10), parseInt(m[2], 10)] : null;  // "9." while typing: no filter yet
  }

  function cardRuns(card, gib, cc) {
    var memoryMib = card[0], capability = card[1];
    if (gib && (!memoryMib || memoryMib / 1024 < gib)) return false;  // unknown memory never runs a declared need
    if (cc) {
      var m = /^(\d+)\.(\d+)$/.exec(capability || "");
      if (!m) return false;
      var major = parseInt(m[1], 10), minor = parseInt(m[2], 10);
      if (major < cc[0] || (major === cc[0] && minor < cc[1])) return false;
    }
    return true;
  }

  function note(select) {
    var id = select.id + "-filtered";
    var el = document.getElementById(id);
    if (!el) {
      el = document.createElement("p");
      el.id = id;
      el.className = "help";
      el.setAttribute("aria-live", "polite");
      select.parentNode.insertBefore(el, select.nextSibling);
    }
    return el;
  }

  function refilter(form) {
    var gib = memoryNeed(form.querySelector("input[name$='min_gpu_memory_gib']"));
    var cc = capabilityNeed(form.querySelector("input[name$='min_compute_capability']"));
    form.querySelectorAll("select[data-models]").forEach(function (select) {
      var models;
      try { models = JSON.parse(select.getAttribute("data-models")); } catch (e) { return; }
      var chosen = select.value;
      var hidden = [];
      while (select.options.length) select.remove(0);
      select.add(new Option("None", ""));
      models.forEach(function (model) {
        if (model.cards.some(function (card) { return cardRuns(card, gib, cc); })) {
          select.add(new Option(model.label, model.value, false, model.value === chosen));
        } else {
          hidden.push(model.value);
        }
      });
      if (select.value !== chosen && chosen) select.value = "";
      note(select).textContent = hidden.length ? "Not offered for these needs: " + hidden.join(", ") + "." : "";
    });
  }

  document.querySelectorAll("form").forEach(function (form) {
    if (!form.querySelector("select[data-models]")) return;
    form.addEventListener("input", function (event) {
      var name = event.target && event.target.name || "";
      if (/min_gpu_memory_gib$|min_compute_capability$/.test(name)) refilter(form);
    });
    // Back or a reload may bring typed needs back: follow them.
    var typed = form.querySelectorAll("input[name$='min_gpu_memory_gib'], input[name$='min_compute_capability']");
    if (Array.prototype.some.call(typed, function (input) { return input.value.trim(); })) refilter(form);
  });
})();
