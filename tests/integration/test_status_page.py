"""The status page at `/`, in a real headless Chromium (Debian's, driven by Selenium through
Debian's chromedriver): it asks for the token, then shows instances, ranks, states, a layer
progress bar while loading, queue depth, tokens/s while generating and the last log lines, and
keeps them current."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.harness import SAFETY, Daemon
from tests.integration.conftest import double_env

TOKEN = "page-token"
EOS = "2"
SHOTS = os.environ.get("EXOD_SCREENSHOTS")  # a folder: keep a screenshot to look at


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1280,800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def text(driver: WebDriver, css: str) -> str:
    """The text of the first element matching `css`, read in one step: the page rebuilds its
    table at every poll, so a handle to an element would go stale."""
    return str(driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';", css))


def cell(driver: WebDriver, instance: str, css: str) -> str:
    return text(driver, f'tr[data-instance="{instance}"] {css}').strip()


def attrs(driver: WebDriver, css: str, *names: str) -> tuple[str | None, ...]:
    got = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e ? arguments[1].map(n => e.getAttribute(n)) : null;", css, list(names))
    return tuple(got) if got else ()


def test_status_page_in_chromium(browser: WebDriver, daemons: Callable[..., Daemon],
                                 tiny_model: Path, fake_model: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)  # a secret: closed to other users
    gate = tmp_path / "gate"  # never created: `slow` stays at layer 3 of 4
    d = daemons({"api": {"listen": "127.0.0.1:0", "token_file": str(token_file)},
                 "instances": {
                     "tiny": {"model": str(tiny_model)},
                     "slow": {"model": str(fake_model), "env": {
                         **double_env("gated"), "EXOD_DOUBLE_GATE": str(gate)}}}})
    d.start()
    d.until_state("tiny", "ready")
    d.until_instance("slow", lambda i: i["ranks"][0]["layers_loaded"] == 3, what="slow at 3/4")
    url = d.api_url()
    wait = WebDriverWait(browser, SAFETY)

    browser.get(url + "/")
    wait.until(lambda b: b.find_element(By.ID, "auth").is_displayed())
    browser.find_element(By.ID, "token").send_keys(TOKEN + "\n")
    wait.until(lambda b: "ready" in cell(b, "tiny", ".state"))
    assert "1/2 ready" in text(browser, "#daemon")
    assert cell(browser, "slow", ".state") == "loading"
    assert attrs(browser, 'tr[data-instance="slow"] progress', "value", "max") == ("3", "4")
    assert "3/4" in cell(browser, "slow", ".load")
    assert "pid" in cell(browser, "tiny", ".ranks")
    wait.until(lambda b: text(b, '[data-logs="tiny"] pre') not in ("", "(nothing yet)"))

    # Generating: tokens/s and the request in flight show up, live.
    client = openai.OpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0, timeout=SAFETY)
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                            "content": "hi"}], stream=True,
                                            max_tokens=100_000, logit_bias={EOS: -100})
    stop = threading.Event()

    def drain() -> None:
        for _ in stream:
            if stop.is_set():
                break
        stream.close()

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        wait.until(lambda b: float(cell(b, "tiny", ".tps") or 0) > 0
                   and cell(b, "tiny", ".active") == "1")
        if SHOTS:
            browser.save_screenshot(str(Path(SHOTS) / "status-page.png"))
    finally:
        stop.set()
        reader.join(SAFETY)
    # The page follows changes: an operator stop shows up without a reload of the page.
    d.ctl("stop", "slow")
    wait.until(lambda b: cell(b, "slow", ".state") == "stopped")
    assert attrs(browser, 'tr[data-instance="slow"] progress', "value") == ()


def test_status_page_shows_the_cluster(browser: WebDriver, daemons: Callable[..., Daemon],
                                       tmp_path: Path) -> None:
    """Two nodes on this host, found by a seed address: the page lists the other as a member,
    with what it announced, and the link between them."""
    from tests.harness import free_port

    key = tmp_path / "cluster.key"
    key.write_text("0123456789abcdef" * 2)
    key.chmod(0o600)
    port = free_port()
    cluster = {"key_file": str(key), "mdns": False, "interval": "200ms"}
    b = daemons({"node": {"name": "node-b"}, "api": {"listen": ""},
                 "cluster": {**cluster, "listen": f"127.0.0.1:{port}", "test_memory": "8GiB"}},
                name="node-b")
    a = daemons({"node": {"name": "node-a"}, "cluster": {
        **cluster, "listen": "127.0.0.1:0", "peers": [f"127.0.0.1:{port}"]}}, name="node-a")
    b.start()
    a.start()
    wait = WebDriverWait(browser, SAFETY)
    browser.get(a.api_url() + "/")
    wait.until(lambda br: text(br, 'tr[data-node="node-b"] .state') == "member")
    row = text(browser, 'tr[data-node="node-b"]')
    assert "cpu" in row and "of 8.0 GiB" in row
    assert text(browser, 'tr[data-node="node-a"] .state') == "this node"
    wait.until(lambda br: "node-a → node-b" in text(br, "#links"))
