"""`sitsprobe top`'s two front ends: the live Textual app, and `--once`,
one plain frame for scripts."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from . import render
from .model import SORTS, View
from .source import ScrapeError, Source


class TopApp(App):
    """Scrapes `source` every `interval` seconds and shows the view. A failed
    scrape shows one line and the last good view, and the next tick retries."""

    TITLE = "sitsprobe top"
    ENABLE_COMMAND_PALETTE = False
    CSS = "#status { height: auto; } #body { height: auto; }"
    BINDINGS = [Binding("q", "quit", "Quit"), Binding("p", "pause", "Pause/resume"),
                Binding("s", "sort", "Sort HTTP"), Binding("question_mark", "help", "Help")]

    def __init__(self, source: Source, interval: float = 1.0):
        super().__init__()
        self.source, self.interval = source, interval
        self.view: View | None = None
        self.error: str | None = None
        self.paused = False
        self.sort = SORTS[0]
        self.helping = False
        self._one_at_a_time = asyncio.Lock()  # a Source diffs against its previous scrape

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        with VerticalScroll():
            yield Static(id="body")
        yield Footer()

    def on_mount(self) -> None:
        self._draw()
        self._poll()

    @work(exclusive=True)
    async def _poll(self) -> None:
        while True:
            await self.scrape()
            await asyncio.sleep(self.interval)

    async def scrape(self) -> None:
        """One scrape (in a thread: the agent may be slow), then redraw."""
        try:
            async with self._one_at_a_time:
                view = await asyncio.to_thread(self.source.view)
        except ScrapeError as e:
            self.error = str(e)
        else:
            self.error = None
            if view is not None and not self.paused:
                self.view = view
        self._draw()

    def action_help(self) -> None:
        self.helping = not self.helping
        self._draw()

    def on_key(self, event) -> None:
        """Any other key closes the help screen."""
        if self.helping and event.key not in ("question_mark", "q"):
            self.helping = False
            self._draw()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._draw()

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._draw()

    def _draw(self) -> None:
        status = render.header(self.source.url, self.view, paused=self.paused, error=self.error)
        self.query_one("#status", Static).update(render.text(status))
        lines = render.HELP if self.helping else render.body(self.view, self.sort)
        self.query_one("#body", Static).update(render.text(lines))


def once(source: Source, interval: float, sleep: Callable[[float], None] = time.sleep) -> str:
    """One plain frame: two scrapes `interval` apart. Raises ScrapeError."""
    source.view()
    sleep(interval)
    view = source.view()
    return render.plain(render.header(source.url, view) + render.body(view, SORTS[0]))
