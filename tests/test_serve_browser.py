"""`seq2seq-serve` end to end: the real command serving a reproduction folder of two tiny
trained arms (none, bahdanau) on a free loopback port, over HTTP and in Debian's headless
Chromium (Selenium with chromium-driver; `make system` installs both, nothing is
downloaded). The browser test saves test-artifacts/serve.png."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_translate import trained_run

from seq2seq.inference.translator import Translator

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"
SENTENCE = "el perro come pan y el gato bebe agua"


@pytest.fixture(scope="module")
def arms(tiny_train_overrides: list[str], tmp_path_factory) -> dict[str, Path]:
    """A seq2seq-reproduce-like folder: arms/none and arms/bahdanau, tiny trained runs."""
    root = tmp_path_factory.mktemp("reproduction")
    runs = {"bahdanau": trained_run(tuple(tiny_train_overrides)),
            "none": trained_run((*tiny_train_overrides, "model/attention=none"))}
    (root / "arms").mkdir()
    for name, run in runs.items():
        (root / "arms" / name).symlink_to(run, target_is_directory=True)
    return {"root": root, **runs}


@pytest.fixture(scope="module")
def server(arms: dict[str, Path]) -> Iterator[str]:
    """`seq2seq-serve reproduction=<folder> port=0`; yields its URL, then stops it with
    SIGINT as Ctrl-C would: uvicorn shuts down cleanly and the command exits 130."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from seq2seq.cli import serve_main; serve_main()",
         f"reproduction={arms['root']}", "port=0", "beam=3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()  # printed once the models are loaded and the port bound
    match = re.search(r"on (http://127\.0\.0\.1:\d+/)", line)
    if not match:
        proc.kill()
        pytest.fail(f"seq2seq-serve did not start: {line!r} {proc.stderr.read()}")
    yield match.group(1)
    proc.send_signal(signal.SIGINT)
    code, err = proc.wait(30), proc.stderr.read()
    assert code == 130 and err.endswith("interrupted\n") and "Traceback" not in err, err


def get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as answer:
        return json.load(answer)


def test_command_serves_the_arms_over_http(server: str, arms: dict[str, Path]) -> None:
    models = get(server + "v1/models")["models"]
    assert [(m["name"], m["attention"], m["alignment"]) for m in models] == [
        ("none", "none", False), ("bahdanau", "bahdanau", True)]
    assert models[1]["training"]["steps"] == 150 and models[1]["runs"] == [str(arms["root"] / "arms" / "bahdanau")]
    out = get(server + "v1/translate", {"sentences": [SENTENCE], "beam": 3})["outputs"]
    for output in out:  # the same answer as the Python API gives
        [expected] = Translator.from_run(arms[output["model"]]).translate([SENTENCE], beam=3)
        assert output["sentences"][0]["hypotheses"][0]["text"] == expected.text


# ---------------------------------------------------------------- the page in Chromium


def browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    if not chromium or not Path(driver).is_file():
        pytest.skip("Debian's chromium and chromium-driver are not installed: `make system` "
                    "installs them (apt-get install chromium chromium-driver)")
    pytest.importorskip("selenium", reason="selenium is in the dev extra: pip install -e '.[dev]'")
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    chromium, driver_path = browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--lang=en-US"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    yield driver
    driver.quit()


@pytest.mark.browser
def test_the_page_translates_draws_heatmaps_and_highlights(server: str, browser) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    d, wait = browser, WebDriverWait(browser, 30)
    d.get(server)
    wait.until(lambda _: d.find_element(By.ID, "loaded").text.startswith("Loaded: none"))
    for field in ("source", "beam", "nbest"):  # every control has a label
        assert d.find_element(By.CSS_SELECTOR, f'label[for="{field}"]').text
    source = d.find_element(By.ID, "source")
    source.clear()
    source.send_keys(SENTENCE)
    source.send_keys(Keys.TAB)  # keyboard order: the sentence, beam, n-best, Translate
    assert d.switch_to.active_element.get_attribute("id") == "beam"
    d.find_element(By.ID, "nbest").clear()
    d.find_element(By.ID, "nbest").send_keys("2")
    d.find_element(By.ID, "go").click()
    wait.until(lambda _: len(d.find_elements(By.CSS_SELECTOR, "article.model")) == 2)

    cards = {c.get_attribute("data-model"): c for c in d.find_elements(By.CSS_SELECTOR, "article.model")}
    assert list(cards) == ["none", "bahdanau"]  # side by side, the baseline first
    for card in cards.values():
        assert card.find_element(By.CSS_SELECTOR, ".best").text.strip()
        assert len(card.find_elements(By.CSS_SELECTOR, ".nbest li")) == 2
        assert card.find_element(By.CSS_SELECTOR, "button.copy").get_attribute("aria-label")
    none, bahdanau = cards["none"], cards["bahdanau"]
    assert "One fixed vector, no alignment" in none.find_element(By.CSS_SELECTOR, ".no-align").text
    assert not none.find_elements(By.CSS_SELECTOR, "table.heat")

    src = bahdanau.find_elements(By.CSS_SELECTOR, ".tok.src")
    tgt = bahdanau.find_elements(By.CSS_SELECTOR, ".tok.tgt")
    cells = bahdanau.find_elements(By.CSS_SELECTOR, "table.heat td[data-i]")
    assert len(src) >= len(SENTENCE.split())  # subwords: at least one per word
    assert len(tgt) > 0 and len(cells) == len(src) * len(tgt)

    ActionChains(d).move_to_element(tgt[0]).perform()  # target -> its source subwords
    wait.until(lambda _: bahdanau.find_elements(By.CSS_SELECTOR, ".tok.src.hl"))
    assert "on" in tgt[0].get_attribute("class")
    assert bahdanau.find_elements(By.CSS_SELECTOR, 'td.hl[data-i="0"]')
    assert bahdanau.find_element(By.CSS_SELECTOR, ".align-desc").text.startswith(tgt[0].text)
    ActionChains(d).move_to_element(src[1]).perform()  # and the reverse
    wait.until(lambda _: bahdanau.find_elements(By.CSS_SELECTOR, ".tok.tgt.hl"))
    assert not bahdanau.find_elements(By.CSS_SELECTOR, ".tok.src.hl")
    ActionChains(d).move_to_element(tgt[0]).perform()

    ARTIFACTS.mkdir(exist_ok=True)
    assert d.save_screenshot(str(ARTIFACTS / "serve.png"))
    d.set_window_size(390, 844)  # a phone: the page fits, the heatmap scrolls in its box
    assert d.execute_script("return document.documentElement.scrollWidth") <= 390
    d.save_screenshot(str(ARTIFACTS / "serve-phone.png"))
