"""The dashboard in a real browser: Debian's headless Chromium (`make test` installs it),
driven by Playwright for Python, watches agents register, haggle and pay, and finds their
conversations in the viewer; an operator clicks from an agent to its conversation to the
sequence diagram, and the page reconnects by itself when the lobby restarts. Its screenshot is
saved under tests/artifacts/ (the path is printed). Plus the dashboard's files over plain HTTP
and the admin token kept across restarts."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from playwright.async_api import Page, async_playwright, expect
from pydantic import BaseModel
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from agent_sdk import Agent, AgentSDKError, Message, RequestContext, capability
from lobby.admin_endpoint import TOKEN_FILE, choose_token, kept_token
from lobby.dashboard import FILES
from lobby.server import LobbyServer
from protocol.models import MessageType
from tests.test_admin import admin_token, bearer, closed_with, command
from tests.waiting import until
from tests.wsclient import running

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent / "artifacts"


def fetch(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers["Content-Type"], refused.read()


async def get(url: str) -> tuple[int, str, bytes]:
    """GET `url` off the event loop the lobby runs in."""
    return await asyncio.to_thread(fetch, url)


async def test_the_dashboard_files_are_served_from_the_package(lobby: LobbyServer) -> None:
    base = f"http://127.0.0.1:{lobby.port}/dashboard"
    status, content_type, page = await get(base)
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    assert b'<script src="/dashboard/app.js">' in page
    for name, expected in FILES.items():
        status, content_type, body = await get(f"{base}/{name}")
        assert (status, content_type) == (200, expected)
        assert body
    status, _, body = await get(f"{base}/../server.py")
    assert status == 404
    assert b"no such dashboard file" in body


async def test_a_wrong_admin_token_says_where_the_token_is(lobby: LobbyServer) -> None:
    where = str(Path(lobby.settings.data_dir) / TOKEN_FILE)
    with pytest.raises(InvalidStatus) as refused:
        async with connect(f"ws://127.0.0.1:{lobby.port}/admin", additional_headers=bearer("x")):
            pass
    expected = ("auth_failed", f"wrong admin token: see {where}")
    body = orjson.loads(refused.value.response.body)
    assert (body["code"], body["error"]) == expected
    async with connect(f"ws://127.0.0.1:{lobby.port}/admin?auth=message") as ws:
        answer = await command(ws, command="auth", token="not-the-token")
        assert (answer["code"], answer["error"]) == expected
        assert await closed_with(ws) == 1008


async def view(page: Page, key: str) -> None:
    await page.fill("#viewer-key", key)
    await page.click("#viewer-form button")


async def test_the_dashboard_shows_a_haggle_and_a_payment(tmp_path: Path) -> None:
    async with running(tmp_path / "data") as lobby, async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1600})
            await page.goto(f"http://127.0.0.1:{lobby.port}/dashboard")
            await page.fill("#token", "not-the-token")
            await page.click("#login button")
            wrong = page.locator("#login-error")
            await expect(wrong).to_contain_text("wrong admin token: see ")
            await expect(wrong).to_contain_text(str(tmp_path / "data" / TOKEN_FILE))
            await expect(page.locator("#status")).to_have_text("wrong admin token")
            await page.fill("#token", admin_token(tmp_path / "data"))
            await page.click("#login button")
            await expect(page.locator("#status")).to_have_text("connected")

            buyer = Agent("buyer", lobby_url=lobby.url)
            seller = Agent("seller", lobby_url=lobby.url)
            async with buyer, seller:
                await expect(page.locator("#agents")).to_contain_text("seller")
                dialogue = await buyer.cfp("seller", {"goods": {"apples": 3}})
                await until(lambda: seller.dialogue(dialogue.dialogue_id) is not None)
                theirs = seller.dialogue(dialogue.dialogue_id)
                assert theirs is not None
                await theirs.propose({"goods": {"apples": 3}, "price": 4.5})
                assert (await dialogue.next_move(5)).kind == "PROPOSE"
                await expect(page.locator("#dialogues")).to_contain_text(dialogue.dialogue_id)
                await expect(page.locator("#dialogues")).to_contain_text("PROPOSED")
                await dialogue.accept()
                assert (await theirs.next_move(5)).kind == "ACCEPT"
                await theirs.match_accept()
                order = await seller.propose_order(
                    "buyer",
                    [{"id": "a", "name": "apple", "price": "1.50", "quantity": 3}],
                    conversation_id="order-1",
                )
                proposal = Message(
                    "seller",
                    "buyer",
                    MessageType.ORDER_PROPOSAL,
                    {"total_price": order.total_price},
                    message_id=order.message_id,
                )
                receipt = await buyer.pay(proposal)

                transactions = page.locator("#transactions")
                await expect(transactions).to_contain_text("negotiation")
                await expect(transactions).to_contain_text("payment")
                await expect(transactions).to_contain_text(receipt["transaction_id"])
                await expect(page.locator("#agents")).to_contain_text("online")
                await expect(page.locator("#messages")).to_contain_text("PAYMENT_CONFIRMED")

                await view(page, dialogue.dialogue_id)
                moves = page.locator("#sequence g.move")
                await expect(moves).to_have_count(6)
                kinds = [await m.get_attribute("data-type") for m in await moves.all()]
                confirmed = ["TRANSACTION_CONFIRMED"] * 2  # to each party
                assert kinds == ["CFP", "PROPOSE", "ACCEPT", "MATCH_ACCEPT", *confirmed]
                await expect(page.locator("#sequence")).to_contain_text("global_lobby")

                await view(page, "order-1")
                await expect(page.locator("#sequence g.move")).to_have_count(1)
                await expect(page.locator("#sequence")).to_contain_text("ORDER_PROPOSAL")
                paid = [m for m in lobby.observers.rings.recent if m["message_type"] == "PAYMENT"]
                await view(page, paid[0]["conversation_id"])
                await expect(page.locator("#sequence")).to_contain_text("PAYMENT")
                await expect(page.locator("#sequence")).to_contain_text("PAYMENT_CONFIRMED")
            await expect(page.locator("#agents")).to_contain_text("offline")

            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            await page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            assert shot.stat().st_size > 0
        finally:
            await browser.close()


class Text(BaseModel):
    text: str


class Echo(Agent):
    agent_id = "echo"

    @capability("echo", description="Returns the text it is given.")
    async def echo(self, request: Text, ctx: RequestContext) -> Text:
        return request


def test_the_admin_token_is_kept_across_starts_unless_its_file_goes(tmp_path: Path) -> None:
    assert kept_token(None) is None
    assert kept_token(tmp_path) is None  # no file yet: the lobby makes one
    (tmp_path / TOKEN_FILE).write_text("short\n")
    assert kept_token(tmp_path) is None  # not a token: replaced
    (tmp_path / TOKEN_FILE).write_text("a-token-of-enough-length\n")
    assert kept_token(tmp_path) == "a-token-of-enough-length"
    file = str(tmp_path / TOKEN_FILE)
    assert choose_token(None, tmp_path) == ("a-token-of-enough-length", file)
    given, where = choose_token("given-on-the-command-line", tmp_path)
    assert (given, "--admin-token" in where) == ("given-on-the-command-line", True)
    made, where = choose_token(None, None)  # the memory store: a new one each start
    assert len(made) >= 16
    assert made != choose_token(None, None)[0]
    assert "stderr" in where


async def test_the_dashboard_clicks_through_and_reconnects_after_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1600})
            async with running(data, trace_ids=True) as lobby:
                port, token = lobby.port, admin_token(data)
                await page.goto(f"http://127.0.0.1:{port}/dashboard")
                icon = page.locator("link[rel=icon]")
                assert (await icon.get_attribute("href") or "").startswith("data:image/svg+xml")
                await page.fill("#token", token)
                await page.click("#login button")
                await expect(page.locator("#status")).to_have_text("connected")
                async with Echo(lobby_url=lobby.url), Agent("caller", lobby_url=lobby.url) as me:
                    await me.request("echo", "echo", {"text": "hi"}, output_type=Text, timeout=5)
                    with pytest.raises(AgentSDKError):
                        await me.request("echo", "nosuch", {}, timeout=5)
                    messages = page.locator("#messages")
                    await expect(messages).to_contain_text("RESPONSE")

                    # ACKs are kept out of sight until asked for.
                    acks = page.locator("#messages tr[data-type=ACK]")
                    await expect(acks.first).to_be_attached()
                    await expect(acks.first).to_be_hidden()
                    await page.check("#show-bookkeeping")
                    await expect(acks.first).to_be_visible()

                    # A refusal's reason is whole in its title, however long.
                    refused = await messages.locator("td.refused").first.get_attribute("title")
                    seen = list(lobby.observers.rings.recent)
                    whole = next(m["refused"] for m in seen if m.get("refused"))
                    assert refused == f"{whole['code']}: {whole['error']}"

                    # agent -> its conversations -> the sequence diagram
                    await page.locator("#agents a.agent", has_text="caller").click()
                    answered = next(m for m in seen if m["message_type"] == "RESPONSE")
                    conversation = page.locator("#agent-conversations a").get_by_text(
                        answered["conversation_id"], exact=True
                    )
                    await conversation.click()
                    moves = page.locator("#sequence g.move")
                    await expect(moves).to_have_count(2)
                    kinds = [await m.get_attribute("data-type") for m in await moves.all()]
                    assert kinds == ["REQUEST", "RESPONSE"]
                    await expect(page.locator("#sequence")).to_contain_text("echo")
                    # The trace the lobby started for the REQUEST holds both messages too.
                    trace = page.locator("#viewer p.traces a.trace")
                    await expect(trace).to_have_text(answered["trace_id"])
                    await trace.click()
                    await expect(page.locator("#viewer-key")).to_have_value(answered["trace_id"])
                    await expect(page.locator("#viewer p.traces")).to_have_count(0)  # redrawn
                    await expect(moves).to_have_count(2)
                    # and back from a party of the diagram to that agent's conversations
                    await page.locator("#sequence text.party", has_text="echo").click()
                    await expect(page.locator("#viewer h3")).to_have_text("Conversations of echo")
                    listed = page.locator("#agent-conversations")
                    await expect(listed).to_contain_text(answered["conversation_id"])
            status = page.locator("#status")
            await expect(status).to_contain_text("reconnecting in")

            async with running(data, port=port) as again:
                assert admin_token(data) == token
                await expect(status).to_have_text("connected", timeout=15_000)
                async with (
                    Echo("echo-2", lobby_url=again.url),
                    Agent("caller-2", lobby_url=again.url) as me,
                ):
                    await me.request(
                        "echo-2", "echo", {"text": "again"}, output_type=Text, timeout=5
                    )
                    await expect(page.locator("#messages")).to_contain_text("caller-2")
                    await expect(page.locator("#agents")).to_contain_text("echo-2")
        finally:
            await browser.close()
