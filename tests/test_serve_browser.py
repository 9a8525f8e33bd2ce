"""The chat page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which scripts/test.sh installs) driven by Selenium against the real server
(``served``). With the key and the taught tool entered in the settings, a user message gets the
model's call shown as a call, the function's response shown as one, then the answer; and an answer
streamed in four pieces (a stubbed fetch: how many the real server sends depends on the load) is put
together in one bubble. The screenshot is kept in tests/artifacts/ (git-ignored) and the test's tmp dir."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from codechat.tools import load_executors

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver):
        reason = ("headless Chromium is not installed here and could not be (scripts/test.sh installs it with "
                  "apt-get install chromium chromium-driver where apt runs as root)")
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,900",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    d = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield d
    finally:
        d.quit()


def test_the_chat_page_shows_the_call_its_response_and_a_streamed_answer(served, browser, funcall_stage, tmp_path):
    try:
        converse(served, browser, funcall_stage, tmp_path)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "serve_chat_failed.png"))
        print(f"the page at the failure: {ARTIFACTS / 'serve_chat_failed.png'}; browser log: {browser.get_log('browser')}")
        raise


def converse(served, d, funcall_stage, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    [tool] = load_executors(funcall_stage[1])
    d.get(served.url + "/")
    d.find_element(By.CSS_SELECTOR, "#settings summary").click()
    d.find_element(By.ID, "api-key").send_keys(served.api_key)
    d.find_element(By.ID, "temperature").clear()
    d.find_element(By.ID, "temperature").send_keys("0")
    d.execute_script("document.getElementById('tools').value = arguments[0];"
                     "document.getElementById('api-key').dispatchEvent(new Event('change'));",
                     json.dumps([tool.schema()]))
    wait = WebDriverWait(d, 60)
    wait.until(lambda d: d.find_element(By.ID, "model").text == "codechat · context 256 tokens")
    d.find_element(By.CSS_SELECTOR, "#settings summary").click()  # folded away: the conversation fills the page

    def say(text: str) -> None:
        d.find_element(By.ID, "input").send_keys(text)
        d.find_element(By.ID, "send").click()

    def done() -> list:
        return d.find_elements(By.CSS_SELECTOR, ".msg[data-done=true]")

    say("Weather in Tokyo?")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".call"))
    assert d.find_element(By.CSS_SELECTOR, ".call .text").text == 'weather({"city":"Tokyo"})'
    assert "finish: tool_calls" in d.find_element(By.CSS_SELECTOR, ".call .finish").text
    assert d.find_element(By.ID, "error").get_attribute("hidden") is not None
    wait.until(lambda d: len(done()) == 1 and d.find_element(By.ID, "send").is_enabled())
    assert d.find_element(By.ID, "input").get_attribute("placeholder").startswith("The response of weather")
    say('{"temp_c": 21}')
    wait.until(lambda d: len(done()) == 2)
    assert d.find_element(By.CSS_SELECTOR, ".response .text").text == '{"temp_c": 21}'
    answer = done()[-1]
    assert answer.find_element(By.CSS_SELECTOR, ".text").text == "It is 21 C in Tokyo."
    # in how many pieces the server sends it depends on how fast the reader keeps up (a slow one gets bigger
    # pieces, codechat.serve.worker.Job.events): under load one or two; the page's handling of pieces is below
    assert answer.get_attribute("data-finish") == "stop" and int(answer.get_attribute("data-chunks")) >= 1
    assert [e.text for e in d.find_elements(By.CSS_SELECTOR, ".msg .role")] == \
        ["YOU", "FUNCTION CALL", "FUNCTION RESPONSE", "ASSISTANT"]
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "serve_chat.png"
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    shutil.copy(shot, tmp_path / shot.name)
    print(f"screenshot: {shot} (and {tmp_path / shot.name})")
    # an answer streamed in four pieces (the server's fetch replaced by a stream of four content deltas, a finish
    # and [DONE], all in one read): the page puts the pieces together in one bubble and counts each
    d.execute_script("""
        const events = ["Four", " pieces", " of", " text."].map((p) => ({choices: [{index: 0, delta: {content: p}}]}));
        events.push({choices: [{index: 0, delta: {}, finish_reason: "stop"}]});
        const body = events.map((e) => "data: " + JSON.stringify(e) + "\\n\\n").join("") + "data: [DONE]\\n\\n";
        window.fetch = async () => new Response(body, {status: 200, headers: {"Content-Type": "text/event-stream"}});
    """)
    say("Again?")
    wait.until(lambda d: len(done()) == 3)
    answer = done()[-1]
    assert answer.find_element(By.CSS_SELECTOR, ".text").text == "Four pieces of text."
    assert answer.get_attribute("data-finish") == "stop" and answer.get_attribute("data-chunks") == "4"
