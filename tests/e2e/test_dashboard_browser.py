"""The dashboard in a real headless Chromium, against two real nodes of one team.

Two ``hyphae up`` processes on 127.0.0.1 (the mesh harness of ``tests/e2e_mesh``), each
with one agent and the built-in model, because meaning decides who is interested. B's
agent places a beacon; the page on B's API port, signed in with B's key, shows A as an
alive peer; A's agent stores a matching Decision, and the page shows it arriving in B's
inbox, pushed by the live stream, with no reload. Along the way: a wrong key is
refused, the key never appears in a URL, and search finds the decision.

The browser is Debian's ``chromium`` driven through its ``chromium-driver`` by selenium
(installed by ``.ci/run``); nothing is downloaded. The screenshots go to the test's temporary
directory, or, to refresh the ones the README shows, to ``$HYPHAE_SCREENSHOTS``::

    HYPHAE_SCREENSHOTS=docs/screenshots python -m pytest tests/e2e/test_dashboard_browser.py
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e_mesh.cluster import Lab, wait_beacons_known

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PAGE_DEADLINE = 30.0  # s: a busy 2-core machine runs two nodes with the model and a browser
DECISION = "Use pgvector for the V1 storage backend."


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with Lab(tmp_path / "lab") as running:
        yield running


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the pages are saved: never the checkout's tracked files unless asked to."""
    folder = Path(os.environ.get("HYPHAE_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[webdriver.Chrome]:
    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            raise AssertionError(f"{program} is missing: apt-get install chromium chromium-driver (.ci/run does)")
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium must never fetch a driver or a browser
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1150", f"--user-data-dir={tmp_path / 'chromium'}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: webdriver.Chrome, what: str, predicate, timeout: float = PAGE_DEADLINE):
    """Poll ``predicate(driver)`` until it is truthy; fail with the page's state after ``timeout``."""

    def attempt(d):
        try:
            return predicate(d)
        except (NoSuchElementException, StaleElementReferenceException):
            return None

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(attempt)
    except WebDriverException as exc:
        raise AssertionError(f"not within {timeout} s: {what}\n{page_state(driver)}") from exc


def page_state(driver: webdriver.Chrome) -> str:
    try:
        logs = driver.get_log("browser")
    except WebDriverException:
        logs = []
    body = driver.find_element(By.TAG_NAME, "body").text
    return f"url {driver.current_url}\npage text:\n{body[:3000]}\nconsole: {logs}"


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sign_in(driver: webdriver.Chrome, key: str) -> None:
    field = wait_for(driver, "the key field", lambda d: d.find_element(By.ID, "key") if d.find_element(By.ID, "key").is_displayed() else None)
    field.clear()
    field.send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()


def test_the_dashboard_shows_the_peer_and_a_teammates_decision_arriving(
    lab: Lab, browser: webdriver.Chrome, screenshots: Path
) -> None:
    a, b = lab.team(["a", "b"], provider="builtin")
    lab.start_mesh([a, b])
    a_key, _ = a.add_agent("agent-a")
    b_key, _ = b.add_agent("agent-b")
    beacon = b.mcp(b_key).call("place_beacon", {"query": "which database do we use for storage"})
    wait_beacons_known(a, 1)

    browser.get(f"{b.api_url}/")
    # A wrong key is refused and the page says so.
    sign_in(browser, "hy_not-a-key")
    wait_for(browser, "the login error", lambda d: "not valid" in d.find_element(By.ID, "login-error").text)

    sign_in(browser, b_key)
    wait_for(browser, "the live badge", lambda d: d.find_element(By.ID, "live").text == "live")
    row = wait_for(
        browser, "A as an alive peer",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#peers tr[data-node-id="{a.node_id}"][data-state="alive"]'),
    )  # fmt: skip
    assert a.mesh_address in row.text
    assert "agent agent-b" in browser.find_element(By.ID, "agent").text
    assert browser.find_elements(By.CSS_SELECTOR, "#inbox li") == []

    # A's agent decides; the decision arrives on B's page through the stream, with no reload.
    stored = a.mcp(a_key).call("store", {"content": DECISION, "cell_type": "Decision", "salience": 0.9})
    item = wait_for(
        browser, "the decision in B's inbox on the page",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#inbox li[data-node-id="{stored["node_id"]}"]'),
    )  # fmt: skip
    assert DECISION in item.text and "Decision" in item.text
    assert f"from node {a.node_id[:12]}" in item.text
    wait_for(
        browser, "A's row counting the cell received from it",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#peers tr[data-node-id="{a.node_id}"] td:nth-child(6)').text == "1",
    )  # fmt: skip
    wait_for(browser, "the flow log", lambda d: f"← {a.node_id[:12]}: 1 cell" in d.find_element(By.ID, "flow-log").text)
    browser.save_screenshot(str(screenshots / "dashboard.png"))

    # /metrics on both ends tells the same story.
    sent, received = (parse_metrics(node.http.get("/metrics").text) for node in (a, b))
    assert sent[("hyphae_stores_total", ())] == 1
    assert sent[("hyphae_mesh_diffs_sent_total", ())] >= 1
    assert sent[("hyphae_mcp_tool_seconds_count", (("outcome", "ok"), ("tool", "store")))] == 1
    assert received[("hyphae_mesh_diffs_received_total", (("kind", "cell"),))] == 1
    assert received[("hyphae_mesh_cells_stored_from_total", (("origin", a.node_id),))] == 1
    assert received[("hyphae_stores_total", ())] == 0  # a cell from the mesh is no store by B's agents

    # The key stays out of every URL; it lives in this tab's sessionStorage.
    assert b_key not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('hyphae.apiKey')") == b_key

    # Browse: B holds its own copy now, newest among the recent cells; search finds it; B's beacon is listed.
    browser.find_element(By.CSS_SELECTOR, '.tabs button[data-tab="recent"]').click()
    recent = wait_for(
        browser, "the decision among the recent cells",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#recent li[data-node-id="{stored["node_id"]}"]'),
    )  # fmt: skip
    assert "1 hop" in recent.text
    browser.find_element(By.CSS_SELECTOR, '.tabs button[data-tab="search"]').click()
    browser.find_element(By.ID, "search-query").send_keys("which database do we use for storage")
    browser.find_element(By.CSS_SELECTOR, "#search-form button[type=submit]").click()
    found = wait_for(
        browser, "the decision among the search results",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#search-results li[data-node-id="{stored["node_id"]}"]'),
    )  # fmt: skip
    assert DECISION in found.text
    browser.save_screenshot(str(screenshots / "dashboard-search.png"))
    browser.find_element(By.CSS_SELECTOR, '.tabs button[data-tab="beacons"]').click()
    wait_for(browser, "B's beacon", lambda d: d.find_element(By.CSS_SELECTOR, f'#beacons li[data-beacon-id="{beacon["beacon_id"]}"]'))

    # A reload keeps the session (same tab) and replays the inbox from the stream.
    browser.refresh()
    wait_for(
        browser, "the inbox after a reload",
        lambda d: d.find_element(By.CSS_SELECTOR, f'#inbox li[data-node-id="{stored["node_id"]}"]'),
    )  # fmt: skip

    # With the data dir's admin token too, the inbox is every agent's on this node, naming the agent.
    browser.find_element(By.ID, "sign-out").click()
    wait_for(browser, "the sign-in form", lambda d: d.find_element(By.ID, "key").is_displayed())
    browser.find_element(By.CSS_SELECTOR, "#login-form summary").click()
    browser.find_element(By.ID, "admin-token").send_keys(b.admin_token())
    sign_in(browser, b_key)
    item = wait_for(
        browser, "the node-wide inbox naming B's agent",
        lambda d: (found := d.find_element(By.CSS_SELECTOR, f'#inbox li[data-node-id="{stored["node_id"]}"]'))
        and "for agent-b" in found.text and found,
    )  # fmt: skip
    assert DECISION in item.text
    assert browser.find_element(By.ID, "inbox-title").text == "Every agent's inbox on this node"
    browser.save_screenshot(str(screenshots / "dashboard-admin.png"))

    # On A's own page (another origin, so another sessionStorage), B is the peer the batch went to.
    browser.get(f"{a.api_url}/")
    sign_in(browser, a_key)
    wait_for(
        browser, "B's row on A's page counting the batch sent to it",
        lambda d: int(d.find_element(By.CSS_SELECTOR, f'#peers tr[data-node-id="{b.node_id}"] td:nth-child(5)').text) >= 1,
    )  # fmt: skip
    browser.find_element(By.CSS_SELECTOR, '.tabs button[data-tab="counters"]').click()
    wait_for(browser, "the store among A's counters", lambda d: "hyphae_stores_total" in d.find_element(By.ID, "counters").text)
    browser.save_screenshot(str(screenshots / "dashboard-sender.png"))
