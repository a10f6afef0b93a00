// Search on a site opened from disk. Browsers refuse to start a Web Worker from a file://
// page, and the theme runs its search in one; there (and only there) this runs the worker
// script in a hidden iframe instead, which shares the page's origin, with the same messages
// both ways. Over http(s) the browser's own Worker is used. Loaded before the theme's bundle.
(function () {
  "use strict";
  if (location.protocol !== "file:") {
    return;
  }

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.pending = [];
      this.ready = false;
      this.frame = document.createElement("iframe");
      this.frame.style.display = "none";
      this.frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(this.frame);
      const scope = this.frame.contentWindow;
      // What the worker script posts comes back to the page as a worker's message would.
      scope.postMessage = (data) => this.fire("message", new MessageEvent("message", { data }));
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        this.ready = true;
        for (const data of this.pending.splice(0)) {
          this.deliver(data);
        }
      };
      script.onerror = () => this.fire("error", new Event("error"));
      scope.document.head.appendChild(script);
    }

    fire(type, event) {
      this.dispatchEvent(event);
      const handler = type === "message" ? this.onmessage : this.onerror;
      if (typeof handler === "function") {
        handler.call(this, event);
      }
    }

    deliver(data) {
      const scope = this.frame.contentWindow;
      scope.dispatchEvent(new scope.MessageEvent("message", { data }));
    }

    postMessage(data) {
      if (this.ready) {
        this.deliver(data);
      } else {
        this.pending.push(data);
      }
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = FileWorker;
})();
