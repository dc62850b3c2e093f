"""The web page of `aiayn serve` end to end in a real browser: Debian's chromium driven by
Selenium through the system chromedriver (`make test` installs both with apt-get).

Open the page, type a sentence, check that the translation and a heatmap appear, switch
the attention kind, and save a screenshot. ``AIAYN_SERVE_MODEL`` picks another model
directory (default: the small sample model) and ``AIAYN_SCREENSHOT`` a path to copy the
screenshot to (the README's picture: docs/serve_screenshot.png). With
``AIAYN_NO_SKIPS=1`` (set by ``.ci/run``, which runs as root and so can install them) or
``AIAYN_REQUIRE_BROWSER=1`` a missing browser fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# AIAYN_NO_SKIPS=1 (CI, conftest.py) requires the browser as AIAYN_REQUIRE_BROWSER=1 does.
if "1" not in (os.environ.get("AIAYN_REQUIRE_BROWSER"), os.environ.get("AIAYN_NO_SKIPS")):
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")

from aiayn.checkpoint import load_model, resolve_checkpoint
from aiayn.translator import Translator
from serve_util import live_server

pytestmark = pytest.mark.timeout(180)
REQUIRED = "1" in (os.environ.get("AIAYN_REQUIRE_BROWSER"), os.environ.get("AIAYN_NO_SKIPS"))

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SENTENCE = "Ein Hund rennt über die Wiese."


def _browser(tmp_path):
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package")
    if missing and REQUIRED:
        pytest.fail(f"the browser test is required but {', '.join(missing)} not installed")
    if missing:
        message = (
            f"BROWSER TEST SKIPPED: {', '.join(missing)} not installed "
            "(`make test` installs chromium and chromium-driver with apt-get when run as root)"
        )
        print("\n" + "!" * 80 + f"\n{message}\n" + "!" * 80, file=sys.stderr)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1000,860",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


def test_page_translates_and_draws_attention(sample_model_dir, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import Select, WebDriverWait

    model_dir = os.environ.get("AIAYN_SERVE_MODEL") or sample_model_dir()
    translator = Translator(*load_model(resolve_checkpoint(model_dir)))
    expected = translator.translate([SENTENCE], beam=4)[0][0]
    source_pieces = len(translator.encode(SENTENCE))
    driver = _browser(tmp_path)
    try:
        with live_server(translator) as base:
            driver.set_page_load_timeout(30)
            driver.get(base + "/")
            assert "aiayn" in driver.title
            driver.find_element(By.ID, "src").send_keys(SENTENCE)
            driver.find_element(By.ID, "go").click()
            wait = WebDriverWait(driver, 60)
            wait.until(EC.text_to_be_present_in_element((By.ID, "translation"), expected[:3]))
            assert driver.find_element(By.ID, "translation").text == expected
            canvas = driver.find_element(By.ID, "heatmap")
            wait.until(lambda d: canvas.get_attribute("data-rows"))
            # Encoder-decoder attention: one row per output piece plus EOS, one column per
            # source piece; and the cells are painted (not the white background).
            assert int(canvas.get_attribute("data-cols")) == source_pieces
            assert canvas.size["width"] > 100 and canvas.size["height"] > 100
            coloured = driver.execute_script(
                """const c = document.getElementById('heatmap');
                   const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                   let n = 0;
                   for (let i = 0; i < d.length; i += 4)
                     if (!(d[i] > 240 && d[i + 1] > 240 && d[i + 2] > 240)) n++;
                   return n;"""
            )
            assert coloured > 2000, coloured
            layers = Select(driver.find_element(By.ID, "layer"))
            heads = Select(driver.find_element(By.ID, "head"))
            assert len(layers.options) == translator.model.cfg.decoder_layers
            assert len(heads.options) == translator.model.cfg.n_heads + 1  # + their mean
            Select(driver.find_element(By.ID, "kind")).select_by_value("encoder")
            wait.until(lambda d: canvas.get_attribute("data-rows") == str(source_pieces))
            assert canvas.get_attribute("data-cols") == str(source_pieces)
            Select(driver.find_element(By.ID, "kind")).select_by_value("cross")
            heads.select_by_index(0)
            shot = tmp_path / "serve_screenshot.png"
            assert driver.save_screenshot(str(shot))
            assert shot.stat().st_size > 10_000
            assert driver.find_element(By.ID, "status").text == ""  # no error shown
    finally:
        driver.quit()
    if os.environ.get("AIAYN_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["AIAYN_SCREENSHOT"])


def test_page_errors_fallbacks_and_a_non_ascii_key(sample_model_dir, tmp_path):
    """What the page did wrong: a blank source (attention null) left the old heatmap up
    and the selects threw; an error left the old result on screen; a server whose limits
    refuse attention maps translated nothing; a non-ASCII API key never matched (fetch
    sends header bytes as ISO-8859-1); an empty beam box was sent as beam 0."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    from aiayn.serve import ServeConfig

    translator = Translator(*load_model(resolve_checkpoint(sample_model_dir())))
    expected = translator.translate([SENTENCE], beam=4)[0][0]
    driver = _browser(tmp_path)

    def send(text: str, beam: str = "4") -> None:
        driver.execute_script("document.getElementById('status').textContent = '…';")
        for field, value in (("src", text), ("beam", beam)):
            driver.find_element(By.ID, field).clear()
            if value:
                driver.find_element(By.ID, field).send_keys(value)
        driver.find_element(By.ID, "go").click()
        WebDriverWait(driver, 60).until(
            lambda d: (
                d.find_element(By.ID, "status").text != "translating…"
                and d.find_element(By.ID, "go").is_enabled()
                and d.find_element(By.ID, "status").text != "…"
            )
        )

    def shown(element: str) -> bool:
        return driver.find_element(By.ID, element).is_displayed()

    try:
        key = "schlüssel-ключ"
        with live_server(translator, ServeConfig(api_key=key)) as base:
            driver.get(base + "/")
            driver.execute_script(
                "window.errors = []; addEventListener('error', (e) => errors.push(e.message));"
            )
            WebDriverWait(driver, 30).until(EC.visibility_of_element_located((By.ID, "key")))
            driver.find_element(By.ID, "key").send_keys(key)
            send(SENTENCE, beam="")  # empty: the model's beam (4), not beam 0
            assert driver.find_element(By.ID, "status").text == ""
            assert driver.find_element(By.ID, "translation").text == expected
            assert shown("maps")
            send("\u200b")  # a blank source: a translation, no attention map
            assert shown("result") and not shown("maps")
            driver.execute_script(  # hidden now; its handler threw on the null map
                "const k = document.getElementById('kind'); k.value = 'encoder';"
                "k.dispatchEvent(new Event('change'));"
            )
            send("Ein Hund " * 40)  # over the model's positions: a 422
            assert driver.find_element(By.ID, "status").text.startswith("error: src.0:")
            assert not shown("result")
            assert driver.execute_script("return errors;") == []
        with live_server(translator, ServeConfig(max_attention_sentences=0)) as base:
            driver.get(base + "/")
            send(SENTENCE)
            status = driver.find_element(By.ID, "status").text
            assert status.startswith("no attention map: attention:"), status
            assert driver.find_element(By.ID, "translation").text == expected
            assert shown("result") and not shown("maps")
    finally:
        driver.quit()


def test_page_waits_out_a_full_queue(sample_model_dir, tmp_path):
    """A 429 (the queue is full) names in Retry-After when to send again: the page waits
    that long, saying so, and sends again, instead of showing an error."""
    import threading

    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from aiayn.serve import ServeConfig
    from serve_util import ControlledTranslator

    translator = ControlledTranslator(*load_model(resolve_checkpoint(sample_model_dir())))
    expected = translator.translate([SENTENCE])[0][0]
    driver = _browser(tmp_path)
    cfg = ServeConfig(worker="thread", max_queue=1, batch_wait_ms=0)
    answers: list[int] = []
    threads = []

    def post(base: str, text: str) -> None:
        answers.append(
            httpx.post(f"{base}/translate", json={"src": [text]}, timeout=60).status_code
        )

    try:
        with live_server(translator, cfg) as base:
            driver.get(base + "/")
            translator.gate.clear()
            translator.entered.clear()
            for text in ("Ein Hund.", "Eine Katze."):  # one running at the gate, one queued
                threads.append(threading.Thread(target=post, args=(base, text)))
                threads[-1].start()
                if len(threads) == 1:
                    assert translator.entered.wait(10), "the worker never took the request"
            wait = WebDriverWait(driver, 30)
            wait.until(lambda d: "aiayn_queue_sentences 1" in httpx.get(f"{base}/metrics").text)
            driver.find_element(By.ID, "src").send_keys(SENTENCE)
            driver.find_element(By.ID, "go").click()
            wait.until(lambda d: "busy" in d.find_element(By.ID, "status").text)
            status = driver.find_element(By.ID, "status").text
            assert status == "the server is busy: trying again in 1 s…", status
            translator.gate.set()
            wait.until(lambda d: d.find_element(By.ID, "translation").text == expected)
            assert driver.find_element(By.ID, "status").text == ""
            for thread in threads:
                thread.join(30)
            assert answers == [200, 200]
    finally:
        translator.gate.set()
        driver.quit()
