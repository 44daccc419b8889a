// Live updates without reload: poll this page's live part (?partial=1, rendered and escaped on the
// server) and swap it in. A failed poll shows the lost-connection banner; the next good one hides it.
(function () {
  "use strict";
  var POLL_MS = 2000, TIMEOUT_MS = 5000;
  var live, conn, connText, lost, lastText, lastOk = Date.now(), busy = false;

  function setState(ok) {
    conn.className = "conn " + (ok ? "ok" : "lost");
    connText.textContent = ok ? "live" : "offline";
    lost.hidden = ok;
  }

  function selecting() {
    var s = window.getSelection && window.getSelection();
    return s && !s.isCollapsed && live.contains(s.anchorNode);
  }

  function poll() {
    if (busy || document.hidden) return;
    busy = true;
    var ctl = new AbortController();
    var timer = setTimeout(function () { ctl.abort(); }, TIMEOUT_MS);
    var url = location.pathname + (location.search ? location.search + "&" : "?") + "partial=1";
    fetch(url, {cache: "no-store", credentials: "same-origin", signal: ctl.signal})
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (!selecting() && live.innerHTML !== html) {
          // keep the reader's place in the log: at the bottom it follows, elsewhere it stays
          var log = document.getElementById("log"), top = log && log.scrollTop,
              atEnd = log && log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          live.innerHTML = html;
          var log2 = document.getElementById("log");
          if (log2 && log) log2.scrollTop = atEnd ? log2.scrollHeight : top;
          else if (log2) log2.scrollTop = log2.scrollHeight;
          var gen = document.getElementById("generated-at");
          if (gen) lastText.textContent = gen.textContent;
        }
        lastOk = Date.now();
        setState(true);
      })
      .catch(function () { setState(false); })
      .finally(function () { clearTimeout(timer); busy = false; });
  }

  function token() {
    var t = sessionStorage.getItem("eaglelab_token");
    if (!t) {
      t = prompt("Token for actions (the server's EAGLELAB_TOKEN):");
      if (t) sessionStorage.setItem("eaglelab_token", t);
    }
    return t;
  }

  function act(btn) {
    if (!confirm(btn.getAttribute("data-confirm"))) return;
    var t = token();
    if (!t) return;
    btn.disabled = true;
    fetch(btn.getAttribute("data-url"), {method: "POST", headers: {"Authorization": "Bearer " + t}})
      .then(function (r) {
        return r.json().then(function (body) { return {status: r.status, body: body}; });
      })
      .then(function (res) {
        if (res.status === 401) sessionStorage.removeItem("eaglelab_token");
        if (res.status >= 400) alert(res.body.error || ("failed: HTTP " + res.status));
        poll();
      })
      .catch(function (e) { alert("failed: " + e); })
      .finally(function () { btn.disabled = false; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    live = document.getElementById("live");
    conn = document.getElementById("conn");
    connText = document.getElementById("conn-text");
    lost = document.getElementById("conn-lost");
    lastText = document.getElementById("conn-last");
    if (!live) return;
    var log = document.getElementById("log");
    if (log) log.scrollTop = log.scrollHeight;  // a log opens at its end, as `tail` shows it
    setInterval(poll, POLL_MS);
    document.addEventListener("visibilitychange", poll);
    document.addEventListener("click", function (ev) {
      var btn = ev.target.closest && ev.target.closest("button.act");
      if (btn) act(btn);
    });
  });
})();
