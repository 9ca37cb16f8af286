"""The web page at /: one self-contained HTML file (no URL outside the page), and the page driven in
headless Chromium through Selenium against the real server: the translation, the n-best list, the
attention heatmap's pixels, an error message, and a phone-sized window without horizontal scroll."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
IDS = {"source-text", "pair", "translate", "translation", "nbest", "heatmap", "sentence", "error"}
SENTENCE = "A man is riding a bicycle."
LONG = "Two young girls in colorful dresses are playing with a small brown dog in the sand near the water."


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.tags = set(), [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        self.links += [attrs[name] for name in ("src", "href", "action") if attrs.get(name)]


def test_page_is_self_contained():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from onmt_lite.serve.app import Limits, create_app
    from onmt_lite.serve.config import ModelSpec
    from onmt_lite.serve.models import Registry

    registry = Registry([ModelSpec(0, MODEL, {}, "en", "de", load=False)])
    with TestClient(create_app(registry, Limits())) as client:
        response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    page = _Page()
    page.feed(html)
    assert IDS <= page.ids, f"ids missing: {IDS - page.ids}"
    assert not re.search(r"https?:|url\(|@import", html, re.I), "the page names an outside resource"
    outside = [link for link in page.links
               if not link.startswith("data:") and (":" in link or link.startswith("//"))]
    assert not outside, f"the page links outside itself: {outside}"
    assert not [attrs for tag, attrs in page.tags if tag == "script" and "src" in attrs]
    assert not [attrs for tag, attrs in page.tags if tag == "link" and attrs.get("rel") != "icon"]
    assert any(tag == "meta" and attrs.get("name") == "viewport" for tag, attrs in page.tags)
    assert len(html.splitlines()) < 300


# -- the real server and a real browser ----------------------------------------------------------

def _status(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def _post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--force-device-scale-factor=1", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "onmt_lite", "serve", "-model", MODEL,
                                 "-src_lang", "en", "-tgt_lang", "de", "-port", str(port), "-lanes", "1"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while _status(url + "/ready") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server did not get ready (exit {proc.poll()}):\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


HEATMAP = """
const c = document.getElementById("heatmap"), ctx = c.getContext("2d"), d = c.dataset;
const dpr = c.width / c.clientWidth, px = ctx.getImageData(0, 0, c.width, c.height).data;
const at = (x, y) => { const i = 4 * (Math.round(y * dpr) * c.width + Math.round(x * dpr));
                       return px[i] + px[i + 1] + px[i + 2]; };
const colors = new Set();
for (let i = 0; i < px.length; i += 4) colors.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
const g = {left: +d.left, top: +d.top, cell: +d.cell, cols: +d.cols, rows: +d.rows};
let dark = 0, labels = 0;  // dark pixels in the label margins: the tokens' names
for (let y = 0; y < c.clientHeight; y++) for (let x = 0; x < c.clientWidth; x++)
  if ((x < g.left || y < g.top) && at(x, y) < 450) labels++;
const cells = [];
for (let y = 0; y < g.rows; y++) { const row = []; cells.push(row);
  for (let x = 0; x < g.cols; x++) row.push(at(g.left + (x + .5) * g.cell, g.top + (y + .5) * g.cell)); }
return {...g, width: c.width, height: c.height, cssWidth: c.clientWidth, cssHeight: c.clientHeight,
        dpr, colors: colors.size, labels, cells};
"""


def _check_heatmap(driver, sentence):
    """The canvas is one cell per (target, source) token pair, labelled, and darkest where the
    attention is highest."""
    picture = driver.execute_script(HEATMAP)
    src, tgt, attention = sentence["source_tokens"], sentence["target_tokens"], sentence["attention"]
    assert (picture["cols"], picture["rows"]) == (len(src), len(tgt)) == (len(attention[0]), len(attention))
    assert picture["cssWidth"] == picture["left"] + len(src) * picture["cell"]
    assert picture["cssHeight"] == picture["top"] + len(tgt) * picture["cell"]
    assert picture["width"] == round(picture["cssWidth"] * picture["dpr"]) > 0
    assert picture["cell"] >= 16 and picture["left"] > 0 and picture["top"] > 0
    assert picture["colors"] >= 10, "the heatmap is (nearly) blank"
    assert picture["labels"] >= 20 * len(src + tgt), "the token labels are missing"
    for row, brightness in zip(attention, picture["cells"]):
        assert brightness[row.index(max(row))] == min(brightness)
        assert brightness[row.index(min(row))] == max(brightness)
        assert max(brightness) > 3 * 220 and min(brightness) < 3 * 200


def _open(driver, url, width, height):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.set_window_size(width, height)
    driver.get(url + "/")
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "translate").is_enabled())
    return driver.find_element(By.ID, "source-text")


def _wait_translation(driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    text = lambda d: d.find_element(By.ID, "translation").get_property("textContent")  # noqa: E731
    WebDriverWait(driver, 30).until(lambda d: text(d) and d.find_element(By.ID, "translate").is_enabled())
    return text(driver)


def test_page_translates_in_a_browser(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    box = _open(browser, server, 1280, 900)
    assert Select(browser.find_element(By.ID, "pair")).first_selected_option.text == "English → German"
    box.send_keys(SENTENCE)
    browser.find_element(By.ID, "translate").click()
    translation = _wait_translation(browser)

    expected = _post(server + "/translate", {"q": SENTENCE, "source": "en", "target": "de"})
    assert translation == expected["translatedText"]
    inspected = _post(server + "/inspect", {"q": SENTENCE, "source": "en", "target": "de", "n_best": 5})
    items = [(li.find_element(By.CLASS_NAME, "text").get_property("textContent"),
              float(li.find_element(By.CLASS_NAME, "score").get_property("textContent")))
             for li in browser.find_elements(By.CSS_SELECTOR, "#nbest li")]
    assert len(items) == len(inspected["nbest"]) > 1
    assert items[0][0] == translation
    for (text, score), hyp in zip(items, inspected["nbest"]):
        assert text == hyp["text"] and score == pytest.approx(hyp["score"], abs=1e-3)
    assert browser.find_element(By.ID, "error").get_property("textContent") == ""
    assert not browser.find_element(By.ID, "sentence").is_displayed()  # one line: no selector
    _check_heatmap(browser, inspected["sentences"][0])

    # The server's error message is shown, and the old results are gone.
    browser.execute_script("document.getElementById('source-text').value = 'a '.repeat(2600)")
    browser.find_element(By.ID, "translate").click()
    error = browser.find_element(By.ID, "error")
    WebDriverWait(browser, 20).until(lambda d: error.get_property("textContent"))
    assert "-max_chars" in error.text and error.is_displayed()
    assert browser.find_element(By.ID, "translation").get_property("textContent") == ""
    assert browser.find_elements(By.CSS_SELECTOR, "#nbest li") == []


def test_page_fits_a_phone(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    box = _open(browser, server, 390, 844)
    assert browser.execute_script("return window.innerWidth") <= 400
    box.send_keys(SENTENCE + "\n" + LONG)
    box.send_keys(Keys.CONTROL, Keys.ENTER)  # Ctrl+Enter translates
    translation = _wait_translation(browser)
    assert translation.count("\n") == 1

    selector = Select(browser.find_element(By.ID, "sentence"))
    assert browser.find_element(By.ID, "sentence").is_displayed()
    assert [o.text for o in selector.options] == [f"1: {SENTENCE}", f"2: {LONG}"]
    selector.select_by_index(1)
    inspected = _post(server + "/inspect", {"q": SENTENCE + "\n" + LONG, "source": "en", "target": "de",
                                          "n_best": 5})
    _check_heatmap(browser, inspected["sentences"][1])

    widths = browser.execute_script(
        "const s = document.querySelector('.scroll'); return [innerWidth, "
        "document.documentElement.scrollWidth, document.body.scrollWidth, s.scrollWidth, s.clientWidth]")
    inner, page, body, canvas, frame = widths
    assert page <= inner and body <= inner, f"the page scrolls sideways: {widths}"
    assert canvas > frame, "the wide heatmap scrolls inside its frame"
