"""The dashboard in a real browser: Debian's headless Chromium (`make test` installs it),
driven by Playwright for Python, watches agents register, haggle and pay, and finds their
conversations in the viewer. Its screenshot is saved under tests/artifacts/ (the path is
printed). Plus the dashboard's files over plain HTTP."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

from playwright.async_api import Page, async_playwright, expect

from agent_sdk import Agent, Message
from lobby.dashboard import FILES
from lobby.server import LobbyServer
from protocol.models import MessageType
from tests.test_admin import admin_token
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
            await expect(page.locator("#login-error")).to_contain_text("first message must be")
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
