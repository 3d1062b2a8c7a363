"""The chat page of `infer serve` (GET /) in a real browser: headless Chromium, driven by
Playwright, against the real server routes and the embedded model, served in-process by uvicorn."""
from __future__ import annotations

import json
import re
import shutil
import socket
import threading
import time
import urllib.request

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("needs Chromium (apt-get install chromium)", allow_module_level=True)

import uvicorn  # noqa: E402
from playwright.sync_api import expect  # noqa: E402
from starlette.applications import Starlette  # noqa: E402

from infer.cli.server import webui  # noqa: E402
from infer.cli.server.openai_server import ServerConfig, create_app  # noqa: E402

pytestmark = pytest.mark.browser  # every test drives Chromium

MODEL = "gemma-3-270m-q4_k_m"
KEY = "sk-webui-test"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_app(llm, config: ServerConfig) -> Starlette:
    """The server's app as `infer serve` builds it (GET / is the page for a browser)."""
    return create_app(llm, config)


class Served:
    """uvicorn in a thread; the engine is started by the fixture (a mounted app's lifespan does not run)."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.time() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def get(self, path: str, headers: dict | None = None):
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


@pytest.fixture(scope="module")
def llm(gemma_path):
    from infer.engine.engine import EngineConfig
    from infer.engine.llm import LLM

    model = LLM.load(gemma_path, EngineConfig(n_ctx=1024, n_threads=2, max_seqs=2))
    model.engine.start()
    yield model
    model.engine.stop()


@pytest.fixture(scope="module")
def served(llm):
    s = Served(page_app(llm, ServerConfig(model_id=MODEL)))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, served):
    """A fresh browser profile (empty localStorage) on the page; fails on any script or CSP error."""
    ctx = browser.new_context(viewport=DESKTOP, accept_downloads=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.goto(served.url)
    pg.wait_for_selector("#model option", state="attached")
    yield pg
    ctx.close()
    assert not errors, errors


def set_fields(page, **values) -> None:
    for name, value in values.items():
        page.fill(f"#{name}", str(value))


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def wait_done(page, timeout: float = 30_000) -> None:
    """Until the running reply has ended (the Stop button gone, stats or a notice shown)."""
    page.wait_for_selector("#stop", state="hidden", timeout=timeout)


def running(served) -> int:
    return json.loads(served.get("/health")[2])["running"]


def last_reply(page) -> str:
    return page.locator(".msg.assistant .content").last.inner_text()


# ---------------------------------------------------------------- serving


def test_page_and_assets_served(served):
    status, headers, body = served.get("/", {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert headers["content-security-policy"] == webui.CSP
    html = body.decode()
    # the CSP allows no inline code: every script is a file, no style attribute or element
    assert not re.search(r"<script(?![^>]*\bsrc=)", html) and not re.search(r"\sstyle=|<style", html)
    assert not re.search(r"https?://", html), "the page must work offline: nothing from elsewhere"
    assert served.get("/")[2] == b"Ollama is running"  # ollama clients probe GET / without asking for HTML
    for path, kind in [("/webui/app.js", "text/javascript"), ("/webui/style.css", "text/css")]:
        status, headers, body = served.get(path)
        assert status == 200 and headers["content-type"].startswith(kind) and body
        assert headers["x-content-type-options"] == "nosniff"


def test_page_loads_with_models(page):
    assert page.title().endswith("infer")
    assert page.locator("#model option").all_inner_texts() == [MODEL]
    assert page.locator(".conv-item").count() == 1 and page.locator(".msg").count() == 0
    assert page.evaluate("document.activeElement.id") == "prompt"


# ---------------------------------------------------------------- replies


def test_reply_streams_and_shows_stats(page, tmp_path):
    set_fields(page, temperature=0, max_tokens=40, seed=1)
    # every change of the reply's text, as the page makes it
    page.evaluate("""() => {
        window.lengths = [];
        new MutationObserver(() => {
            const c = document.querySelector('.msg.assistant:last-child .content');
            if (c) window.lengths.push(c.textContent.length);
        }).observe(document.querySelector('#messages'), {subtree: true, childList: true, characterData: true});
    }""")
    send(page, "Count from 1 to 20, separated by commas.")
    page.wait_for_selector("#stop", state="visible")
    wait_done(page)
    lengths = page.evaluate("window.lengths")
    final = len(last_reply(page))
    growing = sorted({n for n in lengths if 0 < n < final})
    assert final > 0 and len(growing) >= 3, f"the reply did not grow while streaming: {lengths}"
    stats = page.locator(".msg.assistant .stats")
    assert 0 < int(stats.get_attribute("data-tokens")) <= 40
    assert int(stats.get_attribute("data-ttft")) > 0 and float(stats.get_attribute("data-tps")) > 0
    assert re.fullmatch(r"\d+ tokens · TTFT \d+ ms · [\d.]+ tok/s", stats.inner_text())
    assert page.locator(".msg.user").inner_text().endswith("Count from 1 to 20, separated by commas.")
    page.screenshot(path=str(tmp_path / "desktop.png"))


def test_escape_stops_the_reply_and_the_server_cancels(page, served):
    set_fields(page, temperature=0, max_tokens=900)
    send(page, "Write a very long story about a dragon who learns to cook.")
    page.wait_for_function("() => document.querySelector('.msg.assistant .content')?.textContent.length > 0")
    assert running(served) == 1
    page.keyboard.press("Escape")
    page.wait_for_selector("#stop", state="hidden", timeout=2000)
    deadline = time.time() + 5
    while running(served) and time.time() < deadline:
        time.sleep(0.05)
    assert running(served) == 0
    assert page.locator(".msg.assistant .stats").inner_text().endswith("stopped")
    assert len(last_reply(page)) > 0  # the partial reply stays
    assert page.is_visible("#send")


def test_settings_go_in_the_request_and_all_survives_a_reload(page):
    set_fields(page, system="You answer in one word.", temperature=0, max_tokens=5, seed=42, top_p=0.9)
    bodies = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
    send(page, "Say hello")
    wait_done(page)
    assert len(bodies) == 1
    body = bodies[0]
    assert body["model"] == MODEL and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["temperature"], body["max_tokens"], body["seed"], body["top_p"]) == (0, 5, 42, 0.9)
    assert "top_k" not in body and "min_p" not in body  # empty fields: the server's defaults
    assert body["messages"] == [{"role": "system", "content": "You answer in one word."},
                                {"role": "user", "content": "Say hello"}]
    assert int(page.locator(".msg.assistant .stats").get_attribute("data-tokens")) <= 5
    reply = last_reply(page)

    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.locator(".conv-item").all_inner_texts() == ["Say hello"]
    assert last_reply(page) == reply and page.locator(".msg.user .content").inner_text() == "Say hello"
    assert page.input_value("#system") == "You answer in one word."
    assert (page.input_value("#temperature"), page.input_value("#max_tokens")) == ("0", "5")

    page.click("#rename")
    page.fill("#ask-input", "Greetings")
    page.press("#ask-input", "Enter")
    expect(page.locator(".conv-item")).to_have_text(["Greetings"])
    with page.expect_download() as download:
        page.click("#export")
    exported = json.loads(open(download.value.path()).read())
    assert exported["title"] == "Greetings" and [m["role"] for m in exported["messages"]] == ["user", "assistant"]
    assert exported["messages"][1]["content"] == reply and exported["messages"][1]["stats"]["tokens"] <= 5

    page.click("#new-chat")
    assert page.locator(".msg").count() == 0 and page.locator(".conv-item").count() == 2
    page.click(".conv-item:has-text('Greetings') button")
    assert last_reply(page) == reply
    page.click("#delete")
    page.click("#ask-ok")
    expect(page.locator(".conv-item")).to_have_text(["New chat"])
    page.reload()
    page.wait_for_selector("#model option", state="attached")
    assert page.locator(".msg").count() == 0 and page.locator(".conv-item").count() == 1


HOSTILE = [
    {"reasoning_content": "Let me think <b>hard</b>."},
    {"content": "# Title\n\nHere: <script>window.pwned=1</script> and "},
    {"content": '<img src=x onerror="window.pwned=1">\n\n'},
    {"content": "```html\n<script>window.pwned=2</script>\n```\n\n"},
    {"content": "[click](javascript:window.pwned=3) [ok](https://example.com/a) **bold** *it* `x<y>`\n\n"},
    {"content": "- one <svg onload=window.pwned=4>\n  - nested\n- two\n\n"},
    {"content": "after\n\n" + "- " * 5000 + "deep\n"},  # nesting no stack could hold renders, as text past some depth
]


def fake_sse(deltas: list[dict]) -> str:
    head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({**head, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 42, "total_tokens": 51}})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_hostile_reply_renders_inert(page):
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=fake_sse(HOSTILE)))
    send(page, "Be evil")
    wait_done(page)
    page.wait_for_timeout(300)  # room for an onerror or onload to fire, were there an element for it
    assert page.evaluate("window.pwned") is None
    msgs = page.locator("#messages")
    assert msgs.locator("script, img, svg, b").count() == 0
    content = page.locator(".msg.assistant .content")
    text = content.inner_text()
    assert "<script>window.pwned=1</script>" in text and '<img src=x onerror="window.pwned=1">' in text
    assert "[click](javascript:window.pwned=3)" in text and "<svg onload=window.pwned=4>" in text
    assert content.locator("h1").inner_text() == "Title"
    assert content.locator("pre code.language-html").inner_text() == "<script>window.pwned=2</script>"
    assert [a.get_attribute("href") for a in content.locator("a").all()] == ["https://example.com/a"]
    assert content.locator("strong").inner_text() == "bold" and content.locator("em").inner_text() == "it"
    assert content.locator("p code").inner_text() == "x<y>"
    assert content.locator(":scope > ul:first-of-type > li").count() == 2 and content.locator(":scope > ul:first-of-type ul > li").inner_text() == "nested"
    assert text.rstrip().endswith("deep") and content.locator("ul").count() < 20
    thinking = page.locator(".msg.assistant details.reasoning")
    thinking.locator("summary").click()  # closed once the answer has begun; a click opens it
    assert thinking.locator(".reasoning-text").inner_text() == "Let me think <b>hard</b>."
    assert page.locator(".msg.assistant .stats").get_attribute("data-tokens") == "42"


# ---------------------------------------------------------------- API key, phone, keyboard


def test_api_key_is_asked_once_then_sent(browser, llm):
    keyed = Served(page_app(llm, ServerConfig(model_id=MODEL, api_key=KEY)))
    ctx = browser.new_context(viewport=DESKTOP)
    try:
        page = ctx.new_page()
        page.goto(keyed.url)
        page.wait_for_selector("#ask-dialog[open]")  # the model list got a 401
        page.fill("#ask-input", KEY)
        page.press("#ask-input", "Enter")
        page.wait_for_selector("#model option", state="attached")
        assert page.evaluate("sessionStorage.getItem('infer.apiKey')") == KEY
        auth = []
        page.on("request", lambda r: auth.append(r.headers.get("authorization")) if "/v1/" in r.url else None)
        set_fields(page, max_tokens=4, temperature=0)
        send(page, "Hi")
        wait_done(page)
        assert auth == [f"Bearer {KEY}"] and page.locator("#ask-dialog[open]").count() == 0
        assert int(page.locator(".msg.assistant .stats").get_attribute("data-tokens")) > 0
    finally:
        ctx.close()
        keyed.stop()


def test_phone_layout_and_keyboard(browser, served, tmp_path):
    ctx = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    try:
        page = ctx.new_page()
        page.goto(served.url)
        page.wait_for_selector("#model option", state="attached")
        assert not page.is_visible("#sidebar") and page.is_visible("#menu")
        page.click("#menu")  # the settings live in the slide-in menu
        page.wait_for_selector("#sidebar", state="visible")
        set_fields(page, max_tokens=24, temperature=0)
        page.keyboard.press("Escape")
        page.wait_for_selector("#sidebar", state="hidden")
        page.fill("#prompt", "first line")
        page.press("#prompt", "Shift+Enter")
        page.keyboard.type("second line")
        assert page.input_value("#prompt") == "first line\nsecond line" and page.locator(".msg").count() == 0
        page.press("#prompt", "Enter")
        wait_done(page)
        assert page.locator(".msg.user .content").inner_text() == "first line\nsecond line"
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]  # no sideways scrolling
        page.screenshot(path=str(tmp_path / "phone.png"))
        page.click("#menu")
        page.wait_for_selector("#sidebar", state="visible")
        assert page.is_visible("#new-chat") and page.locator(".conv-item").count() == 1
        page.screenshot(path=str(tmp_path / "phone-menu.png"), animations="disabled")
        page.keyboard.press("Escape")
        page.wait_for_selector("#sidebar", state="hidden")
    finally:
        ctx.close()
