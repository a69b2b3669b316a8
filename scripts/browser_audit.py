"""Open a page in headless Chromium and report what a reader's browser would see go wrong.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages,
NUL-terminated, on file descriptors 3 and 4), so no websocket client, Playwright or driver binary is
needed: Debian's ``chromium`` package is enough (``apt-get install -y chromium``).

    python scripts/browser_audit.py report.html          # prints the audit, exits 1 on a problem

The audit (``audit(page)``) lists
- every console message of level error or warning, and every uncaught exception;
- every request that leaves the machine (anything but ``file:``, ``data:``, ``blob:``, ``about:``);
- every ``<img>`` that did not decode (``complete`` and a natural width of 0) and every inline
  ``<svg>`` drawn with no area: a figure that does not render.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:", "chrome:", "chrome-error:")

# run in the page after load: every figure and whether it rendered
FIGURES_JS = """(() => {
  const imgs = [...document.images].map(i => ({alt: i.alt || i.src.slice(0, 60), ok: i.complete && i.naturalWidth > 0,
                                              w: i.naturalWidth, h: i.naturalHeight}));
  const svgs = [...document.querySelectorAll('svg')].filter(s => !s.parentElement.closest('svg')).map((s, k) => {
    const r = s.getBoundingClientRect(), t = s.querySelector('title');
    return {alt: t ? t.textContent : 'inline svg ' + k, ok: r.width > 0 && r.height > 0 && s.childElementCount > 0,
            w: r.width, h: r.height};
  });
  return JSON.stringify({imgs, svgs, title: document.title});
})()"""


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@dataclass
class Audit:
    page: str
    console: list[str] = field(default_factory=list)      # errors and warnings, exceptions
    external: list[str] = field(default_factory=list)     # requests that would leave the machine
    figures: list[dict] = field(default_factory=list)     # every <img> and top-level <svg>
    title: str = ""

    @property
    def broken(self) -> list[str]:
        return [f"{f['alt']} ({f['w']:.0f}x{f['h']:.0f})" for f in self.figures if not f["ok"]]

    @property
    def problems(self) -> list[str]:
        return ([f"console: {m}" for m in self.console] + [f"external request: {u}" for u in self.external]
                + [f"figure not rendered: {b}" for b in self.broken])


class _Pipe:
    """The DevTools protocol over Chromium's pipe: send a command, read events until its reply."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int):
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.next_id = 0
        self.buffer = b""
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("headless Chromium did not answer over --remote-debugging-pipe")
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                raise RuntimeError(f"headless Chromium closed its pipe (exit {self.proc.poll()})")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        for k, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(k)
        while True:
            event = self._read(deadline)
            if event.get("method") == method:
                return event
            self.events.append(event)


def audit(page: Path, chromium: str | None = None, settle: float = 0.5, timeout: float = 120) -> Audit:
    """Load ``page`` in headless Chromium and collect console errors, outside requests and broken figures."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no headless Chromium (chromium, chromium-browser, google-chrome): "
                                "apt-get install -y chromium")
    url = Path(page).resolve().as_uri()
    to_r, to_w = os.pipe()       # harness -> browser (its fd 3)
    from_r, from_w = os.pipe()   # browser -> harness (its fd 4)
    with tempfile.TemporaryDirectory() as profile:
        def child_fds():   # the pipe's ends as fds 3 and 4, inheritable (dup2 onto itself would keep CLOEXEC)
            read_end, write_end = os.dup(to_r), os.dup(from_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)
        proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                 "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}", "about:blank"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=child_fds, close_fds=False)   # fds 3 and 4 survive exec
        os.close(to_r)
        os.close(from_w)
        pipe = _Pipe(proc, to_w, from_r)
        try:
            return _audit(pipe, url, settle, timeout)
        finally:
            try:
                pipe.call("Browser.close", timeout=10)
            except Exception:   # already gone: nothing to close
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            os.close(to_w)
            os.close(from_r)


def _audit(pipe: _Pipe, url: str, settle: float, timeout: float) -> Audit:
    target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
    session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Network", "Log"):
        pipe.call(f"{domain}.enable", session=session)
    pipe.events.clear()
    pipe.call("Page.navigate", session=session, url=url)
    pipe.wait_for("Page.loadEventFired", timeout=timeout)
    end = time.monotonic() + settle   # late console messages and requests
    while time.monotonic() < end:
        pipe.call("Runtime.evaluate", session=session, expression="1")
        time.sleep(0.05)
    result = pipe.call("Runtime.evaluate", session=session, expression=FIGURES_JS, returnByValue=True)
    seen = json.loads(result["result"]["value"])
    found = Audit(page=url, figures=seen["imgs"] + seen["svgs"], title=seen["title"])
    for event in pipe.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            found.console.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            found.console.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            entry = params["entry"]
            found.console.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            request_url = params.get("request", {}).get("url", "")
            if not request_url.startswith(LOCAL_SCHEMES):
                found.external.append(request_url)
    return found


def main(argv: list[str] | None = None) -> int:
    pages = argv if argv is not None else sys.argv[1:]
    if not pages:
        print(__doc__)
        return 2
    bad = 0
    for page in pages:
        result = audit(Path(page))
        print(f"{page}: {len(result.figures)} figure(s), {len(result.problems)} problem(s)")
        for problem in result.problems:
            print(f"  {problem}")
        bad += bool(result.problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
