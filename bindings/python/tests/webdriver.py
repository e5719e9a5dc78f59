"""A small WebDriver client for headless Chromium (Debian's chromium and chromium-driver), as
the Rust browser tests use: enough to open a page, enter a frame and run a script."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    def __init__(self):
        driver = shutil.which("chromedriver")
        chrome = os.environ.get("CHROME_BIN") or shutil.which("chromium") or "/usr/bin/chromium"
        assert driver and os.path.exists(chrome), (
            "the browser test needs Debian's chromium and chromium-driver (scripts/test.sh installs them)")
        self.port = _free_port()
        self.profile = tempfile.mkdtemp()
        self.process = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 20
        while True:
            try:
                self._call("GET", "/status")
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={self.profile}", "--window-size=1280,1000"]
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"binary": chrome, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["value"]

    def _session(self, method, path, body=None):
        return self._call(method, f"/session/{self.session}{path}", body)

    def goto(self, url):
        self._session("POST", "/url", {"url": url})

    def frame(self, index):
        self._session("POST", "/frame", {"id": index})

    def run(self, script, *args):
        return self._session("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.run(script):
                return True
            time.sleep(0.1)
        return False

    def close(self):
        try:
            self._session("DELETE", "")
        finally:
            self.process.kill()
            self.process.wait()
            shutil.rmtree(self.profile, ignore_errors=True)
