"""The agent web UI in a real headless Chromium driven by Selenium: a scripted run shows its tool
card, an approval click lets the call run, a deny click blocks it, a card's retry button starts a
run from that step with the steps before it shown as replayed.  Skips when no Chromium or
chromedriver is installed (CI installs the system packages: ``.ci/run``).

``AGENTIC_JAX_UI_SCREENSHOT=docs/ui.png`` also saves the approval test's screenshot there."""

import os
import shutil
from pathlib import Path

import pytest
from ui_server import serving

from agentic_jax.agents.policies.base import ScriptedPolicy
from agentic_jax.agents.session import AgentConfig
from agentic_jax.agents.ui.app import ui_app
from agentic_jax.agents.ui.runs import agent_work

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip(
        "no Chromium and chromedriver on PATH (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )

TASK = "What is 17 * 23?"
HOSTILE = '<img src=x onerror="window.injected = 1">'
SCRIPT = [
    {
        "text": "Let me compute it. " + HOSTILE,
        "tool_calls": [{"name": "calculator", "arguments": {"expression": "17 * 23"}}],
    },
    "17 * 23 = 391.",
]


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1100,900")
    # The system chromedriver: Selenium Manager must not download one.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def page(browser, tmp_path, approval, script=SCRIPT):
    """Serves a scripted agent whose calculator has approval tier ``approval`` and opens it."""
    policy = ScriptedPolicy(script)
    config = AgentConfig(policy=policy, tools=["calculator"], approval={"calculator": approval})
    app = ui_app(agent_work(config, policy), trace_path=tmp_path / "trace.jsonl", task=TASK)
    return serving(app)


def wait_for(browser, condition, timeout_s: float = 20.0):
    return WebDriverWait(browser, timeout_s).until(condition)


def run_task(browser, url: str):
    browser.get(url)
    assert browser.find_element(By.ID, "task").get_attribute("value") == TASK
    browser.find_element(By.ID, "run").click()
    return wait_for(browser, ec.presence_of_element_located((By.CSS_SELECTOR, ".card")))


def card_status(status: str):
    return ec.presence_of_element_located((By.CSS_SELECTOR, f'.card[data-status="{status}"]'))


def test_a_scripted_run_shows_its_tool_card(browser, tmp_path):
    with page(browser, tmp_path, "auto") as url:
        run_task(browser, url)
        card = wait_for(browser, card_status("ok"))
        wait_for(browser, ec.presence_of_element_located((By.ID, "run-end")))
        assert card.find_element(By.CLASS_NAME, "card-name").text == "calculator"
        assert '"expression": "17 * 23"' in card.find_element(By.CLASS_NAME, "card-args").text
        assert card.find_element(By.CLASS_NAME, "card-result").text == "391"
        assert "ok" in card.find_element(By.CLASS_NAME, "card-meta").text
        turns = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".assistant .text")]
        # The model's markup is shown as text, never run as HTML.
        assert turns[0] == "Let me compute it. " + HOSTILE
        assert browser.execute_script("return window.injected") is None
        assert "391" in browser.find_element(By.ID, "run-end").text
        browser.find_element(By.ID, "trace-link").click()
        browser.switch_to.window(browser.window_handles[-1])
        items = wait_for(
            browser, ec.presence_of_all_elements_located((By.CSS_SELECTOR, "#trace li"))
        )
        assert any("calculator ok" in item.text for item in items)
        browser.close()
        browser.switch_to.window(browser.window_handles[0])


def test_an_approval_click_lets_the_call_run(browser, tmp_path):
    with page(browser, tmp_path, "ask") as url:
        card = run_task(browser, url)
        wait_for(browser, ec.element_to_be_clickable((By.CSS_SELECTOR, ".card .approve")))
        assert card.get_attribute("data-status") == "awaiting_approval"
        assert not card.find_element(By.CLASS_NAME, "card-result").is_displayed()
        browser.save_screenshot(str(tmp_path / "ui_awaiting_approval.png"))
        card.find_element(By.CLASS_NAME, "approve").click()
        wait_for(browser, card_status("ok"))
        wait_for(browser, ec.presence_of_element_located((By.ID, "run-end")))
        assert card.find_element(By.CLASS_NAME, "card-result").text == "391"
        assert "approved (user)" in card.find_element(By.CLASS_NAME, "approval").text
        shot = tmp_path / "ui.png"
        browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        target = os.environ.get("AGENTIC_JAX_UI_SCREENSHOT")
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, target)


def test_a_deny_click_blocks_the_call(browser, tmp_path):
    with page(browser, tmp_path, "ask") as url:
        card = run_task(browser, url)
        wait_for(browser, ec.element_to_be_clickable((By.CSS_SELECTOR, ".card .deny"))).click()
        wait_for(browser, ec.presence_of_element_located((By.ID, "run-end")))
        assert card.get_attribute("data-status") == "denied"
        result = card.find_element(By.CLASS_NAME, "card-result").text
        assert result == "error: the call to 'calculator' was not approved"
        assert "denied (user)" in card.find_element(By.CLASS_NAME, "approval").text


def test_a_cards_retry_button_reruns_from_that_call_with_the_steps_before_replayed(
    browser, tmp_path
):
    def calculate(expression):
        return {
            "text": "",
            "tool_calls": [{"name": "calculator", "arguments": {"expression": expression}}],
        }

    script = [calculate("17 * 23"), calculate("391 + 1"), "392.", "392, again."]
    with page(browser, tmp_path, "auto", script) as url:
        run_task(browser, url)
        wait_for(browser, ec.presence_of_element_located((By.ID, "run-end")))
        first_cards = browser.find_elements(By.CSS_SELECTOR, ".card")
        assert len(first_cards) == 2
        first_cards[1].find_element(By.CLASS_NAME, "retry-step").click()
        wait_for(browser, lambda b: len(b.find_elements(By.CSS_SELECTOR, ".end")) == 2)
        retry = browser.find_element(By.CSS_SELECTOR, ".entry.retry .text").text
        assert retry.endswith("from step 2 call 0")
        cards = browser.find_elements(By.CSS_SELECTOR, ".card")[2:]
        replayed, live = cards
        assert "replayed" in replayed.get_attribute("class")
        assert "replayed" in replayed.find_element(By.CLASS_NAME, "label").text.lower()
        assert replayed.find_element(By.CLASS_NAME, "card-result").text == "391"
        assert "replayed" not in live.get_attribute("class")
        assert live.get_attribute("data-status") == "ok"
        assert live.find_element(By.CLASS_NAME, "card-result").text == "392"
        turns = browser.find_elements(By.CSS_SELECTOR, ".assistant")[3:]
        assert ["replayed" in t.get_attribute("class") for t in turns] == [True, True, False]
        assert turns[-1].find_element(By.CLASS_NAME, "text").text == "392, again."
        assert browser.find_elements(By.CSS_SELECTOR, ".end")[-1].text.endswith("392, again.")
